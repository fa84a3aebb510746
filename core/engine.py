"""The engine: it loads a baked model folder (manifest checked) where og runs (this
process: core.og_local, which probes the execution providers in the operator's order by
really building the model with each; or the engine process: core.engine_process),
tokenizes (core.text), and decodes: one sequence as an iterator of token ids, or one
batch of sequences. It holds no request policy (admission, batching rule, token budget,
stop strings, timeouts: those are core.service's). og's native errors are translated to
`core.errors` here and nowhere else.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.core.cpu import usable_cpus
from ortserve.core.errors import (
    ConflictError,
    GenerationError,
    InvalidRequestError,
    ModelLoadError,
    ModelNotFoundError,
    ModelUnavailableError,
    OrtServeError,
    first_line,
)
from ortserve.core.generation import (
    HOUSE_SAMPLING,
    Cached,
    DecodeEvent,
    Decoding,
    EffectiveSampling,
    Finish,
    GenerationRequest,
    Guidance,
    SamplingOptions,
    Token,
)
from ortserve.core.manifest import (
    Manifest,
    manifest_digest,
    verify_folder,
)
from ortserve.core.memory import return_freed_memory
from ortserve.core.prefill import KEPT_LOGITS_TOKENS, prefill_parts
from ortserve.core.prompt_cache import MIN_APPENDED, SLOT_TOKENS, PromptCache
from ortserve.core.runtime import (
    DONE,
    EOS,
    NOT_INSTALLED,
    NOT_SUPPORTED,
    Model,
    OgGenerator,
    genai_config,
    kv_bytes_per_token,
)
from ortserve.core.settings import EngineSettings
from ortserve.core.text import TextCodec

__all__ = ["EffectiveSampling", "Engine", "ProbeReport", "SamplingOptions"]


@dataclass(frozen=True)
class ProbeReport:
    """What the execution-provider probe found at load.

    Attributes:
        provider: The chosen execution provider.
        skipped: For every provider tried before it (or ruled out), why it was skipped.
        load_seconds: Wall time of the whole load, probe included.
        threads: intra-op threads the model runs with.
    """

    provider: str
    skipped: dict[str, str]
    load_seconds: float
    threads: int

    def not_installed(self) -> list[str]:
        """The skipped providers this onnxruntime-genai build has no library for."""
        return [name for name, why in self.skipped.items() if why in (NOT_INSTALLED, NOT_SUPPORTED)]

    def failed(self) -> dict[str, str]:
        """The skipped providers that are there but could not load the model, and why."""
        missing = self.not_installed()
        return {name: why for name, why in self.skipped.items() if name not in missing}


_SEED_RANGE = 2**31
# The pause between prefill parts (~1.5% of a 64-token part here).
_BETWEEN_PARTS_S = 0.002


def _tag(input_ids: list[int], guidance: Guidance | None = None, tenant: str = "") -> str:
    """A short id of what one tenant's request gives og (its prompt and guidance), the
    same alone or in a batch: the engine process counts the crashes each one was in, so a
    request refused after faults is refused to its own tenant only (another tenant
    sending the same prompt cannot get it refused for everyone)."""
    digest = hashlib.sha256(f"{tenant}\0".encode())
    digest.update(np.asarray(input_ids, dtype=np.int64).tobytes())
    if guidance is not None:
        digest.update(f"{guidance.kind}\0{guidance.data}".encode())
    return digest.hexdigest()[:16]


def _token_ids(value: Any) -> list[int]:
    """genai_config's eos/pad id: an int or a list of them."""
    if isinstance(value, list):
        return [int(v) for v in value]
    return [] if value is None else [int(value)]


def _threads(genai_config: dict[str, Any], settings: EngineSettings) -> int:
    """Settings override; else the baked value capped by the cores this process may use."""
    if settings.threads is not None:
        return settings.threads
    usable = usable_cpus()
    options = genai_config["model"].get("decoder", {}).get("session_options", {})
    baked = int(options.get("intra_op_num_threads", 0) or 0)
    return min(baked, usable) if baked > 0 else usable


