"""Runtime settings, read once per process from ORTSERVE_* environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ortserve.core.durations import GO_DURATION

# The most new tokens MAX_NEW_TOKENS (and so any request) may name: 128k.
MAX_TOKENS_BOUND = 131072

DEFAULT_PROVIDER_ORDER = ("cuda", "coreml", "qnn", "openvino", "dml", "webgpu", "cpu")
# Without MAX_NEW_TOKENS, the new tokens of a request that gives no limit where its API
# means "as many as fit" (OpenAI's chat, Ollama's num_predict -1): not the whole context,
# because og reserves a sequence's KV cache for prompt + limit at its start (the static
# buffer of past_present_share_buffer), a batch needs its longest prompt + its largest
# limit to fit the context, and the prompt cache keeps sequences of up to 4,096 tokens.
# A request that asks for more gets it, up to the context.
DEFAULT_NEW_TOKENS = 512

# What keeps every ortserve process private: onnxruntime (1.2x, Linux included since its
# "POSIX telemetry") sends usage events to a Microsoft collector unless
# ORT_DISABLE_TELEMETRY=1 is in the environment when its library loads
# (`og.disable_telemetry_events()` and ORT_TELEMETRY_DISABLED do not stop it);
# huggingface_hub reports downloads unless HF_HUB_DISABLE_TELEMETRY=1. Forced, not
# defaulted: a private endpoint has no opt-in. Generated artefacts set the same.
PRIVACY_ENVIRONMENT = {"ORT_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


# The environment variables the engine process starts with, by name or prefix: how to find
# Python and its packages, the locale and time zone, temporary files, and the knobs of
# the native libraries it runs (onnxruntime, OpenMP, glibc's malloc). Nothing else: API
# keys, cloud credentials and every ORTSERVE_* setting stay in the parent.
_ENGINE_NAMES = frozenset(
    {"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "VIRTUAL_ENV"}
)
_ENGINE_PREFIXES = ("LC_", "PYTHON", "ORT_", "OMP_", "KMP_", "MALLOC_", "GLIBC_TUNABLES")


def engine_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine process's environment (core.engine_process): `environ`'s (this
    process's) allowed names only (`_ENGINE_NAMES`, `_ENGINE_PREFIXES`), and the privacy
    switches."""
    source = os.environ if environ is None else environ
    kept = {
        name: value
        for name, value in source.items()
        if name in _ENGINE_NAMES or name.startswith(_ENGINE_PREFIXES)
    }
    return {**kept, **PRIVACY_ENVIRONMENT}


def disable_telemetry() -> None:
    """Set `PRIVACY_ENVIRONMENT` in this process (and so in every child it starts); call
    it before onnxruntime or huggingface_hub is imported (core.og_local does, at import)."""
    os.environ.update(PRIVACY_ENVIRONMENT)


