"""og in this process: the only module that imports onnxruntime_genai at run time.

It builds og's model with each allowed execution provider in turn (`probe_providers`), and
drives og Generators and LoRA adapters behind the `core.runtime` protocols: `LocalModel`
for the in-process engine (Lambda, Cloud Functions, the CLI, the bake) and the engine
process's child (core.engine_worker), which serves the daemon's `EngineProcess`. A daemon
with an engine process never imports it in its own process.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.core.errors import ProviderUnavailableError, first_line
from ortserve.core.generation import Drafts, EffectiveSampling, Guidance, TokenLogprob
from ortserve.core.manifest import ADAPTER_NAME, adapter_file
from ortserve.core.picker import Picker
from ortserve.core.runtime import (
    DONE,
    EOS,
    NOT_INSTALLED,
    NOT_SUPPORTED,
    OgGenerator,
    genai_config,
    logprob_of,
)
from ortserve.core.settings import EngineSettings, disable_telemetry

# Before onnxruntime's library loads: it reads ORT_DISABLE_TELEMETRY then (core.settings).
disable_telemetry()
import onnxruntime_genai as og  # noqa: E402 (telemetry must be off before it loads)

# og's own switch, beside ORT_DISABLE_TELEMETRY (which is what stops the events). Neither
# stops onnxruntime-genai 0.18's telemetry worker thread: a process forked after a model
# was created hangs at exit joining it, so models must be created after any fork; see
# functions/gcp/main.py.
og.disable_telemetry_events()

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
_NOT_IN_BUILD = "is not supported in this build"  # what og.Model raises for them


#: onnxruntime session config entries set on the sessions of a process that is og's alone
#: (the engine process: `probe_providers(dedicated=True)`). og 0.18 passes a
#: `session_options` key it does not know to onnxruntime as a config entry. Denormal
#: floats as zero: random-weight models (the test suite's, the size envelope's) make
#: denormals, and on the Intel Xeon VM the 135M shape prefilled 1,024 tokens at 44.9 tok/s
#: with them and 111.7 without; real weights give the same tokens (tested). Not in a
#: process og shares: onnxruntime sets FTZ/DAZ on the thread that creates the session, so
#: the caller's own Python floats would lose their subnormals too (hypothesis refused to
#: run in the test process).
DEDICATED_SESSION_ENTRIES = {"session.set_denormal_as_zero": "1"}
#: The config entry that stops the intra-op threads' spinning (EngineSettings.spin_wait).
NO_SPINNING = "session.intra_op.allow_spinning"


def session_overlay(
    folder: Path, settings: EngineSettings, threads: int, dedicated: bool
) -> dict[str, Any]:
    """The genai_config overlay of the model's sessions: `threads` intra-op threads, and
    onnxruntime config entries (og 0.18 passes a `session_options` key it does not know
    to onnxruntime as one): `DEDICATED_SESSION_ENTRIES` in a process that is og's alone,
    no spinning where `settings.spin_wait` is off."""
    # The draft model (`--draft`) has a thread pool of its own, sized the same.
    sections = ("decoder", "draft") if "draft" in genai_config(folder)["model"] else ("decoder",)
    entries = dict(DEDICATED_SESSION_ENTRIES) if dedicated else {}
    if not settings.spin_wait:
        entries[NO_SPINNING] = "0"
    session = {"session_options": {"intra_op_num_threads": threads, **entries}}
    return {"model": dict.fromkeys(sections, session)}


def probe_providers(
    folder: Path, settings: EngineSettings, threads: int, dedicated: bool = False
) -> tuple[Any, str, dict[str, str]]:
    """Build the model with each allowed provider in order; the first that loads wins.
    `dedicated`: this process is og's alone (`DEDICATED_SESSION_ENTRIES` apply)."""
    overlay = json.dumps(session_overlay(folder, settings, threads, dedicated))
    skipped: dict[str, str] = {}
    for name in settings.provider_order():
        available = _AVAILABLE.get(name)
        if name != "cpu" and name not in _OG_PROVIDER:
            skipped[name] = NOT_SUPPORTED
            continue
        # is_*_available() can say True for an EP that then fails: only a load proves it.
        if available is not None and not available():
            skipped[name] = NOT_INSTALLED
            continue
        try:
            config = og.Config(str(folder))
            config.overlay(overlay)
            config.clear_providers()
            if name != "cpu":
                config.append_provider(_OG_PROVIDER[name])
            return og.Model(config), name, skipped
        except RuntimeError as exc:
            first = first_line(exc)
            skipped[name] = (
                NOT_INSTALLED if _NOT_IN_BUILD in first else f"failed to initialise: {first}"
            )
    reasons = "; ".join(f"{k}: {v}" for k, v in skipped.items())
    raise ProviderUnavailableError(
        f"no allowed execution provider could load the model ({reasons})", skipped
    )


