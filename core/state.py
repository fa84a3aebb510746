"""The model's life in a serving process: loading, ready or failed, never a crash; and
the blue/green switch to another model folder while serving (`ModelState.reload`).

The folder may hold a generative model (og, behind `Service`) or an embedding model
(onnxruntime, core.embedding): a state holds one or the other once ready."""

from __future__ import annotations

import gc
import logging
import platform
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ortserve.core.admission import CANCEL_POLL_S
from ortserve.core.cpu import usable_cpus
from ortserve.core.description import ModelDescription
from ortserve.core.errors import (
    ClientClosedError,
    InvalidRequestError,
    ModelUnavailableError,
    OrtServeError,
)
from ortserve.core.manifest import Manifest, arch_mismatch, manifest_digest, verify_folder
from ortserve.core.settings import EngineSettings, ServerSettings

if TYPE_CHECKING:  # onnxruntime-genai is imported when a model loads, not with this module
    from ortserve.core.content_filter import ContentFilter
    from ortserve.core.embedding import EmbeddingModel
    from ortserve.core.engine import Engine
    from ortserve.core.service import Service

log = logging.getLogger("ortserve")

ModelStatus = Literal["loading", "ready", "failed", "unloaded"]
ReloadStatus = Literal["reloading", "switched", "unchanged", "failed"]
# A swapped-out model is freed once its last request ends; until then it is looked at
# this often, then less and less often (a collection pass costs a few ms of the GIL).
_RETIRE_POLL_S = (0.1, 30.0)


@dataclass(frozen=True)
class ReloadReport:
    """The last model reload (blue/green switch), for /readyz and logs.

    Attributes:
        status: reloading (under way), switched (the new model serves), unchanged (the
            folder holds the model already serving), failed (the old one keeps serving).
        count: Reloads finished since the process started (this one included once done).
        model_dir: The folder it loaded (symlinks resolved).
        manifest_digest: That folder's manifest digest, when it could be read.
        reason: Why it failed.
        seconds: Load, verification and warm-up time, up to the switch.
    """

    status: ReloadStatus
    count: int
    model_dir: str
    manifest_digest: str | None = None
    reason: str | None = None
    seconds: float | None = None


def pinned_folder(model_dir: Path) -> Path:
    """`model_dir` with its symlinks resolved (when it exists): a load reads one folder
    even if a `current` symlink is flipped meanwhile."""
    try:
        return model_dir.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop: the load says why
        return model_dir


