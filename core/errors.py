"""The one error hierarchy of ortserve: every error carries an HTTP status and a short code."""

from __future__ import annotations


class OrtServeError(Exception):
    """Base of every error ortserve raises on purpose.

    Attributes:
        status: The HTTP status an adapter answers with.
        code: A short, stable, machine-readable code.
    """

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequestError(OrtServeError):
    """The caller asked for something invalid (a bad parameter, a prompt too long)."""

    status = 400
    code = "invalid_request"


class ModelUnavailableError(OrtServeError):
    """The model is not loaded: still loading, or it failed to load."""

    status = 503
    code = "model_unavailable"


class ModelIntegrityError(ModelUnavailableError):
    """A baked model folder is incomplete, truncated or tampered with."""

    code = "model_integrity"


class ProviderUnavailableError(ModelUnavailableError):
    """None of the allowed execution providers could load the model."""

    code = "provider_unavailable"


class BusyError(OrtServeError):
    """Too many requests are waiting; retry after `retry_after_s` seconds."""

    status = 503
    code = "busy"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class GenerationError(OrtServeError):
    """The engine failed while generating (a native error, translated)."""

    status = 500
    code = "generation_failed"