class LocalGenerator:
    """`OgGenerator` over an og Generator of this process: og's search options `search`,
    the LoRA `adapter` (one of `adapters`) and og's `speculative` options (the generator
    then drafts), as `Model.generator` takes them."""

    def __init__(
        self,
        model: Any,
        search: dict[str, Any],
        guidance: Guidance | None,
        adapters: LocalAdapters | None = None,
        *,
        adapter: str | None = None,
        speculative: dict[str, Any] | None = None,
    ) -> None:
        params = og.GeneratorParams(model)
        params.set_search_options(**search)
        if speculative is not None:
            params.set_speculative_options(**speculative)
        if guidance is not None:
            params.set_guidance(guidance.kind, guidance.data)
        self._generator = og.Generator(model, params)
        if adapter is not None:
            if adapters is None:
                raise RuntimeError(f"no adapters here: cannot decode with {adapter!r}")
            adapters.activate(self._generator, adapter)
        self._speculative = speculative is not None
        self._picker: Picker | None = None
        self._drafted = (0, 0)  # og's counts when the current sequence began (see `rewind`)
        self._count: int | None = None  # token_count() after the last step (None: unknown)

    def append(self, input_ids: list[int] | np.ndarray[Any, Any]) -> None:
        """Append prompt tokens (one part; a batch's padded rows in one call)."""
        self._generator.append_tokens(input_ids)
        self._count = None
        if self._picker is not None:
            self._picker.saw(np.asarray(input_ids).reshape(-1).tolist())

    def step(self, top: int | None) -> tuple[int, TokenLogprob | None, Drafts | None]:
        """One new token of a single sequence, and (with `top`, the alternatives wanted)
        its log probability; `EOS` or `DONE` (and None) when there is none. And, for a
        speculative generator, its `Drafts` so far."""
        generator = self._generator
        if generator.is_done():
            return DONE, None, self._drafts()
        # og 0.18 computes a position's logits when the token before it goes in: the
        # ones the next token is picked from are there before the step. (In n-gram mode og
        # gives none: the engine asks for no log probabilities there.)
        picker = self._picker
        logits = None
        if top is not None or picker is not None:  # og's own copy (ours to change)
            logits = np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1)
        count = generator.token_count() if self._count is None else self._count
        if picker is not None and logits is not None:  # our pick, og's greedy takes it
            picked = picker.pick(logits if top is None else logits.copy())
            generator.set_logits(picker.forcing(picked, logits.shape[0]))
            picker.saw((picked,))
        # A speculative generator verifies a round of drafts in one forward pass, then
        # gives the accepted tokens one a call from its buffer (a call per token, as here).
        generator.generate_next_token()
        self._count = generator.token_count()
        if self._count == count:  # an EOS ends it without being appended
            return EOS, None, self._drafts()
        token = int(generator.get_next_tokens()[0])
        logprob = None if logits is None or top is None else logprob_of(logits, token, top)
        return token, logprob, self._drafts()

    def _counts(self) -> tuple[int, int]:
        stats = self._generator.get_speculative_stats()
        # og's acceptance_rate is accepted / evaluated: a round's drafts after its first
        # rejected one are never verified, so "drafted" counts the verified ones.
        return int(stats["draft_tokens_evaluated"]), int(stats["draft_tokens_accepted"])

    def _drafts(self) -> Drafts | None:
        """The drafts of the current sequence: og counts from the generator's start, and a
        kept generator (the prompt cache) serves several requests."""
        if not self._speculative:
            return None
        drafted, accepted = self._counts()
        return Drafts(drafted - self._drafted[0], accepted - self._drafted[1])

    def step_batch(self) -> list[int] | None:
        """One step of a batch: every row's new token (None once it is done)."""
        generator = self._generator
        if generator.is_done():
            return None
        generator.generate_next_token()
        return [int(t) for t in generator.get_next_tokens()]

    def finish(self, row: int = 0) -> list[int]:
        """Step until done (a beam search); the whole sequence of `row`."""
        generator = self._generator
        while not generator.is_done():
            generator.generate_next_token()
        return [int(t) for t in generator.get_sequence(row)]

    def rewind(self, length: int) -> None:
        """Keep the first `length` tokens (and their KV cache) only."""
        self._generator.rewind_to(length)
        self._count = None
        self._picker = None
        if self._speculative:  # a new sequence begins: its drafts count from here
            self._drafted = self._counts()

    def pick(self, sampling: EffectiveSampling, seed: int | None) -> None:
        """See `OgGenerator.pick`."""
        sequence = self._generator.get_sequence(0)
        self._picker = Picker(sampling, seed, np.asarray(sequence).tolist())

    def last_logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        """The logits of the last forward pass's positions (first sequence)."""
        logits: np.ndarray[Any, np.dtype[np.float32]]
        logits = np.asarray(self._generator.get_output("logits"), dtype=np.float32)[0]
        return logits