def _speculation(
    model: Any, model_config: dict[str, Any], settings: EngineSettings
) -> tuple[dict[str, Any] | None, str]:
    """og's speculative options for this model (None: none) and, in words, what they are
    or why there are none.

    A model with a draft model (genai_config's `model.draft`, `ortserve bake --draft`)
    drafts with it; any other drafts by prompt lookup (n-grams of the prompt and the text
    so far). og 0.18 verifies drafts only on a graph that gives the logits of every
    position (not `prune_lm_head`, a CPU target's default): tried here on a generator
    (og refuses at once, in ms), so that a model from any source is judged the same way.
    `cooldown`: og stops drafting for a while after rounds it rejected, so that text that
    repeats nothing (open chat) is not slowed by drafts that fail.

    Raises:
        ModelUnavailableError: A model with a draft model cannot decode without drafting
            (og 0.18 drafts whenever it has one): `ORTSERVE_SPECULATIVE=off` cannot hold,
            and a draft og refuses would fail every generation.
    """
    draft = bool(model_config.get("draft"))
    if settings.speculative == "off":
        if draft:
            raise ModelUnavailableError(
                "ORTSERVE_SPECULATIVE=off: this model has a draft model (ortserve bake "
                "--draft), and onnxruntime-genai 0.18 drafts with it whenever it decodes; "
                "serve a bake without --draft to decode without drafts"
            )
        return None, "off (ORTSERVE_SPECULATIVE=off)"
    options: dict[str, Any] = {
        "max_draft_tokens": settings.speculative_draft_tokens,
        "cooldown": True,
    }
    if draft:
        kind = "draft model"
    else:
        options["ngram_size"] = settings.speculative_ngram
        kind = f"prompt lookup ({settings.speculative_ngram}-grams)"
    try:
        model.generator({"max_length": 8}, None, (), speculative=options)
    except RuntimeError as exc:
        if draft:
            raise ModelUnavailableError(
                f"its draft model cannot draft for it: {first_line(exc)}"
            ) from exc
        return None, f"off: {first_line(exc)}"
    return options, f"{kind}, up to {settings.speculative_draft_tokens} drafts a pass"


def neutral(adapter: str | None) -> EffectiveSampling:
    """The og search options of a generator whose tokens the engine picks (`OgGenerator.pick`):
    greedy with no penalty, so og's search takes the token it is handed as it is."""
    return EffectiveSampling(0.0, 1.0, 0, 1.0, adapter)


def _adapter_of(key: object) -> str | None:
    """The adapter of a prompt cache key (`Engine.cache_key`: its EffectiveSampling first)."""
    sampling = key[0] if isinstance(key, tuple) and key else None
    return sampling.adapter if isinstance(sampling, EffectiveSampling) else None


def _token_ids_of(decoding: Decoding) -> Generator[int, None, None]:
    """The new token ids of `decoding` (closed at the end, or when this is closed)."""
    try:
        for step in decoding:
            if isinstance(step, Token):
                yield step.id
    finally:
        decoding.close()