class ModelState:
    """Holds the service once the model is loaded. Health endpoints read it at once;
    requests that come while it loads wait for the load (bounded), as Ollama's do.

    Attributes:
        status: loading, ready or failed.
        reason: Why it failed (or what it is doing), for /readyz and logs.
        service: The model's service, when ready (a generative model).
        embedder: The embedding model, when ready (an embedding model's folder).
    """

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.status: ModelStatus = "loading"
        self.reason: str | None = f"loading {settings.model_dir}"
        self.service: Service | None = None
        self.embedder: EmbeddingModel | None = None
        #: The content filter an embedding model's inputs pass (the service has its own).
        self.content_filter: ContentFilter | None = None
        self._lock = threading.Lock()  # held through a load
        self._loader_lock = threading.Lock()  # never held long: requests call start_loading
        self._loader: threading.Thread | None = None
        self._settled = threading.Condition()  # notified when a load ends, either way
        self._loading = False  # a load is under way (or its thread about to start)
        self.warmup_s: float | None = None  # the warm-up generation's time, once run
        self.last_reload: ReloadReport | None = None
        self._reloads = 0
        self._declared_for: tuple[Path, Manifest] | None = None

    def start_loading(self) -> threading.Thread:
        """Load in a background thread (once, and again after `unload`); health answers
        "loading" meanwhile."""
        with self._loader_lock:
            if self._loader is None or (self.status == "unloaded" and not self._loading):
                self._loading = True
                if self.status == "unloaded":
                    self.status, self.reason = "loading", f"loading {self.settings.model_dir}"
                self._loader = threading.Thread(target=self.load, name="model-load", daemon=True)
                self._loader.start()
            return self._loader

    def load(self) -> None:
        """Load the model (blocking). Sets ready or failed; never raises."""
        self._loading = True
        try:
            self._load()
        finally:
            with self._settled:
                self._loading = False
                self._settled.notify_all()

    @property
    def held(self) -> bool:
        """Its model is loaded, or a load of it is under way (what memory it takes)."""
        return self.status == "ready" or self._loading

    def unload(self) -> bool:
        """Free the model (several models served: its keep_alive ran out, a request's
        `keep_alive` 0, or room for another): requests from now on load it again; those
        in flight finish on it, and its engine process ends with the last of them.
        False: not loaded (loading, failed, or unloaded already)."""
        with self._lock:
            old, embedder = self.service, self.embedder
            if self.status != "ready":
                return False
            with self._settled:
                self.service, self.embedder = None, None
                self.status, self.reason = "unloaded", "unloaded; it loads on its next request"
                self._settled.notify_all()
        log.info("model %s unloaded", self.names[0] if self.names else self.settings.model_dir)
        if old is not None:
            _retire(old)
        del embedder  # freed with the last request that holds it
        return True

    def _load(self) -> None:
        with self._lock:
            if self.status == "ready":
                return
            try:
                from ortserve.core.embedding import is_embedding_folder
                from ortserve.core.service import Service

                settings = self._pinned(self.settings.model_dir)
                if is_embedding_folder(settings.model_dir):
                    self._load_embedder(settings)
                    return
                service = Service.load(settings)
                if settings.warmup:
                    self.warmup_s = service.warm_up()
            except OrtServeError as exc:
                self.status, self.reason = "failed", exc.message
                log.error("model load failed: %s", exc.message)
                return
            except Exception as exc:  # a bug or an unexpected native error: stay up, say so
                self.status, self.reason = "failed", f"unexpected error: {type(exc).__name__}"
                log.exception("model load failed")
                return
            self.service, self.status, self.reason = service, "ready", None
            _log_ready(service, self.warmup_s, self.model_id)

    def _load_embedder(self, settings: EngineSettings) -> None:
        """Load the embedding model in `settings.model_dir` (the caller handles errors)."""
        from ortserve.core.content_filter import ContentFilter
        from ortserve.core.embedding import EmbeddingModel

        path = settings.content_filter  # a bad filter file fails before the model loads
        self.content_filter = ContentFilter.load(path) if path is not None else None
        embedder = EmbeddingModel.load(
            settings.model_dir, settings.threads or 0, settings.verify_sha256
        )
        self.embedder, self.status, self.reason = embedder, "ready", None
        log.info(
            "embedding model %s ready on onnxruntime's CPU provider (%d dimensions, %s; "
            "loaded in %.2f s)",
            self.model_id,
            embedder.dimensions,
            embedder.config.precision,
            embedder.load_seconds,
        )

    def _pinned(self, model_dir: Path) -> EngineSettings:
        """The settings with `model_dir` resolved to the folder it names now."""
        folder = pinned_folder(model_dir)
        if folder == self.settings.model_dir:
            return self.settings
        return self.settings.model_copy(update={"model_dir": folder})

    def reload(self, model_dir: Path | None = None) -> ReloadReport:
        """Switch to the model in `model_dir` (default: `settings.model_dir` read again,
        e.g. a `current` symlink that points elsewhere now), blue/green.

        The new model loads beside the serving one: its manifest and files are verified,
        the execution providers probed and, with `settings.warmup`, one short generation
        run. Only then do new requests go to it (one attribute swap); requests in flight
        finish on the old service, which they hold, and the old model is freed when the
        last of them ends. If any step fails the old model keeps serving, and the reason
        is logged and kept in `last_reload` (/readyz shows it). Loads and reloads run one
        at a time; a folder holding the model already serving is not loaded again.

        Returns:
            The reload's report (also `last_reload`). Never raises.
        """
        start = time.perf_counter()
        with self._lock:
            settings = self._pinned(model_dir or self.settings.model_dir)
            folder = settings.model_dir
            self._report("reloading", folder)
            from ortserve.core.embedding import is_embedding_folder

            if self.embedder is not None or is_embedding_folder(folder):
                return self._reload_failed(
                    folder,
                    None,
                    "a reload switches between generative models; an embedding model is "
                    "served from the server's start (restart it to serve another)",
                )
            try:
                digest: str | None = manifest_digest(folder)
            except OSError:
                digest = None  # the load names what is missing
            old = self.service
            # An engine process that could not come back after a fault (its files changed
            # under it) serves nothing: the same folder loads anew.
            working = old is not None and old.engine.model.state != "failed"
            if old is not None and working and digest is not None and old.engine.digest == digest:
                # The same manifest is not the same files: another folder (or this one,
                # changed since) may hold it truncated or altered. Sizes always; every
                # byte's hash where the folder is not the one that serves.
                elsewhere = folder != old.engine.settings.model_dir
                try:
                    verify_folder(folder, full_hash=elsewhere or settings.verify_sha256)
                except OrtServeError as exc:
                    return self._reload_failed(folder, digest, exc.message)
                log.info("reload: %s holds the model already serving (%s)", folder, digest[:12])
                return self._report("unchanged", folder, digest, done=True)
            log.info("reload: loading %s beside the serving model", folder)
            try:
                from ortserve.core.service import Service

                service = Service.load(settings)
                warmup_s = service.warm_up() if settings.warmup else None
            except OrtServeError as exc:
                return self._reload_failed(folder, digest, exc.message)
            except Exception as exc:  # a bug or an unexpected native error: keep serving
                log.exception("reload of %s failed", folder)
                return self._reload_failed(
                    folder, digest, f"unexpected error: {type(exc).__name__}"
                )
            seconds = time.perf_counter() - start
            with self._settled:  # the switch: requests from now on get the new service
                self.service, self.status, self.reason = service, "ready", None
                self.warmup_s = warmup_s
                self._settled.notify_all()
            report = self._report(
                "switched", folder, service.engine.digest, seconds=seconds, done=True
            )
            _log_ready(service, warmup_s, self.model_id)
            log.info(
                "reload: switched to %s (%s) in %.2f s%s",
                self.model_id,
                service.engine.digest[:12],
                seconds,
                f"; the previous model ({old.engine.digest[:12]}) is freed once its requests end"
                if old is not None
                else "",
            )
        if old is not None:
            _retire(old)
        return report

    def _reload_failed(self, folder: Path, digest: str | None, reason: str) -> ReloadReport:
        serving = self.service
        if serving is None:  # nothing served before either: the state says why
            self.status, self.reason = "failed", reason
            log.error("reload of %s failed: %s", folder, reason)
        else:
            log.error(
                "reload of %s failed: %s; still serving %s (%s)",
                folder,
                reason,
                serving.engine.model_name,
                serving.engine.digest[:12],
            )
        return self._report("failed", folder, digest, reason=reason, done=True)

    def _report(
        self,
        status: ReloadStatus,
        folder: Path,
        digest: str | None = None,
        reason: str | None = None,
        seconds: float | None = None,
        done: bool = False,
    ) -> ReloadReport:
        if done:
            self._reloads += 1
        seconds = None if seconds is None else round(seconds, 3)
        report = ReloadReport(status, self._reloads, str(folder), digest, reason, seconds)
        self.last_reload = report
        return report

    def fail(self, reason: str) -> None:
        """Mark the model failed without trying to load it (an adapter could not fetch it)."""
        with self._lock:
            self.service, self.status, self.reason = None, "failed", reason
        with self._settled:
            self._settled.notify_all()
        log.error("model unavailable: %s", reason)

    def describe(self) -> ModelDescription:
        """What health endpoints and cold-start logs say of the model: what is loaded,
        where and how fast, or why nothing is."""
        engine = self.engine
        embedder = self.embedder
        described: ModelDescription
        if embedder is not None:
            described = self._embedding(embedder)
        else:
            described = {"reason": self.reason} if engine is None else self._loaded(engine)
        if self.last_reload is not None:
            described["reload"] = asdict(self.last_reload)
        return described

    def _embedding(self, embedder: EmbeddingModel) -> ModelDescription:
        manifest = embedder.manifest
        quality = manifest.quality if manifest is not None else None
        return {
            "model": self.model_id,
            "kind": "embedding",
            "manifest_digest": embedder.digest,
            "execution_provider": "cpu",
            "threads": self.settings.threads or usable_cpus(),
            "load_seconds": round(embedder.load_seconds, 3),
            "quality": quality.model_dump() if quality is not None else None,
            "embedding": embedder.config.record(),
        }

    def _loaded(self, engine: Engine) -> ModelDescription:
        probe = engine.probe
        return {
            "model": self.model_id,
            "manifest_digest": engine.digest,
            "execution_provider": probe.provider,
            "skipped_providers": probe.skipped,
            "threads": probe.threads,
            "load_seconds": round(probe.load_seconds, 3),
            "warmup_seconds": None if self.warmup_s is None else round(self.warmup_s, 3),
            "quality": quality.model_dump() if (quality := engine.manifest.quality) else None,
            "architecture_warning": arch_mismatch(engine.manifest, platform.machine()),
            "prompt_cache": cache.describe(engine.kv_bytes_per_token, engine.vocab_size)
            if (cache := engine.prompt_cache) is not None
            else None,
            "speculative_decoding": engine.speculation_note,
            # The LoRA adapters baked beside it (served as MODEL:NAME), with their gates.
            "adapters": {
                name: adapter.model_dump(exclude={"name"})
                for name, adapter in engine.adapters.items()
            },
            "engine": engine.model.describe(),
        }

    @property
    def model_id(self) -> str | None:
        """What the API calls the loaded model (see `ServerSettings.served_names`)."""
        names = self.names
        return names[0] if names else None

    @property
    def names(self) -> tuple[str, ...]:
        """The names the API serves the model under, its id first: `ServerSettings.
        served_names` of the manifest's model name, or, for an embedding model, of its
        own names (`EmbeddingModel.names`); before it loads, as its manifest says them
        (none where there is no manifest to read)."""
        own = self.own_names()
        if not own:
            return ()
        if isinstance(self.settings, ServerSettings):
            return tuple(dict.fromkeys([*self.settings.served_names(own[0]), *own[1:]]))
        return own

    def own_names(self) -> tuple[str, ...]:
        """The model's own names, its manifest's model name first (an embedding model's:
        `EmbeddingModel.names`), loaded or not (none: no manifest to read)."""
        engine, embedder = self.engine, self.embedder
        if embedder is not None:
            return embedder.names
        if engine is not None:
            return (engine.model_name,)
        return self._declared()

    def manifest(self) -> Manifest | None:
        """The folder's manifest as it is now (read once a folder; None: none to read),
        what the model is before it loads."""
        from ortserve.core.manifest import read_manifest

        folder = pinned_folder(self.settings.model_dir)
        if self._declared_for is not None and self._declared_for[0] == folder:
            return self._declared_for[1]
        try:
            manifest = read_manifest(folder)
        except OrtServeError:
            return None
        self._declared_for = (folder, manifest)
        return manifest

    @property
    def kind(self) -> str:
        """`generative` or `embedding`, as the folder's manifest says (`generative`
        where there is none to read: its load says why)."""
        manifest = self.manifest()
        return manifest.kind if manifest is not None else "generative"

    def _declared(self) -> tuple[str, ...]:
        """The names the folder's manifest gives the model, before it loads."""
        manifest = self.manifest()
        if manifest is None:
            return ()
        if manifest.kind == "embedding" and manifest.source_kind == "catalog":
            family = manifest.source.partition(":")[0]
            return (manifest.source, manifest.model_name, family)
        return (manifest.model_name,)

    @property
    def engine(self) -> Engine | None:
        """The loaded model, when ready."""
        return self.service.engine if self.service is not None else None

    def require(self, wait_s: float = 0.0, cancelled: threading.Event | None = None) -> Service:
        """The service, or a 503 error that says why there is none.

        While a load is under way, wait up to `wait_s` for it to end (a request that
        reaches a cold instance is answered once the model is in, not refused); a set
        `cancelled` (the client left) ends the wait.

        Raises:
            ModelUnavailableError: Not loaded (still loading after `wait_s`, or failed).
            ClientClosedError: `cancelled` was set while waiting.
            InvalidRequestError: It is an embedding model (it generates nothing).
        """
        self._wait(wait_s, cancelled)
        if self.embedder is not None:
            raise InvalidRequestError(
                f"{self.model_id!r} is an embedding model: it does not generate text "
                "(POST /v1/embeddings or /api/embed)"
            )
        service = self.service
        if service is None:
            raise self._unavailable()
        return service

    def require_embedder(
        self, wait_s: float = 0.0, cancelled: threading.Event | None = None
    ) -> EmbeddingModel | None:
        """The embedding model, once loaded (waiting as `require` does); None: the
        folder holds a generative model.

        Raises:
            ModelUnavailableError: Not loaded (still loading after `wait_s`, or failed).
            ClientClosedError: `cancelled` was set while waiting.
        """
        self._wait(wait_s, cancelled)
        if self.embedder is None and self.service is None:
            raise self._unavailable()
        return self.embedder

    def _unavailable(self) -> ModelUnavailableError:
        error = ModelUnavailableError(
            f"the model is not ready ({self.status}: {self.reason or 'no reason given'})"
        )
        error.retryable = self.status != "failed"  # a failed load will not come back
        return error

    def _wait(self, wait_s: float, cancelled: threading.Event | None) -> None:
        """Wait up to `wait_s` for a load under way to end."""
        deadline = time.monotonic() + wait_s
        with self._settled:
            while self.status == "loading" and self._loading:
                if cancelled is not None and cancelled.is_set():
                    raise ClientClosedError("the client closed the request while the model loaded")
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._settled.wait(left if cancelled is None else min(left, CANCEL_POLL_S))