class LocalAdapters:
    """The LoRA adapters of one og model (`adapters/NAME.onnx_adapter` of its folder,
    `ortserve bake --adapter`), each loaded on its first use or when asked, unloaded when
    asked; the model itself stays."""

    def __init__(self, model: Any, folder: Path) -> None:
        self._model = model
        self._folder = folder
        self._og: Any = None  # og.Adapters, made with the first load
        self._loaded: set[str] = set()
        self._lock = threading.RLock()

    def load(self, name: str) -> bool:
        """Load adapter `name` (True), unless it is loaded (False).

        Raises:
            RuntimeError: The folder has no such adapter, or og cannot load it.
        """
        with self._lock:
            if name in self._loaded:
                return False
            path = self._folder / adapter_file(name)
            if not re.match(ADAPTER_NAME, name) or not path.is_file():
                raise RuntimeError(f"no adapter {name!r} in the model folder")
            if self._og is None:
                self._og = og.Adapters(self._model)
            self._og.load(str(path), name)
            self._loaded.add(name)
            return True

    def unload(self, name: str) -> bool:
        """Free adapter `name` (True), unless it is not loaded (False).

        Raises:
            RuntimeError: A generator still uses it (og: "Adapter still in use").
        """
        with self._lock:
            if name not in self._loaded:
                return False
            self._og.unload(name)
            self._loaded.discard(name)
            return True

    def loaded(self) -> list[str]:
        """The adapters in memory, by name."""
        with self._lock:
            return sorted(self._loaded)

    def activate(self, generator: Any, name: str) -> None:
        """Make `generator` decode with adapter `name` (loaded first where it is not; an
        unload waits: og would not find it)."""
        with self._lock:
            self.load(name)
            generator.set_active_adapter(self._og, name)


class LocalModel:
    """og's model in this process (Lambda, Cloud Functions, the CLI, the bake)."""

    def __init__(self, model: Any, folder: Path) -> None:
        self.og_model = model
        self.adapters = LocalAdapters(model, folder)

    def generator(
        self,
        search: dict[str, Any],
        guidance: Guidance | None,
        tags: tuple[str, ...] = (),
        *,
        adapter: str | None = None,
        speculative: dict[str, Any] | None = None,
    ) -> OgGenerator:
        """See `Model.generator`."""
        return LocalGenerator(
            self.og_model,
            search,
            guidance,
            self.adapters,
            adapter=adapter,
            speculative=speculative,
        )

    def load_adapter(self, name: str) -> bool:
        """See `Model.load_adapter`."""
        return self.adapters.load(name)

    def unload_adapter(self, name: str) -> bool:
        """See `Model.unload_adapter`."""
        return self.adapters.unload(name)

    def loaded_adapters(self) -> list[str]:
        """See `Model.loaded_adapters`."""
        return self.adapters.loaded()

    def close(self) -> None:
        """Nothing to do: the model goes with its last reference."""

    def on_restart(self, callback: Callable[[], None]) -> None:
        """Never called: an in-process model does not restart (a fault ends the process)."""

    def refused(self, tag: str) -> bool:
        """Never: a fault here ends the process."""
        return False

    def describe(self) -> dict[str, Any]:
        """See `Model.describe`."""
        return {"process": "in-process"}

    @property
    def in_process(self) -> bool:
        """Yes."""
        return True

    @property
    def state(self) -> str:
        """Always ready."""
        return "ready"
