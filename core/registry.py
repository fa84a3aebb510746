"""Several models behind one server: which model a request names, when each loads and
unloads, and the memory they may take together.

The server's model (MODEL, `ORTSERVE_MODEL_DIR`) comes first and loads at the start; the
others (`ORTSERVE_MODELS`, `ortserve serve MODEL MORE...`) load on their first request.
Each is a `ModelState` of its own: a generative model runs in its own engine process on
the daemon (a fault there costs only its requests), an embedding model in the server's
process. A request's `model` picks one (none, or empty: the server's model).

With several models, Ollama's `keep_alive` applies: a model stays loaded for
ORTSERVE_MODEL_KEEP_ALIVE (5 minutes) after its last request ends, or for the request's own
`keep_alive` (0: it unloads as soon as its requests end; negative: for good). The loaded
models' memory, by the sizing formula (core.sizing, the terms the bake declares: the
model, its KV caches and prefill parts, its engine process), stays within
ORTSERVE_MEMORY_BUDGET_MB: a model that does not fit unloads the least recently used
idle models first, and where idle ones cannot make room its request gets a 503 that says
so. With one model nothing unloads (there is nothing to free memory for).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ortserve.core.errors import ModelNotFoundError, ModelUnavailableError
from ortserve.core.names import same_name
from ortserve.core.settings import ServerSettings
from ortserve.core.state import ModelState

log = logging.getLogger("ortserve")

#: How often idle models are looked at for an expired keep_alive.
_REAP_S = 1.0
#: The share of the machine's (or the cgroup's) memory the default budget takes.
_BUDGET_SHARE = 0.9


def model_entries(settings: ServerSettings) -> list[tuple[str | None, Path]]:
    """`settings.models` as (name, folder): `NAME=FOLDER`, or a folder (no name)."""
    entries: list[tuple[str | None, Path]] = []
    for entry in settings.models:
        name, sep, folder = entry.partition("=")
        entries.append(
            (name.strip(), Path(folder)) if sep and name.strip() else (None, Path(entry))
        )
    return entries


@dataclass
class _Use:
    """One model's use: requests in flight, and when it unloads once they end."""

    users: int = 0
    last_used: float = field(default_factory=time.monotonic)
    keep_s: float = math.inf  # after its last request: how long it stays loaded
    need_mib: int | None = None  # its memory by the formula, once read


class Lease:
    """A request's hold on a model: it stays loaded until the lease ends (`release`),
    then for its keep_alive."""

    def __init__(self, models: Models, state: ModelState) -> None:
        self._models = models
        self.state = state
        self._released = False

    def release(self, keep_s: float | None = None) -> None:
        """End the hold (once); `keep_s`: the request's own keep_alive, in seconds."""
        if not self._released:
            self._released = True
            self._models.release(self.state, keep_s)


