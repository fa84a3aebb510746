"""The Python API: load a baked model once and generate from it, without HTTP.

`from ortserve import TextGenerator` is this class. It goes through the same service
(core.service) as the HTTP API (tokenization as transformers, admission, batching, stop strings),
so a script and the server give the same text for the same request.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ortserve.core.engine import Engine
from ortserve.core.errors import InvalidRequestError
from ortserve.core.generation import Completion, GenerationRequest, SamplingOptions
from ortserve.core.service import Service
from ortserve.core.settings import EngineSettings, StoreSettings


def _default_model_dir(settings: EngineSettings) -> Path:
    """ORTSERVE_MODEL_DIR (a folder, or a stored model's name) when it holds a model, else
    the store's newest model."""
    from ortserve import store

    settings, _ = store.with_model(settings)
    if (settings.model_dir / "manifest.json").is_file():
        return settings.model_dir
    models = [m for m in store.list_models(StoreSettings().models) if m.manifest is not None]
    if not models:
        raise InvalidRequestError(
            f"no model: {settings.model_dir} holds none and the store is empty; pass "
            "model_dir=, set ORTSERVE_MODEL_DIR, or `ortserve run MODEL` once"
        )
    newest = max(models, key=lambda m: m.manifest.created_at if m.manifest else "")
    return newest.folder


def _figures(done: Completion) -> dict[str, Any]:
    return {
        "tokens_generated": done.completion_tokens,
        "prompt_tokens": done.prompt_tokens,
        "finish_reason": done.finish_reason,
        "time_to_first_token_s": done.timings.ttft_s,
        "tokens_per_s": done.timings.decode_tokens_per_s,
    }


class TextGenerator:
    """A baked model, loaded once (execution providers probed as everywhere).

    Attributes:
        service: The model's service (admission, batching, limits) over its engine.
    """

    def __init__(self, model_dir: str | Path | None = None, **settings: Any) -> None:
        """Load `model_dir`, a folder or a stored model's name (default:
        ORTSERVE_MODEL_DIR, else the local store's newest model); `settings` are
        EngineSettings fields (e.g. providers="cuda,cpu", threads=2), over the ORTSERVE_*
        environment.

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

    @staticmethod
    def _request(
        prompt: str | None,
        messages: Sequence[dict[str, Any]] | None,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        seed: int | None,
        stop: Sequence[str] | None,
    ) -> GenerationRequest:
        options = SamplingOptions(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
        )
        return GenerationRequest(
            prompt=prompt,
            messages=list(messages) if messages is not None else None,
            options=options,
            stop=tuple(stop or ()),
        )

    def generate(
        self,
        prompt: str,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Generate from a raw prompt.

        Returns:
            {"generated_text", "tokens_generated", "prompt_tokens", "finish_reason",
            "time_to_first_token_s", "tokens_per_s"}.
        """
        request = self._request(prompt, None, max_new_tokens, temperature, top_p, top_k, seed, stop)
        done = self.service.generate(request)
        return {"generated_text": done.text, **_figures(done)}

    def stream_generate(
        self,
        prompt: str,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Stream a raw prompt's text: `(chunk, {"finished": False})` pairs, then one
        `("", {"finished": True, ...figures as `generate` gives them})`."""
        request = self._request(prompt, None, max_new_tokens, temperature, top_p, top_k, seed, stop)
        yield from self._stream(request)

    def chat(
        self,
        messages: Sequence[dict[str, Any]],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Generate the assistant's reply to chat `messages` (the model's chat template).

        Returns:
            As `generate`.
        """
        request = self._request(
            None, messages, max_new_tokens, temperature, top_p, top_k, seed, stop
        )
        done = self.service.generate(request)
        return {"generated_text": done.text, **_figures(done)}

    def stream_chat(
        self,
        messages: Sequence[dict[str, Any]],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Stream the reply to chat `messages`, as `stream_generate` streams."""
        request = self._request(
            None, messages, max_new_tokens, temperature, top_p, top_k, seed, stop
        )
        yield from self._stream(request)

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