class EngineSettings(BaseSettings):
    """Settings of the engine; one object per process, passed down explicitly.

    Attributes:
        model_dir: The baked model folder (with manifest.json).
        providers: `auto` or a comma-separated preference list such as `cuda,cpu`.
        threads: Intra-op threads (unset: the baked value, capped by usable cores).
        spin_wait: onnxruntime's intra-op threads spin between tasks rather than sleep
            (its default): faster where the process has its cores to itself (135M shape,
            2 threads on the AMD VM: 94-102 tok/s decode against 74-89); off where other
            busy processes share them (the same with 1-2 busy processes beside it: 54-62
            tok/s against 32-45), as the test suite's workers do.
        max_concurrency: Generations that run at once (a batch is one generation).
        max_queue: Requests that may wait for a slot; one more gets `Busy` at once.
        queue_timeout_s: How long a request may wait for a slot before `Busy`.
        max_new_tokens: Upper bound on new tokens per request, a clear 400 above it (0:
            the model's context: a request may ask for any number, and gets what fits
            after its prompt).
        max_prompt_tokens: Longer prompts are refused (0: only the context window limits).
        verify_sha256: Hash every model file at load (slower; sizes are always checked).
        max_batch: Up to this many concurrent requests decode as one batch (1: no
            batching): greedy ones and sampled ones without a seed and with the same
            sampling options. A seeded or guided request runs alone and counts as a batch.
        request_timeout_s: A generation running longer is stopped with a timeout error.
        prompt_cache_slots: KV caches of recent requests kept for a next request
            that begins the same way (0: no prompt cache); each holds up to 4,096 tokens
            (the context, if shorter) of fp32 KV cache.
        warmup: Run one short generation after the load, before the model is ready (the
            first inference pays one-time costs; a user's first request should not).
        batch_window_ms: How long a batch waits for companions after its first request
            (a lone request starts this much later).
        prefill_chunk_tokens: The most prompt tokens one forward pass takes. A longer
            prompt goes into the model in parts of this size: between them the process
            answers health checks, serves other requests and handles signals, and the
            request's cancellation, timeout and the drain are checked; a part's logits
            (part x vocabulary x 4 bytes) are all that is held, never the whole prompt's.
            onnxruntime-genai 0.18 takes a beam search's prompts in one pass, which may be
            up to 4 parts (beams x prompt; a longer one is refused), and a batch's in one
            pass too (see batch_prefill_tokens).
        batch_prefill_tokens: The most prompt tokens (rows x longest prompt, padding
            included) a batch takes in its one pass (onnxruntime-genai 0.18 cannot append
            a batch in parts). Up to 4 prefill parts a batch always forms; above that, up
            to this bound, only when its padding costs less prefill than the decode steps
            batching saves (core.service). The pass holds the engine that long (0.5B: ~7
            s for 2,048 tokens on 2 cores; 1.5B: ~14 s) and its activations (~+200 MiB at
            0.5B, +420 MiB at 1.5B for 2,048: core.sizing counts them); longer prompts
            run alone, in parts, side by side. Only with engine_process: og in the
            serving process would hold its GIL (health checks, every stream) through
            the pass, so there batches stay within 4 parts.
        chat_plain_control_tokens: Control-token strings in chat messages (such as
            `<|im_start|>`) are tokenized as plain text, so a user cannot forge a turn
            (transformers' `sanitize_control_tokens`); off: they become control tokens, as
            in transformers and vLLM by default.
        engine_process: Run onnxruntime-genai in a process of its own (core.engine_process):
            health checks never wait for a prefill, and a fault there (a signal, the
            memory ceiling) costs only the requests in flight, then it restarts. On by
            default for the edge daemon and the Cloud Run image; off for one-request
            platforms (Lambda, Cloud Functions) and the CLI, where cold start comes first.
        engine_memory_mb: The engine process's ceiling of data memory (RLIMIT_DATA, MiB;
            0: none): an allocation past it fails there and ends only that process.
        speculative: `auto`: decode a lone request speculatively where the model allows
            it (a model baked with the logits of every position, `ortserve bake
            --speculative`): drafts looked up in the prompt and the text so far (prompt
            lookup, n-grams) or made by the bake's draft model, verified several at a time,
            paused while they are seldom accepted; `off`: one token a forward pass.
        speculative_ngram: Prompt lookup matches the last this-many tokens.
        speculative_draft_tokens: The most draft tokens verified in one forward pass.
        content_filter: A TOML file of content rules on prompts and outputs (deny
            patterns and words, size and character rules, redaction of e-mail addresses,
            phone and card numbers; `core.content_filter`). None: no filter.
    """

    # defer_build: each class builds its validator when first used (a process uses one).
    model_config = SettingsConfigDict(env_prefix="ORTSERVE_", extra="ignore", defer_build=True)

    model_dir: Path = Path("models/default/model")
    providers: str = "auto"
    threads: int | None = Field(default=None, ge=1, le=256)
    spin_wait: bool = True
    max_concurrency: int = Field(default=1, ge=1, le=64)
    max_queue: int = Field(default=16, ge=0, le=10000)
    queue_timeout_s: float = Field(default=30.0, ge=0, le=3600)
    max_new_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS_BOUND)
    max_prompt_tokens: int = Field(default=0, ge=0)
    verify_sha256: bool = False
    max_batch: int = Field(default=4, ge=1, le=64)
    batch_window_ms: float = Field(default=5.0, ge=0, le=1000)
    request_timeout_s: float = Field(default=300.0, gt=0, le=86400)
    warmup: bool = True
    prompt_cache_slots: int = Field(default=1, ge=0, le=64)
    prefill_chunk_tokens: int = Field(default=64, ge=16, le=16384)
    batch_prefill_tokens: int = Field(default=2048, ge=0, le=65536)
    chat_plain_control_tokens: bool = False
    content_filter: Path | None = None
    speculative: Literal["auto", "off"] = "auto"
    speculative_ngram: int = Field(default=5, ge=2, le=8)
    speculative_draft_tokens: int = Field(default=6, ge=1, le=16)
    engine_process: bool = False
    engine_memory_mb: int = Field(default=0, ge=0)

    def provider_order(self) -> list[str]:
        """The execution providers to try, best first."""
        if self.providers.strip().lower() == "auto":
            return list(DEFAULT_PROVIDER_ORDER)
        names = [p.strip().lower() for p in self.providers.split(",") if p.strip()]
        unknown = [n for n in names if n not in DEFAULT_PROVIDER_ORDER]
        if unknown or not names:
            raise ValueError(
                f"ORTSERVE_PROVIDERS={self.providers!r}: use 'auto' or a comma list of "
                f"{', '.join(DEFAULT_PROVIDER_ORDER)}"
            )
        return names


