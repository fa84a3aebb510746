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

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelUnavailableError(OrtServeError):
    """The model is not loaded: still loading (`retryable`), or it failed to load."""

    status = 503
    code = "model_unavailable"
    retryable = True


class ModelIntegrityError(ModelUnavailableError):
    """A baked model folder is incomplete, truncated or tampered with."""

    code = "model_integrity"


class ModelLoadError(ModelUnavailableError):
    """A baked model folder that is whole but cannot run: onnxruntime refuses its graph,
    its tokenizer does not load, or it is not the kind of model asked for."""

    code = "model_load_failed"
    retryable = False


class EngineFaultError(ModelUnavailableError):
    """The engine process ended (a signal, the memory ceiling) while this request was in
    it, or is restarting after that: retry (the parent restarts it)."""

    code = "engine_restarting"


class ProviderUnavailableError(ModelUnavailableError):
    """None of the allowed execution providers could load the model.

    Attributes:
        skipped: Why each provider was skipped, by provider name.
    """

    code = "provider_unavailable"

    def __init__(self, message: str, skipped: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.skipped = dict(skipped or {})


class BusyError(OrtServeError):
    """Too many requests are waiting; retry after `retry_after_s` seconds."""

    status = 503
    code = "busy"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class AuthenticationError(OrtServeError):
    """A missing or wrong API key."""

    status = 401
    code = "invalid_api_key"


class PermissionDeniedError(OrtServeError):
    """A valid key that may not do this (an API key where an admin key is needed)."""

    status = 403
    code = "permission_denied"


class NotFoundError(OrtServeError):
    """No such route or model."""

    status = 404
    code = "not_found"


class ModelNotFoundError(NotFoundError):
    """A request names a model this server does not serve."""

    code = "model_not_found"


class ConflictError(OrtServeError):
    """The request cannot be done in the server's present state (an adapter in use)."""

    status = 409
    code = "conflict"


class MethodNotAllowedError(OrtServeError):
    """The route exists but not for this method."""

    status = 405
    code = "method_not_allowed"

    def __init__(self, message: str, allowed: tuple[str, ...]) -> None:
        super().__init__(message)
        self.allowed = allowed


class PayloadTooLargeError(OrtServeError):
    """The request body is larger than the configured limit."""

    status = 413
    code = "payload_too_large"


class DrainingError(OrtServeError):
    """The process is shutting down and takes no new generations."""

    status = 503
    code = "shutting_down"


class RequestTimeoutError(OrtServeError):
    """A generation ran past the request timeout."""

    status = 504
    code = "timeout"


class GenerationError(OrtServeError):
    """The engine failed while generating (a native error, translated)."""

    status = 500
    code = "generation_failed"


class ClientClosedError(OrtServeError):
    """The client went away before its answer was ready (nginx's 499): the request is
    recorded with this status, and nothing is sent (there is no one to send it to)."""

    status = 499
    code = "client_closed_request"


def first_line(exc: BaseException) -> str:
    """The first line of `exc`'s message (native errors carry whole stacks), or its type's
    name when it has none: what an error message may repeat of it."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
