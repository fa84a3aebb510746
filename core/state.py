"""The model's life in a serving process: loading, ready or failed, never a crash."""

from __future__ import annotations

import logging
import platform
import threading
import time
from typing import TYPE_CHECKING, Any, Literal

from core.errors import ClientClosedError, ModelUnavailableError, OrtServeError
from core.manifest import arch_mismatch
from core.settings import EngineSettings

if TYPE_CHECKING:  # onnxruntime-genai is imported when a model loads, not with this module
    from core.engine import Engine
    from core.service import Service

log = logging.getLogger("ortserve")

ModelStatus = Literal["loading", "ready", "failed"]
_CANCEL_POLL_S = 0.05  # how often a waiting request whose client may leave looks


class ModelState:
    """Holds the service once the model is loaded. Health endpoints read it at once;
    requests that come while it loads wait for the load (bounded), as Ollama's do.

    Attributes:
        status: loading, ready or failed.
        reason: Why it failed (or what it is doing), for /readyz and logs.
        service: The model's service, when ready.
    """

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.status: ModelStatus = "loading"
        self.reason: str | None = f"loading {settings.model_dir}"
        self.service: Service | None = None
        self._lock = threading.Lock()  # held through a load
        self._loader_lock = threading.Lock()  # never held long: requests call start_loading
        self._loader: threading.Thread | None = None
        self._settled = threading.Condition()  # notified when a load ends, either way
        self._loading = False  # a load is under way (or its thread about to start)
        self.warmup_s: float | None = None  # the warm-up generation's time, once run

    def start_loading(self) -> threading.Thread:
        """Load in a background thread (once); health answers "loading" meanwhile."""
        with self._loader_lock:
            if self._loader is None:
                self._loading = True
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

    def _load(self) -> None:
        with self._lock:
            if self.status == "ready":
                return
            try:
                from core.service import Service

                service = Service.load(self.settings)
                if self.settings.warmup:
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
            engine = service.engine
            probe = engine.probe
            skipped = ", ".join(f"{name} ({why})" for name, why in probe.skipped.items())
            mismatch = arch_mismatch(engine.manifest, platform.machine())
            if mismatch is not None:
                log.warning("%s", mismatch)
            warm = f", warm-up {self.warmup_s:.2f} s" if self.warmup_s is not None else ""
            log.info(
                "model %s ready on %s in %.2f s%s, %d threads; other providers skipped: %s",
                engine.model_name, probe.provider, probe.load_seconds, warm, probe.threads,
                skipped or "none",
            )  # fmt: skip

    def fail(self, reason: str) -> None:
        """Mark the model failed without trying to load it (an adapter could not fetch it)."""
        with self._lock:
            self.service, self.status, self.reason = None, "failed", reason
        with self._settled:
            self._settled.notify_all()
        log.error("model unavailable: %s", reason)

    def describe(self) -> dict[str, Any]:
        """What health endpoints and cold-start logs say of the model: what is loaded,
        where and how fast, or why nothing is."""
        engine = self.engine
        if engine is None:
            return {"reason": self.reason}
        probe = engine.probe
        return {
            "model": engine.model_name,
            "manifest_digest": engine.digest,
            "execution_provider": probe.provider,
            "skipped_providers": probe.skipped,
            "threads": probe.threads,
            "load_seconds": round(probe.load_seconds, 3),
            "warmup_seconds": None if self.warmup_s is None else round(self.warmup_s, 3),
            "quality": quality.model_dump() if (quality := engine.manifest.quality) else None,
            "architecture_warning": arch_mismatch(engine.manifest, platform.machine()),
        }

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
        """
        deadline = time.monotonic() + wait_s
        with self._settled:
            while self.service is None and self.status == "loading" and self._loading:
                if cancelled is not None and cancelled.is_set():
                    raise ClientClosedError("the client closed the request while the model loaded")
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._settled.wait(left if cancelled is None else min(left, _CANCEL_POLL_S))
        service = self.service
        if service is None:
            error = ModelUnavailableError(
                f"the model is not ready ({self.status}: {self.reason or 'no reason given'})"
            )
            error.retryable = self.status != "failed"  # a failed load will not come back
            raise error
        return service
