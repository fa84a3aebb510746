"""The engine: the only module that imports onnxruntime_genai.

It loads a baked model folder (manifest checked), probes the execution providers in
the operator's order by really building the model with each, and generates tokens.
Native errors are translated to `core.errors` here and nowhere else.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnxruntime_genai as og

from core.cpu import usable_cpus
from core.errors import (
    GenerationError,
    InvalidRequestError,
    ModelIntegrityError,
    ProviderUnavailableError,
)
from core.manifest import Manifest, manifest_digest, verify_folder
from core.settings import EngineSettings

# ortserve's provider names → onnxruntime-genai's names and availability checks.
# CPU needs no provider entry: an empty provider list is the CPU EP.
_OG_PROVIDER: dict[str, str] = {
    "cuda": "cuda",
    "coreml": "CoreML",
    "qnn": "QNN",
    "openvino": "OpenVINO",
    "dml": "DML",
    "webgpu": "WebGPU",
}
_AVAILABLE: dict[str, Callable[[], bool]] = {
    "cuda": og.is_cuda_available,
    "qnn": og.is_qnn_available,
    "openvino": og.is_openvino_available,
    "dml": og.is_dml_available,
    "webgpu": og.is_webgpu_available,
}


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


@dataclass(frozen=True)
class SamplingOptions:
    """How to pick tokens.

    Attributes:
        max_new_tokens: Upper bound of new tokens.
        min_new_tokens: Force at least this many (benchmarks use min = max).
        temperature: 0 means greedy decoding.
        top_p: Nucleus sampling mass.
        top_k: Keep the k best tokens (0: no limit).
        repetition_penalty: 1.0 means none.
        seed: Random seed for sampling (same seed, same output).
    """

    max_new_tokens: int = 64
    min_new_tokens: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None


@dataclass
class Completion:
    """The result of one generation."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    timings: dict[str, float] = field(default_factory=dict)


def _genai_config(folder: Path) -> dict[str, Any]:
    path = folder / "genai_config.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelIntegrityError(f"{path} is missing") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelIntegrityError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data.get("model"), dict):
        raise ModelIntegrityError(f"{path} has no 'model' section")
    return data


def _threads(genai_config: dict[str, Any], settings: EngineSettings) -> int:
    """Settings override; else the baked value capped by the cores this process may use."""
    if settings.threads is not None:
        return settings.threads
    usable = usable_cpus()
    options = genai_config["model"].get("decoder", {}).get("session_options", {})
    baked = int(options.get("intra_op_num_threads", 0) or 0)
    return min(baked, usable) if baked > 0 else usable


class Engine:
    """One loaded model, shared by all requests of the process."""

    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        model: Any,
        probe: ProbeReport,
        genai_config: dict[str, Any],
    ) -> None:
        self.folder = folder
        self.manifest = manifest
        self.digest = manifest_digest(folder)
        self.probe = probe
        self._model = model
        self._tokenizer = og.Tokenizer(model)
        self.context_length = int(genai_config["model"].get("context_length", 0) or 0)

    @property
    def model_name(self) -> str:
        """The model's public name (the manifest says when its weights are random)."""
        return self.manifest.model_name

    @classmethod
    def load(cls, settings: EngineSettings) -> Engine:
        """Verify, probe and load the model folder named by `settings.model_dir`.

        Raises:
            ModelIntegrityError: The folder is missing, incomplete or altered.
            ProviderUnavailableError: No allowed execution provider could load it.
        """
        start = time.perf_counter()
        folder = settings.model_dir
        manifest = verify_folder(folder, full_hash=settings.verify_sha256)
        genai_config = _genai_config(folder)
        threads = _threads(genai_config, settings)
        overlay = json.dumps(
            {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}
        )
        skipped: dict[str, str] = {}
        for name in settings.provider_order():
            available = _AVAILABLE.get(name)
            if name != "cpu" and name not in _OG_PROVIDER:
                skipped[name] = "not supported by this onnxruntime-genai build"
                continue
            if available is not None and not available():
                skipped[name] = "not installed in this onnxruntime-genai build"
                continue
            try:
                config = og.Config(str(folder))
                config.overlay(overlay)
                config.clear_providers()
                if name != "cpu":
                    config.append_provider(_OG_PROVIDER[name])
                model = og.Model(config)
            except RuntimeError as exc:
                skipped[name] = f"failed to initialise: {_first_line(exc)}"
                continue
            probe = ProbeReport(name, skipped, time.perf_counter() - start, threads)
            return cls(folder, manifest, model, probe, genai_config)
        reasons = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        raise ProviderUnavailableError(f"no execution provider could load the model ({reasons})")

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`."""
        return [int(t) for t in self._tokenizer.encode(text)]

    def decode(self, token_ids: list[int]) -> str:
        """Text of `token_ids`."""
        return str(self._tokenizer.decode(token_ids))

    def _params(self, prompt_len: int, options: SamplingOptions) -> Any:
        if prompt_len == 0:
            raise InvalidRequestError("the prompt is empty")
        room = self.context_length - prompt_len
        if self.context_length and room < 1:
            raise InvalidRequestError(
                f"the prompt has {prompt_len} tokens; the model's context is "
                f"{self.context_length} tokens"
            )
        new = min(options.max_new_tokens, room) if self.context_length else options.max_new_tokens
        search: dict[str, Any] = {
            "max_length": prompt_len + new,
            "min_length": prompt_len + min(options.min_new_tokens, new),
            "do_sample": options.temperature > 0,
            "repetition_penalty": options.repetition_penalty,
        }
        if options.temperature > 0:
            search["temperature"] = options.temperature
            search["top_p"] = options.top_p
            if options.top_k > 0:
                search["top_k"] = options.top_k
        if options.seed is not None:
            search["random_seed"] = options.seed
        params = og.GeneratorParams(self._model)
        params.set_search_options(**search)
        return params

    def stream_tokens(self, input_ids: list[int], options: SamplingOptions) -> Iterator[int]:
        """Yield new token ids until EOS or the token limit.

        Raises:
            InvalidRequestError: The prompt is empty or does not fit the context.
            GenerationError: The native engine failed.
        """
        params = self._params(len(input_ids), options)
        try:
            generator = og.Generator(self._model, params)
            generator.append_tokens(input_ids)
            count = generator.token_count()
            while not generator.is_done():
                generator.generate_next_token()
                # An EOS ends the sequence without being appended: the count stays.
                new_count = generator.token_count()
                if new_count == count:
                    return
                count = new_count
                yield int(generator.get_next_tokens()[0])
        except RuntimeError as exc:
            raise GenerationError(f"generation failed: {_first_line(exc)}") from exc

    def generate(self, prompt: str, options: SamplingOptions) -> Completion:
        """Generate a completion of `prompt` (no chat template applied)."""
        start = time.perf_counter()
        input_ids = self.encode(prompt)
        tokens: list[int] = []
        first = 0.0
        for token in self.stream_tokens(input_ids, options):
            if not tokens:
                first = time.perf_counter() - start
            tokens.append(token)
        total = time.perf_counter() - start
        limit_hit = len(tokens) >= options.max_new_tokens or (
            self.context_length > 0 and len(input_ids) + len(tokens) >= self.context_length
        )
        decode_s = total - first
        return Completion(
            text=self.decode(tokens),
            token_ids=tokens,
            prompt_tokens=len(input_ids),
            finish_reason="length" if limit_hit else "stop",
            timings={
                "ttft_s": first,
                "total_s": total,
                "decode_tokens_per_s": (len(tokens) - 1) / decode_s if decode_s > 0 else 0.0,
            },
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
