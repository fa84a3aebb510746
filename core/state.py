"""The model's life in a serving process: loading, ready or failed, never a crash."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Literal

from core.errors import ModelUnavailableError, OrtServeError
from core.settings import EngineSettings

if TYPE_CHECKING:  # onnxruntime-genai is imported when a model loads, not with this module
    from core.engine import Engine
    from core.service import Service

log = logging.getLogger("ortserve")

ModelStatus = Literal["loading", "ready", "failed"]


class ModelState:
    """Holds the service once the model is loaded; health endpoints read it, requests
    wait on nothing.

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

    def start_loading(self) -> threading.Thread:
        """Load in a background thread (once); health answers "loading" meanwhile."""
        with self._loader_lock:
            if self._loader is None:
                self._loader = threading.Thread(target=self.load, name="model-load", daemon=True)
                self._loader.start()
            return self._loader

    def load(self) -> None:
        """Load the model (blocking). Sets ready or failed; never raises."""
        with self._lock:
            if self.status == "ready":
                return
            try:
                from core.service import Service

                service = Service.load(self.settings)
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
            log.info(
                "model %s ready on %s in %.2f s, %d threads; other providers skipped: %s",
                engine.model_name, probe.provider, probe.load_seconds, probe.threads,
                skipped or "none",
            )  # fmt: skip

    def fail(self, reason: str) -> None:
        """Mark the model failed without trying to load it (an adapter could not fetch it)."""
        with self._lock:
            self.service, self.status, self.reason = None, "failed", reason
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
            "quality": quality.model_dump() if (quality := engine.manifest.quality) else None,
        }

    @property
    def engine(self) -> Engine | None:
        """The loaded model, when ready."""
        return self.service.engine if self.service is not None else None

    def require(self) -> Service:
        """The service, or a 503 error that says why there is none."""
        service = self.service
        if service is None:
            error = ModelUnavailableError(
                f"the model is not ready ({self.status}: {self.reason or 'no reason given'})"
            )
            error.retryable = self.status != "failed"  # a failed load will not come back
            raise error
        return service
