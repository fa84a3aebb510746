"""The Python API: load a baked model once and generate from it, without HTTP.

`from ortserve import TextGenerator` is this class. It goes through the same service
(core.service) as the HTTP API (tokenization as transformers, admission, batching, stop strings),
so a script and the server give the same text for the same request.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypedDict, Unpack, cast

from ortserve.core.engine import Engine
from ortserve.core.errors import InvalidRequestError
from ortserve.core.generation import Completion, GenerationRequest, SamplingOptions
from ortserve.core.service import Service
from ortserve.core.settings import EngineSettings, StoreSettings


def _default_model_dir(settings: EngineSettings) -> Path:
    """ORTSERVE_MODEL_DIR (a folder, or a stored model's name) when it holds a model, else
    the model `ortserve serve` with no MODEL serves: the store's only one
    (`store.default_model`)."""
    from ortserve import store

    settings, _ = store.with_model(settings, store.PYTHON)
    if (settings.model_dir / "manifest.json").is_file():
        return settings.model_dir
    only = store.default_model(StoreSettings().models, store.PYTHON)
    if only is None:
        raise InvalidRequestError(
            f"no model: {settings.model_dir} holds none and the store is empty; pass "
            "`TextGenerator(NAME_OR_FOLDER)`, set ORTSERVE_MODEL_DIR, or bake one into the "
            f"store once (`ortserve pull {store.FIRST_MODEL}`)"
        )
    return only.folder


def _figures(done: Completion) -> dict[str, Any]:
    return {
        "tokens_generated": done.completion_tokens,
        "prompt_tokens": done.prompt_tokens,
        "finish_reason": done.finish_reason,
        "time_to_first_token_s": done.timings.ttft_s,
        "tokens_per_s": done.timings.decode_tokens_per_s,
    }


class _Options(TypedDict, total=False):
    """SamplingOptions fields, with their defaults there (but 128 new tokens): the sampling
    ones left out are the model's defaults, as on every other route."""

    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int | None


class SamplingKwargs(_Options, total=False):
    """The keyword arguments of `generate`, `stream_generate`, `chat` and `stream_chat`,
    declared here alone: SamplingOptions fields (`_Options`), and stop strings."""

    stop: Sequence[str] | None


_DEFAULTS = SamplingOptions(max_new_tokens=128)


def _request(
    method: str,
    sampling: SamplingKwargs,
    prompt: str | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> GenerationRequest:
    """The request `method` was called for: a keyword it does not take is a TypeError, as
    in a signature that names each."""
    unknown = sorted(sampling.keys() - SamplingKwargs.__annotations__.keys())
    if unknown:
        raise TypeError(
            f"TextGenerator.{method}() got an unexpected keyword argument {unknown[0]!r}"
        )
    stop = sampling.pop("stop", None)
    options = cast(_Options, sampling)  # the rest: mypy checks them against SamplingOptions
    return GenerationRequest(
        prompt=prompt,
        messages=messages,
        options=replace(_DEFAULTS, **options),
        stop=tuple(stop or ()),
    )


class TextGenerator:
    """A baked model, loaded once (execution providers probed as everywhere).

    Attributes:
        service: The model's service (admission, batching, limits) over its engine.
    """

    def __init__(self, model_dir: str | Path | None = None, **settings: Any) -> None:
        """Load `model_dir`, a folder or a stored model's name (default:
        ORTSERVE_MODEL_DIR, else the local store's only model; with several, name one);
        `settings` are EngineSettings fields (e.g. providers="cuda,cpu", threads=2), over
        the ORTSERVE_* environment.

        Raises:
            OrtServeError: No model, or it cannot be loaded (the reason says why).
        """
        from ortserve import store

        engine_settings = EngineSettings(**settings)
        if model_dir is not None:  # a folder, or a stored model's name (`smollm2`)
            folder = store.locate(StoreSettings().models, model_dir).folder
        else:
            folder = _default_model_dir(engine_settings)
        self.service = Service.load(engine_settings.model_copy(update={"model_dir": folder}))

    @property
    def engine(self) -> Engine:
        """The loaded model (name, probe report, manifest)."""
        return self.service.engine

    @property
    def model_name(self) -> str:
        """The served model's name."""
        return self.engine.model_name

    def generate(self, prompt: str, **sampling: Unpack[SamplingKwargs]) -> dict[str, Any]:
        """Generate from a raw prompt.

        Returns:
            {"generated_text", "tokens_generated", "prompt_tokens", "finish_reason",
            "time_to_first_token_s", "tokens_per_s"}.
        """
        done = self.service.generate(_request("generate", sampling, prompt=prompt))
        return {"generated_text": done.text, **_figures(done)}

    def stream_generate(
        self, prompt: str, **sampling: Unpack[SamplingKwargs]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Stream a raw prompt's text: `(chunk, {"finished": False})` pairs, then one
        `("", {"finished": True, ...figures as `generate` gives them})`."""
        return self._stream(_request("stream_generate", sampling, prompt=prompt))

    def chat(
        self, messages: Sequence[dict[str, Any]], **sampling: Unpack[SamplingKwargs]
    ) -> dict[str, Any]:
        """Generate the assistant's reply to chat `messages` (the model's chat template).

        Returns:
            As `generate`.
        """
        done = self.service.generate(_request("chat", sampling, messages=list(messages)))
        return {"generated_text": done.text, **_figures(done)}

    def stream_chat(
        self, messages: Sequence[dict[str, Any]], **sampling: Unpack[SamplingKwargs]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Stream the reply to chat `messages`, as `stream_generate` streams."""
        return self._stream(_request("stream_chat", sampling, messages=list(messages)))

    def _stream(self, request: GenerationRequest) -> Iterator[tuple[str, dict[str, Any]]]:
        stream = self.service.stream(request)
        try:
            for delta in stream:
                yield delta, {"finished": False}
        finally:
            stream.close()  # a caller that stops early frees the engine at once
        done = stream.completion
        assert done is not None  # the stream ran to its end
        yield "", {"finished": True, **_figures(done)}
