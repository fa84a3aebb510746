"""One Lambda execution environment: its cold start, then one invoke after another.

The cold start (API keys from Secrets Manager or SSM, the model from S3 or the image,
then the model load) runs once. It runs in the init phase when it fits the init budget:
on-demand init is cut at 10 s and then redone inside the first invoke, so a load that
would not fit is better started in the first invoke right away. Whatever fails (a
tampered S3 file, a missing secret) leaves the function up, answering 503 with the
reason, and a later invoke tries again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortserve.core.api import Api
from ortserve.core.cpu import usable_cpus
from ortserve.core.errors import InvalidRequestError, OrtServeError
from ortserve.core.http import Request
from ortserve.core.logs import JsonLog
from ortserve.core.manifest import read_manifest
from ortserve.core.routes import WITHOUT_MODEL, error_shape
from ortserve.core.state import ModelState
from ortserve.functions.aws.buffer import buffered_result, error_result
from ortserve.functions.aws.coldstart import cold_start, model_settings
from ortserve.functions.aws.errors import SetupError
from ortserve.functions.aws.events import EventError, HttpEvent, Version, parse_event
from ortserve.functions.aws.model_source import remote_model_bytes, s3_client
from ortserve.functions.aws.settings import LambdaSettings, LoadAtInit

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger("ortserve.lambda")

_MB = 1024 * 1024
# Init types whose init phase may run for minutes instead of 10 s.
LONG_INIT_TYPES = frozenset({"provisioned-concurrency", "snap-start"})


def plan_load(
    mode: LoadAtInit,
    initialization_type: str | None,
    model_bytes: int | None,
    read_passes: int,
    mb_per_s: float,
    budget_s: float,
    elapsed_s: float,
) -> tuple[bool, str]:
    """Whether to load the model during init, and why (for the cold-start log).

    Args:
        mode: The operator's choice (`auto` decides by the estimate).
        initialization_type: `AWS_LAMBDA_INITIALIZATION_TYPE`.
        model_bytes: Bytes of the model files, or None when unknown.
        read_passes: How often each byte is read (download, hash, load).
        mb_per_s: The assumed read rate.
        budget_s: The part of init the load may use.
        elapsed_s: Init time already spent (runtime start, imports).
    """
    if mode != "auto":
        return mode == "always", f"ORTSERVE_LAMBDA_LOAD_AT_INIT={mode}"
    if initialization_type in LONG_INIT_TYPES:
        return True, f"{initialization_type} init is not cut at 10 s"
    if model_bytes is None:
        return True, "model size unknown: loading now, so that an error shows at init"
    estimate = elapsed_s + model_bytes * read_passes / (mb_per_s * _MB)
    fits = estimate <= budget_s
    return fits, (
        f"estimated init {estimate:.1f} s ({model_bytes / _MB:.1f} MB read {read_passes}x at "
        f"{mb_per_s:g} MB/s) is {'within' if fits else 'over'} the {budget_s:g} s budget"
    )


def _process_age_s() -> float | None:
    """Seconds since this process started (Linux), to put import time in the figures."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class LambdaApp:
    """The API in one execution environment, answering API Gateway and Function URL events.

    Attributes:
        settings: The function's settings.
        state: The model's state (loading, ready, failed).
        api: The core API (rebuilt once the API keys are known).
    """

    def __init__(self, settings: LambdaSettings) -> None:
        self.settings = settings
        self._created = time.perf_counter()
        # One JSON object per line: CloudWatch Logs Insights parses each line's fields.
        self._log = JsonLog(context=self._context)
        self.state = ModelState(model_settings(settings))
        self.api = Api(self.state, settings, on_record=self._log.record)
        self._api_keys = settings.api_keys
        self._lock = threading.Lock()
        self._failed_at: float | None = None
        self._figures: dict[str, Any] = {}
        self._logged_cold_start = False
        self._aws_request_id: str | None = None
        self._s3_client: S3Client | None = None

    # -- cold start -------------------------------------------------------------------

    def _s3(self) -> S3Client:
        """One S3 client for the environment, made when first needed (a client costs tens
        of ms to make, and the cold start may need it twice: size estimate, download)."""
        if self._s3_client is None:
            self._s3_client = s3_client()
        return self._s3_client

    def _model_bytes(self) -> tuple[int | None, int]:
        """The model's size and how often init would read each byte."""
        settings = self.settings
        if settings.model_s3_uri:
            folder = self.state.settings.model_dir
            if folder.is_dir():  # downloaded by an earlier start in this environment
                return self._local_bytes(folder), 1
            passes = 3  # download, hash, load
            try:
                return remote_model_bytes(settings.model_s3_uri, self._s3()), passes
            except SetupError:  # no client: the setup will say why
                return None, passes
        return self._local_bytes(settings.model_dir), 2 if settings.verify_sha256 else 1

    @staticmethod
    def _local_bytes(folder: Path) -> int | None:
        try:
            return sum(f.size for f in read_manifest(folder).files)
        except OrtServeError:
            return None

    def cold_start(self) -> None:
        """Run during Lambda's init phase: set up now if it fits the init budget, else defer."""
        settings = self.settings
        model_bytes, passes = (
            self._model_bytes() if settings.lambda_load_at_init == "auto" else (None, 1)
        )
        # On Lambda the process starts with the init phase: its age is init time spent.
        age = _process_age_s() if settings.initialization_type else None
        at_init, why = plan_load(
            settings.lambda_load_at_init,
            settings.initialization_type,
            model_bytes,
            passes,
            settings.lambda_read_mb_per_s,
            settings.lambda_init_budget_s,
            age if age is not None else time.perf_counter() - self._created,
        )
        self._figures.update(load_phase="init" if at_init else "first_invoke", load_plan=why)
        if at_init:
            self._setup_if_due()
        elif settings.warmup and "warmup" not in settings.model_fields_set:
            # The first invoke loads the model, then answers: a warm-up generation there
            # would only delay that answer (the request pays the first inference's costs
            # itself). A big model's warm-up is seconds (Llama-3.2-3B: 3 s at 2 threads).
            self.state.settings = self.state.settings.model_copy(update={"warmup": False})
            self._figures["warmup"] = "skipped: the load is on the first invoke"
        self._figures["init_s"] = round(time.perf_counter() - self._created, 3)
        end_age = _process_age_s()
        if age is not None and end_age is not None:
            self._figures["process_age_at_init_end_s"] = round(end_age, 3)
        if at_init:
            self._log_setup()
        else:
            self._log.write("INFO", "model load deferred to the first invoke", **self._figures)

    def ensure_ready(self) -> None:
        """Finish the cold start if it has not (blocking); retry a failed one when due."""
        if self._setup_if_due():
            self._log_setup()

    def _setup_if_due(self) -> bool:
        with self._lock:
            if self.state.status == "ready":
                return False
            failed_at = self._failed_at
            if failed_at is not None and (
                time.monotonic() - failed_at < self.settings.lambda_retry_failed_s
            ):
                return False
            self._setup()
            return True

    def _setup(self) -> None:
        start = time.perf_counter()
        try:
            ready = cold_start(self.settings, self._log, self._s3)
        except SetupError as exc:  # logged by cold_start
            self.state.fail(exc.message)
            self._failed_at = time.monotonic()
            return
        if ready.settings.api_keys != self._api_keys:  # keys from Secrets Manager or SSM
            self.api = Api(self.state, ready.settings, on_record=self._log.record)
            self._api_keys = ready.settings.api_keys
        self._figures.update(ready.figures)
        self.state.load()
        self._figures["setup_s"] = round(time.perf_counter() - start, 3)
        self._failed_at = None if self.state.status == "ready" else time.monotonic()

    def _log_setup(self) -> None:
        """The cold-start figures in one line (a retry after a failure logs its own)."""
        message = "cold start retried" if self._logged_cold_start else "cold start"
        self._logged_cold_start = True
        settings, state = self.settings, self.state
        figures: dict[str, Any] = {
            "status": state.status,
            "initialization_type": settings.initialization_type,
            "model_source": settings.model_s3_uri or "image",
            "memory_mb": settings.function_memory_mb,
            "usable_cpus": usable_cpus(),
            **self._figures,
            **state.describe(),
        }
        self._log.write("INFO" if state.status == "ready" else "ERROR", message, **figures)

    # -- invokes ----------------------------------------------------------------------

    def handle(self, event: object, context: object = None) -> dict[str, Any]:
        """Answer one API Gateway (REST 1.0, HTTP 2.0) or Function URL event; never raises."""
        self._aws_request_id = getattr(context, "aws_request_id", None)
        started = time.monotonic()
        version: Version = "2.0"
        try:
            try:
                parsed = parse_event(event)
            except EventError as exc:
                version = exc.version
                self._log.write("WARNING", "not an HTTP event", reason=exc.message)
                return error_result(version, InvalidRequestError(exc.message))
            version = parsed.version
            request = replace(parsed.request, deadline=self.deadline(parsed, context, started))
            if request.path not in WITHOUT_MODEL:  # those must not wait for a lazy load
                self.ensure_ready()
            return self.answer(request, version)
        except Exception:  # never an exception out of the handler: Lambda would answer 502
            log.exception("unhandled error in the Lambda handler")
            return error_result(version, OrtServeError("internal error"))
        finally:
            self._aws_request_id = None

    def deadline(self, event: HttpEvent, context: object, started: float) -> float | None:
        """When a generation for this invoke must end (`time.monotonic()`), so that the
        client reads a timeout error: a margin before the invoke's own end and, for API
        Gateway events, before the API's limit. None without a Lambda context."""
        margin = self.settings.lambda_deadline_margin_s
        limits = []
        remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
        if callable(remaining_ms):
            limits.append(started + remaining_ms() / 1000 - margin)
        if not event.function_url:
            limits.append(started + self.settings.lambda_api_gateway_timeout_s - margin)
        return min(limits) if limits else None

    def answer(self, request: Request, version: Version) -> dict[str, Any]:
        """The buffered result of one core request, in the event shape `version`."""
        response = self.api.handle(request)
        limit = self.settings.lambda_max_response_bytes
        return buffered_result(response, version, limit, error_shape(request.path))

    def _context(self) -> dict[str, str]:
        """What each log line says of the invoke being answered (nothing outside one)."""
        aws_request_id = self._aws_request_id
        return {} if aws_request_id is None else {"aws_request_id": aws_request_id}