class Models:
    """Every model the server serves: the server's model first, then the others.

    Attributes:
        states: Each model's state, the server's model first.
        several: More than one model is served (keep_alive and the budget apply).
        budget_mib: The memory the loaded models may take in all.
    """

    def __init__(self, primary: ModelState, settings: ServerSettings) -> None:
        from ortserve.core.durations import setting_seconds

        self.settings = settings
        extras = [
            ModelState(
                settings.model_copy(
                    update={"model_dir": folder, "served_name": name, "aliases": []}
                )
            )
            for name, folder in model_entries(settings)
        ]
        self.states: list[ModelState] = [primary, *extras]
        self.several = len(self.states) > 1
        self.keep_s = setting_seconds(settings.model_keep_alive) if self.several else math.inf
        self.budget_mib = settings.memory_budget_mb or _machine_budget_mib()
        self._use = {id(s): _Use(keep_s=self.keep_s) for s in self.states}
        self._lock = threading.Lock()
        self._reaper: threading.Thread | None = None

    @property
    def primary(self) -> ModelState:
        """The server's model (MODEL): what a request that names none gets."""
        return self.states[0]

    def names(self, state: ModelState) -> tuple[str, ...]:
        """The names `state`'s model is served under, its id first: the server's model
        under the server's names (`ServerSettings.served_names`), the others under theirs
        (`ModelState.names`)."""
        if state is not self.primary:
            return state.names
        own = state.own_names()
        if not own:
            return ()
        return tuple(dict.fromkeys([*self.settings.served_names(own[0]), *own[1:]]))

    def find(self, name: str | None) -> ModelState | None:
        """The model `name` names (any of its names, or the manifest's, in any case,
        with or without `:latest`; `MODEL:ADAPTER` for a LoRA adapter baked beside it);
        None or "": the server's model; None: no model has that name."""
        if not name or not name.strip():
            return self.primary

        def answers(state: ModelState, asked: str) -> bool:  # its listed names, its own
            return any(same_name(asked, n) for n in (*self.names(state), *state.own_names()))

        found = next((s for s in self.states if answers(s, name)), None)
        head, colon, adapter = name.rpartition(":")
        if found is None and colon:  # MODEL:ADAPTER, a LoRA adapter baked beside MODEL
            found = next(
                (
                    s
                    for s in self.states
                    # not loaded yet: the load says which adapters it has
                    if (s.engine is None or adapter in s.engine.adapters) and answers(s, head)
                ),
                None,
            )
        return found

    def pick(self, name: str | None, ollama: bool = False) -> ModelState:
        """The model `name` names (`ollama`: an error in Ollama's words).

        Raises:
            ModelNotFoundError: None has that name (the error lists the served ones).
        """
        state = self.find(name)
        if state is None:
            have = ", ".join(repr(self.names(s)[0]) for s in self.states if self.names(s))
            quoted = f"model '{name}' not found" if ollama else f"the model {name!r} does not exist"
            raise ModelNotFoundError(f"{quoted}; this server has {have}")
        return state

    def acquire(self, state: ModelState) -> Lease:
        """Hold `state` for a request: loading it (in the background) where it is not,
        after making room for it within the budget.

        Raises:
            ModelUnavailableError: It does not fit beside the models in use (503,
                retryable), or it failed to load.
        """
        with self._lock:
            self._use[id(state)].users += 1
        try:
            # The server's model loads at the start (or, on Lambda, as its runtime says);
            # the others on their first request, and any of them again once unloaded.
            if state.status == "unloaded" or (
                state is not self.primary and state.status == "loading"
            ):
                self._load(state)
        except BaseException:
            self.release(state, None)
            raise
        if self.several:
            self._start_reaper()
        return Lease(self, state)

    def release(self, state: ModelState, keep_s: float | None) -> None:
        """A request's hold on `state` ended; with `keep_s` (its own keep_alive) that is
        how long the model stays loaded from now (0: unloaded once idle)."""
        with self._lock:
            use = self._use[id(state)]
            use.users -= 1
            use.last_used = time.monotonic()
            if self.several:  # the request's own keep_alive, else the server's
                use.keep_s = self.keep_s if keep_s is None else keep_s
            idle_now = use.users == 0 and use.keep_s <= 0
        if idle_now:
            state.unload()

    def expires_at(self, state: ModelState) -> float | None:
        """When `state` unloads, in `time.time()` seconds (None: it stays for good, or
        requests hold it)."""
        with self._lock:
            use = self._use[id(state)]
            if use.users or math.isinf(use.keep_s):
                return None
            left = use.last_used + use.keep_s - time.monotonic()
        return time.time() + max(0.0, left)

    def need_mib(self, state: ModelState) -> int:
        """`state`'s memory by the sizing formula, beside the server's own runtime."""
        use = self._use[id(state)]
        if use.need_mib is None:
            use.need_mib = _need_mib(state, self.settings)
        return use.need_mib

    def loaded_mib(self) -> int:
        """What the loaded (and loading) models take by the formula, runtime included."""
        from ortserve.core.sizing import RUNTIME_MIB

        return RUNTIME_MIB + sum(self.need_mib(s) for s in self.states if s.held)

    def _load(self, state: ModelState) -> None:
        """Start loading `state` (where it is not loading already), once the least
        recently used idle models have made room for it within the budget.

        Raises:
            ModelUnavailableError: Idle models cannot make room (503, retryable).
        """
        if not self.several:
            state.start_loading()
            return
        need = self.need_mib(state)
        with self._lock:
            held = [s for s in self.states if s is not state and s.held]
            from ortserve.core.sizing import RUNTIME_MIB

            used = RUNTIME_MIB + sum(self.need_mib(s) for s in held)
            idle = sorted(
                (s for s in held if self._use[id(s)].users == 0 and s.status == "ready"),
                key=lambda s: self._use[id(s)].last_used,
            )
            victims: list[ModelState] = []
            while used + need > self.budget_mib and idle:
                victim = idle.pop(0)
                victims.append(victim)
                used -= self.need_mib(victim)
            fits = used + need <= self.budget_mib
            if fits:
                for victim in victims:  # no request holds them, and none can start now
                    victim.unload()
                state.start_loading()
        if not fits:
            name = state.names[0] if state.names else str(state.settings.model_dir)
            error = ModelUnavailableError(
                f"not enough memory to load {name!r}: it needs {need} MiB and the models in "
                f"use hold {used} MiB of this server's {self.budget_mib} MiB "
                "(ORTSERVE_MEMORY_BUDGET_MB); retry once they are idle"
            )
            error.retryable = True
            raise error
        for victim in victims:
            log.info(
                "unloaded %s to make room for %s (memory budget %d MiB)",
                victim.names[0] if victim.names else victim.settings.model_dir,
                state.names[0] if state.names else state.settings.model_dir,
                self.budget_mib,
            )

    def _start_reaper(self) -> None:
        with self._lock:
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="keep-alive", daemon=True)
                self._reaper.start()

    def _reap(self) -> None:
        """Unload each idle model whose keep_alive ran out (for the process's life)."""
        while True:
            time.sleep(_REAP_S)
            now = time.monotonic()
            with self._lock:
                expired = [
                    s
                    for s in self.states
                    if s.status == "ready"
                    and self._use[id(s)].users == 0
                    and now - self._use[id(s)].last_used >= self._use[id(s)].keep_s
                ]
            for state in expired:
                state.unload()