def _log_ready(service: Service, warmup_s: float | None, name: str | None) -> None:
    engine = service.engine
    probe = engine.probe
    mismatch = arch_mismatch(engine.manifest, platform.machine())
    if mismatch is not None:
        log.warning("%s", mismatch)
    warm = f", warm-up {warmup_s:.2f} s" if warmup_s is not None else ""
    # One short line; the details are at DEBUG and in /readyz.
    log.info(
        "model %s ready on %s, %d threads (loaded in %.2f s%s)",
        name or engine.model_name,
        probe.provider,
        probe.threads,
        probe.load_seconds,
        warm,
    )
    failed = probe.failed()
    if failed:  # there, but it could not load the model (a driver, a graph): worth a line
        log.info(
            "providers that could not load it: %s",
            "; ".join(f"{ep}: {why}" for ep, why in failed.items()),
        )
    if probe.not_installed():
        log.debug("providers not installed: %s", ", ".join(probe.not_installed()))
    log.debug("speculative decoding: %s", engine.speculation_note)
    cache = engine.prompt_cache
    if cache is not None:
        size = cache.describe(engine.kv_bytes_per_token, engine.vocab_size)
        log.debug(
            "prompt cache: %d slot(s) of up to %d tokens, %.0f MiB each (KV cache, last logits) "
            "(ORTSERVE_PROMPT_CACHE_SLOTS)",
            size["slots"],
            size["tokens_per_slot"],
            size["mib_per_slot"],
        )


def _retire(old: Service) -> None:
    """Free a swapped-out service once the requests that hold it have ended (in a thread:
    a long stream may keep it for minutes). Its batcher's thread ends when idle; the
    engine is freed with the last reference, and a collection pass breaks the cycles."""
    ref = weakref.ref(old)
    digest = old.engine.digest[:12]
    del old
    start = time.monotonic()

    def wait() -> None:
        pause = _RETIRE_POLL_S[0]
        while True:
            time.sleep(pause)
            service = ref()
            if service is not None:
                stats = service.stats()
                busy = stats.active > 0 or stats.waiting > 0
                if not busy:
                    service.engine.close()  # an engine process ends now, not at a collection
                del service
                if busy:
                    continue
            gc.collect()
            if ref() is None:
                log.info(
                    "the previous model (%s) is freed, %.1f s after the switch",
                    digest,
                    time.monotonic() - start,
                )
                return
            pause = min(pause * 2, _RETIRE_POLL_S[1])

    threading.Thread(target=wait, name="model-retire", daemon=True).start()