class Engine:
    """One loaded model, shared by all requests of the process.

    Attributes:
        manifest: The baked folder's manifest.
        digest: sha256 of the manifest: one id for the exact model.
        probe: The execution-provider probe's report.
        text: Tokenizer, detokenizer and chat template (exactly as transformers).
        settings: The settings it was loaded with.
        context_length: Prompt plus new tokens may not exceed it (0: unknown).
        vocab_size: The model's vocabulary size (a larger top_k keeps every token).
        eos_ids: Token ids that end a sequence.
        pad_id: The id a batch pads shorter prompts with.
        sampling_defaults: What the sampling fields a request leaves out become: the
            manifest's (the model's own), else the house profile.
        speculation: og's speculative options for a lone request (None: it decodes one
            token a forward pass), and `speculation_note` says which, or why not.
        adapters: The LoRA adapters baked beside the model, by name (`MODEL:NAME`).
    """

    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        model: Model,
        probe: ProbeReport,
        genai_config: dict[str, Any],
        settings: EngineSettings,
    ) -> None:
        self.manifest = manifest
        self.digest = manifest_digest(folder)
        self.probe = probe
        self.settings = settings
        self._model = model
        # Text goes through HF tokenizers (core.text), exactly as transformers makes it;
        # og generates, and stops at genai_config's EOS ids.
        self.text = TextCodec(folder)
        model_config = genai_config["model"]
        self.eos_ids = frozenset(_token_ids(model_config.get("eos_token_id")))
        self.pad_id = (_token_ids(model_config.get("pad_token_id")) or [*self.eos_ids, 0])[0]
        self.context_length = int(model_config.get("context_length", 0) or 0)
        self.vocab_size = int(model_config.get("vocab_size", 0) or 0)
        self.sampling_defaults = manifest.sampling or HOUSE_SAMPLING
        room = min(self.context_length or SLOT_TOKENS, SLOT_TOKENS)
        self.prompt_cache = (
            PromptCache(settings.prompt_cache_slots, room)
            if (settings.prompt_cache_slots > 0)
            else None
        )
        try:  # 0 where genai_config does not say
            per_token = kv_bytes_per_token(model_config, manifest.kv_cache_element_bytes)
        except (KeyError, TypeError, ValueError):
            per_token = 0
        self.kv_bytes_per_token = per_token
        if self.prompt_cache is not None:  # its generators went with a faulted engine
            model.on_restart(self.prompt_cache.clear)
        # og 0.18 drafts with a draft model whenever it has one: such a model cannot batch,
        # run a beam search or decode a request without drafts.
        self.draft_model = bool(model_config.get("draft"))
        self.adapters = {adapter.name: adapter for adapter in manifest.adapters}
        try:
            self.speculation, self.speculation_note = _speculation(model, model_config, settings)
        except OrtServeError:
            model.close()
            raise

    @property
    def model(self) -> Model:
        """Where og runs: this process, or the engine process (its state, its faults)."""
        return self._model

    @property
    def model_name(self) -> str:
        """The model's public name (the manifest says when its weights are random)."""
        return self.manifest.model_name

    @classmethod
    def load(cls, settings: EngineSettings) -> Engine:
        """Verify, probe and load the model folder named by `settings.model_dir`.

        Raises:
            ModelIntegrityError: The folder is missing, incomplete or altered.
            ModelLoadError: It holds an embedding model (core.embedding runs those).
            ProviderUnavailableError: No allowed execution provider could load it.
        """
        start = time.perf_counter()
        return_freed_memory()  # before the model's buffers exist (core.memory)
        folder = settings.model_dir
        manifest = verify_folder(folder, full_hash=settings.verify_sha256)
        if manifest.kind == "embedding":
            raise ModelLoadError(
                f"{folder} holds an embedding model ({manifest.model_name}): it embeds text "
                "(core.embedding), it does not generate"
            )
        config = genai_config(folder)
        threads = _threads(config, settings)
        model: Model
        if settings.engine_process:
            from ortserve.core.engine_process import EngineProcess

            model = process = EngineProcess.start(folder, settings, threads)
            provider, skipped = process.provider, process.skipped
        else:
            # og in this process: the one import of it (a daemon with an engine process
            # never loads og in its own: core.og_local, tests/functional/test_engine_process.py)
            from ortserve.core.og_local import LocalModel, probe_providers

            og_model, provider, skipped = probe_providers(folder, settings, threads)
            model = LocalModel(og_model, folder)
        probe = ProbeReport(provider, skipped, time.perf_counter() - start, threads)
        return cls(folder, manifest, model, probe, config, settings)

    def close(self) -> None:
        """Free the model now (an engine process ends); the engine serves no more."""
        if self.prompt_cache is not None:
            self.prompt_cache.clear()
        self._model.close()

    # -- text ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of a raw prompt, as transformers' `tokenizer(text)` gives them."""
        return self.text.encode(text)

    def detokenize(self, token_ids: Iterable[int]) -> Iterator[str]:
        """Text pieces of a token stream, one per token; a piece is empty while a
        character's bytes are incomplete and for special tokens."""
        return self.text.detokenize(token_ids)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None
    ) -> str:
        """The prompt for chat `messages`, with the assistant's turn opened.

        Raises:
            InvalidRequestError: The model has no chat template, or it rejects the messages.
        """
        return self.text.render_chat(messages, template_kwargs)

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """The prompt's token ids: a raw prompt as `tokenizer(prompt)`, chat messages through
        the model's template (control tokens in them as the settings say).

        Raises:
            InvalidRequestError: No chat template, the template rejects the messages, or
                text that cannot be tokenized.
        """
        if request.prompt is not None:
            return self.encode(request.prompt)
        return self.text.encode_chat(
            request.messages or [],
            request.template_kwargs,
            plain_control_tokens=self.settings.chat_plain_control_tokens,
            tools=request.tools,
        )

    def logits(
        self, input_ids: list[int], adapter: str | None = None
    ) -> np.ndarray[Any, np.dtype[np.float32]]:
        """Next-token logits at every position of `input_ids` (with a LoRA `adapter`).

        One forward pass; a model baked with `prune_lm_head` computes the last
        position's logits only, so it is fed one token at a time instead (slower, same
        result). For scoring (the bake's quality gate, the quality benchmark): it
        bypasses admission and batching, so a serving process must not call it.

        Returns:
            A float32 array of shape (len(input_ids), vocabulary size).

        Raises:
            InvalidRequestError: `input_ids` is empty or longer than the context.
        """
        if not input_ids or (self.context_length and len(input_ids) >= self.context_length):
            raise InvalidRequestError(f"cannot score {len(input_ids)} tokens with this model")
        search: dict[str, Any] = {"max_length": len(input_ids) + 1}
        steps = self._model.generator(search, None, (), adapter=adapter)
        steps.append(input_ids)
        logits = steps.last_logits()
        if logits.shape[0] == len(input_ids):
            return logits
        rows = [logits[-1]]
        steps.rewind(0)
        for token in input_ids[:-1]:
            steps.append([token])
            rows.insert(-1, steps.last_logits()[-1])
        return np.stack(rows)

    # -- adapters -----------------------------------------------------------------------

    def check_adapter(self, name: str) -> None:
        """Refuse an adapter the model was not baked with.

        Raises:
            ModelNotFoundError: It was not.
        """
        if name not in self.adapters:
            known = ", ".join(sorted(self.adapters)) or "none"
            raise ModelNotFoundError(
                f"no adapter {name!r}: this model's adapters are {known} (ortserve bake --adapter)"
            )

    def load_adapter(self, name: str) -> bool:
        """Load a baked adapter now (requests load it on their first use anyway); True:
        it was not loaded.

        Raises:
            ModelNotFoundError: No such adapter.
            GenerationError: og cannot load it.
        """
        self.check_adapter(name)
        try:
            return self._model.load_adapter(name)
        except RuntimeError as exc:
            raise GenerationError(f"cannot load adapter {name!r}: {first_line(exc)}") from exc

    def unload_adapter(self, name: str) -> bool:
        """Free a loaded adapter's memory (the model stays; a later request loads it
        again); True: it was loaded. The prompt cache's generators with it go first.

        Raises:
            ModelNotFoundError: No such adapter.
            ConflictError: A request is decoding with it.
        """
        self.check_adapter(name)
        if self.prompt_cache is not None:
            self.prompt_cache.evict(lambda key: _adapter_of(key) == name)
        try:
            return self._model.unload_adapter(name)
        except RuntimeError as exc:
            raise ConflictError(
                f"adapter {name!r} is in use by a request: unload it when it is done "
                f"({first_line(exc)})"
            ) from exc

    def loaded_adapters(self) -> list[str]:
        """The adapters in memory, by name (none while the engine process restarts)."""
        try:
            return self._model.loaded_adapters()
        except (RuntimeError, OrtServeError):
            return []

    # -- decoding -----------------------------------------------------------------------

    def check_admissible(
        self, input_ids: list[int], guidance: Guidance | None, tenant: str = ""
    ) -> None:
        """Refuse a request of `tenant` that was in the engine process at repeated faults
        (it would take every request in flight down again).

        Raises:
            InvalidRequestError: It is refused.
        """
        if self._model.refused(_tag(input_ids, guidance, tenant)):
            raise InvalidRequestError(
                "this request was being generated when the engine process failed, twice: "
                "it is refused rather than tried again (see the server's log)"
            )

    def check_options(self, options: SamplingOptions) -> None:
        """Refuse an adapter the model was not baked with, and what a model with a draft
        model cannot do (`draft_model`): decode without drafts, or a beam search.

        Raises:
            ModelNotFoundError: No such adapter.
            InvalidRequestError: The request asks for what the draft model cannot do.
        """
        if options.adapter is not None:
            self.check_adapter(options.adapter)
        if not self.draft_model:
            return
        if not options.speculative:
            raise InvalidRequestError(
                "speculative: false: this model always drafts with its draft model "
                "(onnxruntime-genai 0.18 cannot decode it without); a bake without --draft "
                "decodes without drafts",
                param="speculative",
            )
        if options.num_beams > 1:
            raise InvalidRequestError(
                "num_beams: no beam search on a model with a draft model (onnxruntime-genai "
                "0.18 cannot)",
                param="num_beams",
            )

    def speculative(self, options: SamplingOptions, logprobs: int | None) -> dict[str, Any] | None:
        """og's speculative options for one lone sequence (None: one token a pass): the
        model's (`speculation`) unless the request opts out, or asks for log probabilities
        (in n-gram mode og 0.18 gives a speculative generator's logits to no one). A batch
        never drafts (og 0.18: batch size 1 only); beam search neither. A draft model
        drafts for every request (`check_options` refused the others)."""
        if self.draft_model:
            return self.speculation
        if logprobs is not None or not options.speculative or options.num_beams > 1:
            return None
        return self.speculation

    def cache_key(
        self, options: SamplingOptions, logprobs: int | None
    ) -> tuple[EffectiveSampling, bool] | None:
        """What a kept generator's options must equal for a request to reuse it (the prompt
        cache): its og search options, and whether it drafts. On a model that does not
        draft, a kept generator is neutral (`neutral`: greedy, no penalty) and each request
        picks its own tokens on it (`picking`), so any request may reuse it, greedy,
        sampled or seeded. On one that drafts (`speculation`), og's own search picks the
        tokens (a draft is verified with it, and a seed draws as plain decoding does), fixed
        when og makes the generator: only greedy requests keep and reuse those (None: this
        request does not use the cache)."""
        if self.speculation is None:
            return neutral(options.adapter), False
        sampling = self.sampling(options)
        if sampling.temperature > 0:
            return None
        return sampling, self.speculative(options, logprobs) is not None

    def picking(self, options: SamplingOptions) -> EffectiveSampling | None:
        """How a lone, unguided sequence's tokens are picked in our code (core.picker) on
        a neutral generator: its sampling, unless og's greedy search gives the same tokens
        (greedy, no penalty), the model drafts (og's search verifies the drafts, and a
        seeded request draws the same with drafts and without), or a minimum length
        applies (og's). None: og's search picks them."""
        if self.speculation is not None or options.min_new_tokens > 0:
            return None
        sampling = self.sampling(options)
        if sampling.temperature == 0 and sampling.repetition_penalty == 1:
            return None
        return sampling

    def sampling(self, options: SamplingOptions) -> EffectiveSampling:
        """How `options` pick tokens, as og does it (equal ones may share a batch): the one
        place where the fields they leave out become the model's defaults."""
        return EffectiveSampling.of(options, self.sampling_defaults, self.vocab_size)

    def decode(
        self,
        input_ids: list[int],
        max_new: int,
        options: SamplingOptions,
        guidance: Guidance | None = None,
        logprobs: int | None = None,
        paused: Callable[[bool], None] | None = None,
        checkpoint: Callable[[], None] | None = None,
        tenant: str = "",
    ) -> Decoding:
        """Start decoding one sequence: up to `max_new` new tokens after `input_ids`
        (sampled or greedy, guided or not; `beam_search` and `decode_cached` are the
        other ways).

        The og Generator is made now (bad guidance fails here, before any token); the
        steps come as they are iterated. `paused(True)` is called while the decoding
        waits for its reader or prefills in parts (other work may run beside it), and
        `paused(False)` when it computes again; `checkpoint()` between the parts of the
        prefill, where it raises to end the generation (its client left, its time is up,
        the server drains). With `logprobs` (the number of alternatives; 0: none), each
        `Token` carries its `TokenLogprob`.

        Raises:
            InvalidRequestError: The guidance is invalid.
            GenerationError: og cannot start the generation.
        """
        prompt_len = len(input_ids)
        # An unguided sequence picks its tokens as it would through the prompt cache
        # (`picking`): a seed gives the same tokens with the cache and without it.
        picking = None if guidance is not None else self.picking(options)
        sampling = self.sampling(options) if picking is None else neutral(options.adapter)
        search: dict[str, Any] = {
            "max_length": prompt_len + max_new,
            "min_length": prompt_len + min(options.min_new_tokens, max_new),
            **sampling.search(),
        }
        if options.seed is not None and picking is None:
            # onnxruntime-genai takes a non-negative int32 seed (2**31 and up fail with a
            # native error; -1 means "random"): fold any int64 into that range, the same
            # way every time.
            search["random_seed"] = options.seed % _SEED_RANGE
        speculative = self.speculative(options, logprobs)
        try:
            tags = (_tag(input_ids, guidance, tenant),)
            generator = self._model.generator(
                search, guidance, tags, adapter=sampling.adapter, speculative=speculative
            )
        except RuntimeError as exc:
            if guidance is not None:
                raise InvalidRequestError(f"invalid guidance: {first_line(exc)}") from exc
            raise GenerationError(f"cannot start generation: {first_line(exc)}") from exc
        if picking is not None:
            generator.pick(picking, options.seed)
        return Decoding(
            self._prefill_and_decode(
                generator,
                input_ids,
                max_new,
                logprobs,
                paused,
                checkpoint,
                guided=guidance is not None,
            )
        )

    def beam_search(
        self,
        input_ids: list[int],
        max_new: int,
        options: SamplingOptions,
        checkpoint: Callable[[], None] | None = None,
        tenant: str = "",
    ) -> Decoding:
        """Beam search (og's, CPU; `options.num_beams`): the best beam's tokens, all at
        the end. The beams advance one step a call, `checkpoint()` between the steps (it
        raises to end the search: its client left, its time is up), so a beam search
        holds the engine no longer than a batch's decode step at a time."""
        prompt_len = len(input_ids)
        search: dict[str, Any] = {
            "max_length": prompt_len + max_new,
            "min_length": prompt_len + min(options.min_new_tokens, max_new),
            "num_beams": options.num_beams,
            "num_return_sequences": 1,
            "do_sample": False,
            "length_penalty": options.length_penalty,
            "early_stopping": options.early_stopping,
            "repetition_penalty": self.sampling(options).repetition_penalty,
        }
        try:
            tags = (_tag(input_ids, None, tenant),)
            generator = self._model.generator(search, None, tags, adapter=options.adapter)
        except RuntimeError as exc:
            raise GenerationError(f"cannot start beam search: {first_line(exc)}") from exc

        def best() -> Generator[DecodeEvent, None, None]:
            try:
                # In one append: og 0.18 crashes (SIGSEGV) on a beam search's second
                # append_tokens; core.service bounds beams x prompt (one_pass_tokens).
                generator.append(input_ids)
                # A step a call (never `finish` in one call: a long search would hold the
                # engine, and every other request, for minutes, deaf to its client).
                while generator.step_batch() is not None:
                    if checkpoint is not None:
                        checkpoint()
                sequence = generator.finish(0)[prompt_len:]
            except RuntimeError as exc:
                raise GenerationError(f"beam search failed: {first_line(exc)}") from exc
            ended = next((i for i, t in enumerate(sequence) if t in self.eos_ids), None)
            for token in sequence[:ended]:
                yield Token(token)
            yield Finish("length" if ended is None else "eos")

        return Decoding(best())

    def decode_cached(
        self,
        input_ids: list[int],
        max_new: int,
        options: SamplingOptions,
        logprobs: int | None = None,
        paused: Callable[[bool], None] | None = None,
        checkpoint: Callable[[], None] | None = None,
        tenant: str = "",
        scope: str = "",
    ) -> Decoding:
        """`decode` through the prompt cache, for an unguided request with no minimum
        length (`cache_key` is not None: greedy, sampled or seeded; greedy only where the
        model drafts): a kept generator that holds the start of `input_ids` is reused (a
        `Cached` step says how many), and this one is kept afterwards (see
        `PromptCache`), both within `scope` (whose prompt it is: core.tenants); `tenant`
        owns its fault record. The request picks its own tokens on it (`picking`). Only
        with a prompt cache (`prompt_cache` is not None)."""
        cache = self.prompt_cache
        assert cache is not None, "decode_cached needs the prompt cache"
        key = self.cache_key(options, logprobs)
        assert key is not None, "decode_cached needs a request the cache takes"
        room = len(input_ids) + max_new
        taken = cache.take(input_ids, room, key, scope)
        if taken is not None:
            slot, common = taken
            generator, max_length = slot.generator, slot.max_length
            try:
                generator.rewind(common)
            except RuntimeError as exc:
                raise GenerationError(f"cannot reuse a cached prompt: {first_line(exc)}") from exc
        else:
            common = 0
            max_length = min(max(room, cache.max_tokens), self.context_length or room)
            search = {"max_length": max_length, **key[0].search()}
            speculative = self.speculative(options, logprobs)
            try:
                tags = (_tag(input_ids, None, tenant),)
                generator = self._model.generator(
                    search, None, tags, adapter=key[0].adapter, speculative=speculative
                )
            except RuntimeError as exc:
                raise GenerationError(f"cannot start generation: {first_line(exc)}") from exc
        picking = self.picking(options)
        if picking is not None:
            generator.pick(picking, options.seed)

        def keep() -> None:  # the prompt's prefill is in its cache: keep it for the next
            # ... unless its KV buffer is larger than a slot's bound (a slot holds what
            # /readyz states, never more).
            if max_length <= cache.max_tokens:
                cache.put(list(input_ids), generator, max_length, key, scope)

        def steps() -> Generator[DecodeEvent, None, None]:
            if common:
                yield Cached(common)
            rest = input_ids[common:]
            yield from self._prefill_and_decode(
                generator, rest, max_new, logprobs, paused, checkpoint, keep
            )

        return Decoding(steps())

    def stream_tokens(
        self, input_ids: list[int], options: SamplingOptions
    ) -> Generator[int, None, None]:
        """New token ids until EOS or `options.max_new_tokens` (capped by the context),
        with no admission and no text: for benchmarks and tests that work in token ids."""
        max_new = options.max_new_tokens
        if self.context_length:
            max_new = min(max_new, self.context_length - len(input_ids))
        if not input_ids or max_new < 1:
            raise InvalidRequestError(f"{len(input_ids)} prompt tokens leave no room to decode")
        if options.num_beams > 1:
            return _token_ids_of(self.beam_search(input_ids, max_new, options))
        return _token_ids_of(self.decode(input_ids, max_new, options))

    def _prefill_and_decode(
        self,
        generator: OgGenerator,
        input_ids: list[int],
        limit: int,
        logprobs: int | None,
        paused: Callable[[bool], None] | None,
        checkpoint: Callable[[], None] | None,
        keep: Callable[[], None] | None = None,
        guided: bool = False,
    ) -> Generator[DecodeEvent, None, None]:
        """Prefill `input_ids`, then yield up to `limit` new tokens and the `Finish`;
        `keep()` once the prefill is in (unless a step fails), when the decoding ends.

        A guided generation that og cannot continue failed on its guidance (a grammar
        that needs bytes this model's tokens cannot give, e.g. a regex of some non-ASCII
        characters on a byte-level vocabulary): that is the request's error, not ours.
        """
        prefilled = False
        try:
            # A generator keeps its last part's logits until its next step, and a kept one
            # may have none (max_tokens 1, or EOS first): a longer prompt ends on a part
            # of two tokens (one more og call: ~1/32 of the prefill at most).
            kept = keep is not None and len(input_ids) > KEPT_LOGITS_TOKENS
            self._prefill(generator, input_ids, paused, checkpoint, MIN_APPENDED if kept else 0)
            prefilled = True
            for _ in range(limit):
                token, logprob, drafts = generator.step(logprobs)
                if token in (EOS, DONE):
                    yield Finish("eos" if token == EOS else "length")
                    return
                if paused is None:
                    yield Token(token, logprob, drafts)
                else:
                    paused(True)
                    yield Token(token, logprob, drafts)
                    paused(False)
            yield Finish("length")
        except OrtServeError:  # a checkpoint ended it, or the engine process (its generator)
            prefilled = False
            raise
        except RuntimeError as exc:
            prefilled = False  # a failed generator is not kept
            if guided:
                raise InvalidRequestError(
                    f"the guidance cannot be followed with this model's tokens: {first_line(exc)}"
                ) from exc
            raise GenerationError(f"generation failed: {first_line(exc)}") from exc
        finally:
            if prefilled and keep is not None:
                keep()

    def _prefill(
        self,
        generator: OgGenerator,
        input_ids: list[int],
        paused: Callable[[bool], None] | None,
        checkpoint: Callable[[], None] | None,
        tail: int = 0,
    ) -> None:
        """Append a prompt to `generator` in parts of PREFILL_CHUNK_TOKENS (core.prefill),
        calling `checkpoint` between them (it raises to stop there). A prefill in parts
        counts as paused (`paused(True)`), so that a batcher may start requests that came
        meanwhile beside it (their steps then run between its parts)."""
        parts = prefill_parts(len(input_ids), self.settings.prefill_chunk_tokens, tail)
        if paused is not None and len(parts) > 1:
            paused(True)
        start = 0
        for i, size in enumerate(parts):
            if i:
                # The GIL is free here: health checks, other requests and signals run. A
                # request takes the event loop and a worker thread several turns each;
                # time.sleep(0) would give them one, so a /healthz waited ~3 parts.
                if self._model.in_process:
                    time.sleep(_BETWEEN_PARTS_S)
                if checkpoint is not None:
                    checkpoint()
            generator.append(input_ids[start : start + size])
            start += size
        if paused is not None:
            paused(False)

    def decode_batch(
        self,
        prompts: list[list[int]],
        max_new: int,
        sampling: EffectiveSampling,
        tenants: list[str] | None = None,
        to_limit: bool = False,
    ) -> Generator[list[int], None, None]:
        """Decode `prompts` as one og Generator: each step's new token of every row, until
        `max_new` steps past the longest prompt (or the context) are done. An EOS token
        (`eos_ids`) is a row's end; the caller reads the rows, and stops when it needs no
        more steps (closing the generator frees the batch's KV cache). With `to_limit`, og
        holds EOS back at every step (each row's own limit is the caller's to cut).
        """
        longest = max(len(p) for p in prompts)
        # Right padding with the pad id: og builds the attention mask from a row's trailing
        # pad ids (padding with any other id is attended to), and GQA writes each row's
        # new tokens after its own length, so logits match the prompt's alone bit for bit
        # (fp32; int4 where the MatMulNBits kernel rounds M > 1 like M = 1, see
        # core.service's batching rule). Left padding does not match; a prompt ending with
        # the pad id cannot batch (core.service).
        tokens = np.full((len(prompts), longest), self.pad_id, dtype=np.int32)
        for row, prompt in enumerate(prompts):
            tokens[row, : len(prompt)] = prompt
        max_length = longest + max_new  # prompts are padded to `longest`
        if self.context_length:
            max_length = min(max_length, self.context_length)
        search = {"batch_size": len(prompts), "max_length": max_length, **sampling.search()}
        if to_limit:
            search["min_length"] = max_length
        owners = tenants or [""] * len(prompts)
        tags = tuple(_tag(p, None, t) for p, t in zip(prompts, owners, strict=True))
        generator = self._model.generator(search, None, tags, adapter=sampling.adapter)
        # og 0.18 takes a batch's prompts in one append ("AppendTokens can only be called
        # once for batch_size > 1"): the batching rule bounds rows x longest
        # (core.service, one_pass_tokens).
        generator.append(tokens)
        while (step := generator.step_batch()) is not None:
            yield step
            # og keeps the GIL through a step: without this the requests would take their
            # token only after the next step (a lone request's TTFT +1 step, see
            # docs/troubleshooting.md).
            time.sleep(0)
