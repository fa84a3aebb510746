"""Errors of the Lambda adapter: a cold start that cannot finish, a response too large to send."""

from __future__ import annotations

from ortserve.core.errors import OrtServeError


class SetupError(Exception):
    """The cold start cannot complete (model download, manifest check, API keys).

    The message is safe to show in `/readyz` and logs: it never holds a secret.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ResponseTooLargeError(OrtServeError):
    """The answer is larger than a buffered Lambda response may be (6 MB)."""

    status = 413
    code = "response_too_large"
