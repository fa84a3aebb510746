"""Settings of the Lambda target: the server's settings plus where the model and keys come from.

Lambda's own variables (`AWS_LAMBDA_*`) keep their names: a field with an alias is read
from the alias alone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, Self

from pydantic import AliasChoices, Field, model_validator

from ortserve.core.cpu import usable_cpus
from ortserve.core.settings import ServerSettings

# The bundle (or source tree) holding `ortserve/`: not resolved, so that the link
# ortserve/functions -> functions/ of a source checkout counts as the bundle does.
BUNDLE_ROOT = Path(__file__).absolute().parents[3]
# At 1,769 MB a function gets one vCPU's worth of CPU time; more memory, proportionally more.
MB_PER_VCPU = 1769
# Lambda's limit on a synchronous (buffered) response is 6 MB; leave room for the runtime.
SYNC_RESPONSE_LIMIT = 6 * 1024 * 1024

LoadAtInit = Literal["auto", "always", "never"]


def function_threads(memory_mb: int, visible_cpus: int) -> int:
    """intra-op threads for a function with `memory_mb` of memory.

    Lambda shows 2 vCPUs up to 3,008 MB and up to 6 at 10,240 MB, but grants CPU time in
    proportion to memory (one vCPU per 1,769 MB): more threads than that only contend.
    """
    return max(1, min(visible_cpus, math.ceil(memory_mb / MB_PER_VCPU)))


class LambdaSettings(ServerSettings):
    """ServerSettings for a Lambda function (buffered handler or streaming image).

    Attributes:
        model_dir: The baked model folder; defaults to `model/` beside the code
            (`/var/task/model` in the image).
        model_s3_uri: `s3://bucket/prefix` of a baked model folder to download into
            /tmp at cold start instead of using the baked-in one.
        model_sha256: The expected sha256 of the model's manifest.json (`/readyz`'s
            `manifest_digest`), to pin an S3 model to one exact bake.
        model_cache_dir: Where an S3 model is downloaded (only /tmp is writable).
        api_keys_secret_id: A Secrets Manager secret (name or ARN) whose string is a
            JSON list or a comma-separated list of API keys, added to `api_keys`.
        api_keys_ssm_parameter: An SSM parameter (SecureString, String or StringList)
            holding API keys the same way, added to `api_keys`.
        allow_unauthenticated: Serve without any API key. Off by default: with no key
            from any source the cold start fails and every invoke answers 503 with the
            reason (the template's AllowUnauthenticated parameter sets it).
        lambda_load_at_init: `always` loads the model during init, `never` on the first
            invoke, `auto` during init when the estimate fits `lambda_init_budget_s`.
        lambda_init_budget_s: The part of Lambda's 10 s on-demand init the model may use.
        lambda_read_mb_per_s: A conservative read rate of model bytes during init (image
            layers are pulled lazily on first read), for the `auto` estimate.
        lambda_max_response_bytes: Largest serialized buffered response; larger ones
            are answered with an error (streams: cut, with an error event).
        lambda_retry_failed_s: After a failed cold start (S3, keys, model), the next
            invoke at least this much later tries again.
        lambda_deadline_margin_s: A buffered generation ends this long before the invoke
            does (`context.get_remaining_time_in_millis()`), or before API Gateway's
            limit, so that the client reads a timeout error instead of Lambda's own.
        lambda_api_gateway_timeout_s: API Gateway's limit on an integration (an HTTP
            API's is 30 s at most; a REST API's 29 s by default), for API Gateway events.
        initialization_type: `AWS_LAMBDA_INITIALIZATION_TYPE` (on-demand,
            provisioned-concurrency, snap-start, ...).
        function_memory_mb: `AWS_LAMBDA_FUNCTION_MEMORY_SIZE`; sets the default thread
            count from the function's CPU share.
        max_batch: 1 (no request batching): an execution environment gets one request at
            a time, so there is never a companion to batch with.
    """

    model_dir: Path = BUNDLE_ROOT / "model"
    model_s3_uri: str | None = Field(
        default=None, pattern=r"^s3://[a-z0-9][a-z0-9.\-]{1,62}(/.*)?$"
    )
    model_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    model_cache_dir: Path = Path("/tmp/ortserve-models")  # noqa: S108 (Lambda's only writable place)
    api_keys_secret_id: str | None = None
    api_keys_ssm_parameter: str | None = None
    allow_unauthenticated: bool = False
    lambda_load_at_init: LoadAtInit = "auto"
    lambda_init_budget_s: float = Field(default=8.0, ge=0, le=900)
    lambda_read_mb_per_s: float = Field(default=80.0, gt=0)
    lambda_max_response_bytes: int = Field(
        default=SYNC_RESPONSE_LIMIT - 64 * 1024, ge=4096, le=SYNC_RESPONSE_LIMIT
    )
    lambda_retry_failed_s: float = Field(default=30.0, ge=0)
    lambda_deadline_margin_s: float = Field(default=2.0, ge=0, le=60)
    lambda_api_gateway_timeout_s: float = Field(default=30.0, gt=0, le=900)
    max_batch: int = Field(default=1, ge=1, le=64)
    initialization_type: str | None = Field(
        default=None, validation_alias=AliasChoices("AWS_LAMBDA_INITIALIZATION_TYPE")
    )
    function_memory_mb: int | None = Field(
        default=None, ge=128, validation_alias=AliasChoices("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
    )

    @model_validator(mode="after")
    def _threads_from_function_cpus(self) -> Self:
        if self.threads is None and self.function_memory_mb is not None:
            self.threads = function_threads(self.function_memory_mb, usable_cpus())
        return self