def _need_mib(state: ModelState, settings: ServerSettings) -> int:
    """A model's memory by the sizing formula (core.sizing.model_memory), less the
    server's own runtime, which the models share; the formula's floor where its folder
    cannot be read yet (the load says why)."""
    from ortserve.core.sizing import RUNTIME_MIB, model_memory

    try:
        terms = model_memory(
            state.settings.model_dir,
            settings.max_concurrency * settings.max_batch,
            engine_process=settings.engine_process,
        )
    except (OSError, ValueError, KeyError) as exc:
        log.debug("no memory figure for %s: %s", state.settings.model_dir, exc)
        return 0
    except Exception as exc:  # a manifest that does not validate: the load says why
        log.debug("no memory figure for %s: %s", state.settings.model_dir, exc)
        return 0
    return max(0, terms.total_mib - RUNTIME_MIB - terms.kept_mib)


def _machine_budget_mib() -> int:
    """90% of the cgroup's memory limit, else of the machine's memory."""
    limit = None
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text(encoding="utf-8").strip()
        limit = int(text) if text.isdigit() else None
    except OSError:
        pass
    if limit is None:
        try:
            for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
                if line.startswith("MemTotal:"):
                    limit = int(line.split()[1]) * 1024
                    break
        except OSError:
            limit = None
    return int(_BUDGET_SHARE * limit / (1 << 20)) if limit else 1 << 20
