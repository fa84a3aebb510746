"""The cold start both Lambda images share: the API keys and the model, ready to load.

API keys come from the settings plus Secrets Manager or SSM (none at all is refused
unless `allow_unauthenticated` says so); the model from the image, or from S3 into /tmp.
The buffered image (`functions.aws.runtime`) runs this in the init phase or in the first
invoke, and again after a failure; the streaming image (`ortserve.functions.aws.serve`) runs it
before the edge daemon starts and exits on a failure. A failure is logged the same way
by both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ortserve.core.logs import JsonLog
from ortserve.functions.aws.errors import SetupError
from ortserve.functions.aws.model_source import fetch_model, local_folder
from ortserve.functions.aws.secrets import resolve_api_keys
from ortserve.functions.aws.settings import LambdaSettings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

S = TypeVar("S", bound=LambdaSettings)

_MB = 1024 * 1024
NO_KEYS = (
    "no API key is configured: set ApiKeysSecretArn or ApiKeysParameterName "
    "(ORTSERVE_API_KEYS_SECRET_ID, ORTSERVE_API_KEYS_SSM_PARAMETER or ORTSERVE_API_KEYS), "
    "or AllowUnauthenticated=true (ORTSERVE_ALLOW_UNAUTHENTICATED=true) to serve without "
    "authentication"
)


def model_settings(settings: S) -> S:
    """`settings` with the folder the model loads from: the image's, or the one an S3
    model is downloaded into (which exists once `cold_start` has run)."""
    if not settings.model_s3_uri:
        return settings
    folder = local_folder(settings.model_s3_uri, settings.model_cache_dir)
    return settings.model_copy(update={"model_dir": folder})


@dataclass(frozen=True)
class ColdStart(Generic[S]):
    """What the cold start resolved.

    Attributes:
        settings: The settings with every API key and the model's local folder.
        figures: `download_s` and `downloaded_mb` when the model came from S3.
    """

    settings: S
    figures: dict[str, Any]


def cold_start(settings: S, log: JsonLog, s3: Callable[[], S3Client] | None = None) -> ColdStart[S]:
    """Resolve the API keys and make the model folder available (downloading it from S3
    when `model_s3_uri` is set); the model itself is not loaded here.

    Args:
        settings: The process's settings.
        log: Where a failure is logged (`cold start failed` and the reason).
        s3: Makes the S3 client, when the caller keeps one; else one is made if needed.

    Raises:
        SetupError: A key source or the model cannot be read, or there is no key and
            `allow_unauthenticated` is off (already logged).
    """
    try:
        keys = resolve_api_keys(settings)
        if not keys and not settings.allow_unauthenticated:
            raise SetupError(NO_KEYS)
        figures: dict[str, Any] = {}
        if settings.model_s3_uri:
            fetched = fetch_model(
                settings.model_s3_uri,
                settings.model_cache_dir,
                settings.model_sha256,
                s3() if s3 is not None else None,
            )
            figures.update(
                download_s=round(fetched.seconds, 3),
                downloaded_mb=round(fetched.downloaded_bytes / _MB, 1),
            )
    except SetupError as exc:
        log.write("ERROR", "cold start failed", reason=exc.message)
        raise
    ready = model_settings(settings).model_copy(update={"api_keys": keys})
    return ColdStart(ready, figures)
