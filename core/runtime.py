"""What the engine (core.engine) asks of og, wherever og runs: the `Model` and `OgGenerator`
protocols, and what both sides of them share. In this process they are
`core.og_local`'s; in the engine process, `core.engine_process`'s (whose child runs
`core.og_local`). Nothing here imports onnxruntime_genai: a daemon whose model runs in
the engine process never loads it (tests/functional/test_engine_process.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ortserve.core.errors import ModelIntegrityError
from ortserve.core.generation import Drafts, EffectiveSampling, Guidance, TokenLogprob

# Why a provider was skipped when this onnxruntime-genai build has no library for it
# (CoreML, QNN, OpenVINO, WebGPU in Linux's CPU wheel): nothing is wrong with the machine.
NOT_INSTALLED = "not installed in this onnxruntime-genai build"
NOT_SUPPORTED = "not supported by this onnxruntime-genai build"

# What `OgGenerator.step` gives instead of a token: the model ended the sequence (EOS, not
# appended), or the sequence was at its length already.
EOS = -1
DONE = -2


def logprob_of(logits: np.ndarray[Any, Any], token: int, top: int) -> TokenLogprob:
    """`token`'s log probability under `logits` (one position's), and the `top` best."""
    values = logits.astype(np.float64)
    shifted = values - values.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        ids = np.argpartition(-logprobs, top - 1)[:top]
        ids = ids[np.argsort(-logprobs[ids], kind="stable")]
        best = tuple((int(i), float(logprobs[i])) for i in ids)
    return TokenLogprob(token, float(logprobs[token]), best)


class OgGenerator(Protocol):
    """One og Generator, driven in the units the engine uses: a prompt part, a decode
    step (with its token's log probability when asked), a batch step, a whole beam
    search. `LocalGenerator` in this process; `core.engine_process.RemoteGenerator` runs the same
    calls in the engine process. A native error is a `RuntimeError`, as og raises it."""

    def append(self, input_ids: list[int] | np.ndarray[Any, Any]) -> None:
        """Append prompt tokens (one part; a batch's padded rows in one call)."""
        ...

    def step(self, top: int | None) -> tuple[int, TokenLogprob | None, Drafts | None]:
        """One new token of a single sequence, and (with `top`, the alternatives wanted)
        its log probability; `EOS` or `DONE` (and None) when there is none. And, for a
        speculative generator, its `Drafts` so far."""
        ...

    def step_batch(self) -> list[int] | None:
        """One step of a batch: every row's new token (None once it is done)."""
        ...

    def finish(self, row: int = 0) -> list[int]:
        """Step until done (a beam search); the whole sequence of `row`."""
        ...

    def rewind(self, length: int) -> None:
        """Keep the first `length` tokens (and their KV cache) only (and pick the next
        tokens og's way again)."""
        ...

    def pick(self, sampling: EffectiveSampling, seed: int | None) -> None:
        """Pick this sequence's next tokens our way (`core.picker`: `sampling`, with a
        random generator seeded with `seed`), not with the generator's own search options
        (which must then be greedy with no penalty: `neutral`), until the next rewind."""
        ...

    def last_logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        """The logits of the last forward pass's positions (first sequence)."""
        ...


class Model(Protocol):
    """Where og Generators are made: this process (`LocalModel`) or the engine process
    (`core.engine_process.EngineProcess`), one interface for both."""

    def generator(
        self,
        search: dict[str, Any],
        guidance: Guidance | None,
        tags: tuple[str, ...],
        *,
        adapter: str | None = None,
        speculative: dict[str, Any] | None = None,
    ) -> OgGenerator:
        """A new generator with og's search options `search` (and guidance), decoding with
        the LoRA `adapter` and drafting with og's `speculative` options where given. `tags`
        name the requests it serves (the engine process refuses one that crashed it twice).

        Raises:
            RuntimeError: og cannot make it (bad guidance, bad options).
            OrtServeError: The engine process is down (or refuses the request).
        """
        ...

    def close(self) -> None:
        """Free the model (the engine process ends)."""
        ...

    def load_adapter(self, name: str) -> bool:
        """Load the LoRA adapter `name` (True), unless it is loaded (False).

        Raises:
            RuntimeError: og's error (no such adapter, or it cannot load it).
            OrtServeError: The engine process is down.
        """
        ...

    def unload_adapter(self, name: str) -> bool:
        """Free the LoRA adapter `name` (True), unless it is not loaded (False).

        Raises:
            RuntimeError: og's error (a generator still uses it).
            OrtServeError: The engine process is down.
        """
        ...

    def loaded_adapters(self) -> list[str]:
        """The LoRA adapters in memory, by name.

        Raises:
            OrtServeError: The engine process is down.
        """
        ...

    def on_restart(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the model came back after a fault (its generators are
        gone: a cache of them must be emptied)."""
        ...

    def refused(self, tag: str) -> bool:
        """Whether the request `tag` names is not run again (it was in the engine at
        repeated faults)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Where the model runs, for /readyz: the process, its state and its faults."""
        ...

    @property
    def in_process(self) -> bool:
        """Whether og runs in this process (its calls hold this process's GIL)."""
        ...

    @property
    def state(self) -> str:
        """ready; restarting (after a fault, not serving); failed (it cannot come back)."""
        ...


def genai_config(folder: Path) -> dict[str, Any]:
    """A model folder's genai_config.json.

    Raises:
        ModelIntegrityError: It is missing, not JSON, or has no model section.
    """
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


def kv_bytes_per_token(model_config: dict[str, Any], element_bytes: int = 4) -> int:
    """Bytes of keys and values one token takes in every layer (genai_config's `model`
    section; `element_bytes`: 4 for og 0.18's fp32 cache on CPU, 1 for an int8 one), and
    in every layer of its draft model where it has one (`--draft`: an fp32 cache of its
    own). The engine states it (/readyz's prompt cache); the bake declares memory with it
    (core.sizing).

    Raises:
        KeyError, TypeError, ValueError: A section does not say its layers, KV heads or
            head size.
    """

    def layers(section: dict[str, Any], element: int) -> int:
        heads = int(section["num_key_value_heads"]) * int(section["head_size"])
        return 2 * int(section["num_hidden_layers"]) * heads * element

    draft = layers(model_config["draft"], 4) if "draft" in model_config else 0
    return layers(model_config["decoder"], element_bytes) + draft