def default_cache_home() -> Path:
    """`$XDG_CACHE_HOME/ortserve` (the XDG base-directory rule, as pip and huggingface_hub
    follow it): the model store's home and the bake's source cache."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ortserve"


class StoreSettings(BaseSettings):
    """Where `ortserve run` keeps the models it bakes (the local model store).

    Attributes:
        home: ORTSERVE_HOME (default `$XDG_CACHE_HOME/ortserve`); models live in
            `home/models/NAME/model`.
    """

    model_config = SettingsConfigDict(env_prefix="ORTSERVE_", extra="ignore", defer_build=True)

    home: Path = Field(default_factory=default_cache_home)

    @property
    def models(self) -> Path:
        """The store's folder of models."""
        return self.home / "models"


#: ORTSERVE_MODEL_KEEP_ALIVE: a Go duration (core.durations) or a number of seconds.
GO_DURATION_OR_SECONDS = rf"{GO_DURATION}|^-?[0-9]+(\.[0-9]+)?$"


class ServerSettings(EngineSettings):
    """Settings of a process that serves the HTTP API (every target), engine's included.

    Attributes:
        host: Address the edge daemon binds to.
        port: Port the edge daemon listens on.
        api_keys: Accepted API keys (comma-separated in ORTSERVE_API_KEYS); none: no auth.
            Each key is a tenant (core.tenants).
        admin_keys: Keys that may also change what the server holds (load and unload
            adapters, reload), comma-separated in ORTSERVE_ADMIN_KEYS. An admin key is
            accepted wherever an API key is, as a tenant of its own.
        max_body_bytes: Larger request bodies get 413.
        drain_timeout_s: On shutdown, how long in-flight requests may take to finish.
        metrics_public: /metrics answers without an API key (for a scraper) even when
            keys are set.
        cors_origins: Browser origins allowed to call the API (comma-separated in
            ORTSERVE_CORS_ORIGINS; `*` for any); none: no CORS headers (browsers refuse).
        served_name: The model's id in the API (/v1/models, `model` in answers); None:
            the manifest's model name. `ortserve serve NAME` and `ortserve run NAME` set it
            to the name used (a stored model's folder: its short name).
        aliases: More names the API serves the model under (comma-separated in
            ORTSERVE_ALIASES; `serve --alias`, as vLLM's `--served-model-name`): the first
            is then the model's id, the others and `served_name` are listed after it.
        models: More models served beside the model: baked folders, each `FOLDER` or
            `NAME=FOLDER` (the name requests use; comma-separated in ORTSERVE_MODELS;
            `ortserve serve MODEL MORE...` sets it). Each loads on its first request; a
            request's `model` picks one (none: the model).
        model_keep_alive: With several models, how long one stays loaded after its last
            request (Ollama's: seconds or a Go duration such as `5m`; negative: for
            good; a request's `keep_alive` wins). With one model it stays.
        memory_budget_mb: With several models, the memory the loaded ones may take in
            all, by the sizing formula (core.sizing); a model that does not fit unloads
            the least recently used idle ones, or its request gets a 503. None: 90% of
            the cgroup's limit, else of the machine's memory.
    """

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    admin_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    max_body_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30)
    drain_timeout_s: float = Field(default=30.0, ge=0, le=3600)
    metrics_public: bool = False
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    served_name: str | None = Field(default=None, min_length=1)
    aliases: Annotated[list[str], NoDecode] = Field(default_factory=list)
    models: Annotated[list[str], NoDecode] = Field(default_factory=list, max_length=16)
    model_keep_alive: str = Field(default="5m", pattern=GO_DURATION_OR_SECONDS)
    memory_budget_mb: int | None = Field(default=None, ge=64)

    @field_validator("aliases", "models", mode="before")
    @classmethod
    def _split_aliases(cls, value: object) -> object:
        names = value.split(",") if isinstance(value, str) else value
        if isinstance(names, list):
            return [str(a).strip() for a in names if str(a).strip()]
        return value

    def served_names(self, model_name: str) -> list[str]:
        """The names the API serves the model under, its id first (`model_name`: the
        manifest's, where nothing else names it)."""
        return list(dict.fromkeys([*self.aliases, self.served_name or model_name]))

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return [o.strip().rstrip("/") for o in value.split(",") if o.strip()]
        return value

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str):
            keys = [k.strip() for k in value.split(",") if k.strip()]
            if value.strip() and not keys:
                # " , " would otherwise turn auth off without a word.
                name = f"ORTSERVE_{(info.field_name or 'api_keys').upper()}"
                raise ValueError(f"{name} holds no key: unset it, or give keys")
            return keys
        return value
