"""Lambda settings, the init-time load rule and the API-key format (no model, no AWS)."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from ortserve.core.settings import ServerSettings
from ortserve.functions.aws.errors import SetupError
from ortserve.functions.aws.runtime import plan_load
from ortserve.functions.aws.secrets import parse_keys
from ortserve.functions.aws.settings import BUNDLE_ROOT, LambdaSettings, function_threads

MB = 1024 * 1024


@pytest.mark.parametrize(
    ("memory_mb", "visible", "threads"),
    [
        (128, 2, 1),
        (1769, 2, 1),
        (1770, 2, 2),
        (3008, 2, 2),
        (5307, 3, 3),
        (10240, 6, 6),
        (10240, 2, 2),
    ],
)
def test_threads_follow_the_functions_cpu_share(memory_mb: int, visible: int, threads: int) -> None:
    assert function_threads(memory_mb, visible) == threads


def test_settings_read_lambda_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024")
    monkeypatch.setenv("AWS_LAMBDA_INITIALIZATION_TYPE", "provisioned-concurrency")
    monkeypatch.setenv("ORTSERVE_LAMBDA_LOAD_AT_INIT", "never")
    monkeypatch.setenv("ORTSERVE_API_KEYS_SECRET_ID", "ortserve/keys")
    settings = LambdaSettings()
    assert settings.threads == 1
    assert settings.initialization_type == "provisioned-concurrency"
    assert settings.lambda_load_at_init == "never"
    assert settings.api_keys_secret_id == "ortserve/keys"
    assert settings.model_dir == BUNDLE_ROOT / "model"
    monkeypatch.setenv("ORTSERVE_THREADS", "4")
    assert LambdaSettings().threads == 4  # an explicit setting wins


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ORTSERVE_LAMBDA_LOAD_AT_INIT", "sometimes"),
        ("ORTSERVE_MODEL_S3_URI", "https://x/y"),
        ("ORTSERVE_MODEL_SHA256", "abc"),
        ("ORTSERVE_LAMBDA_MAX_RESPONSE_BYTES", "7000000"),
    ],
)
def test_invalid_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        LambdaSettings()


def _plan(**kw: object) -> tuple[bool, str]:
    args: dict[str, object] = {
        "mode": "auto",
        "initialization_type": "on-demand",
        "model_bytes": 100 * MB,
        "read_passes": 1,
        "mb_per_s": 80.0,
        "budget_s": 8.0,
        "elapsed_s": 0.5,
        **kw,
    }
    return plan_load(**args)  # type: ignore[arg-type]


def test_a_model_that_fits_loads_at_init() -> None:
    at_init, why = _plan()
    assert at_init and "within the 8 s budget" in why


def test_a_model_too_large_for_on_demand_init_loads_on_the_first_invoke() -> None:
    at_init, why = _plan(model_bytes=700 * MB)
    assert not at_init and "over the 8 s budget" in why
    # The same model fetched from S3 is read three times (download, hash, load).
    assert not _plan(model_bytes=250 * MB, read_passes=3)[0]


def test_long_inits_and_operator_choices() -> None:
    assert _plan(model_bytes=5000 * MB, initialization_type="provisioned-concurrency")[0]
    assert _plan(model_bytes=5000 * MB, initialization_type="snap-start")[0]
    assert _plan(model_bytes=5000 * MB, mode="always")[0]
    assert not _plan(model_bytes=1, mode="never")[0]
    assert _plan(model_bytes=None)[0]  # unknown: fail (or succeed) early


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ('["k1", "k2"]', ["k1", "k2"]),
        ("k1, k2,,", ["k1", "k2"]),
        ('"k1"', ["k1"]),
        (" k1 ", ["k1"]),
        ('["k1", "k1"]', ["k1", "k1"]),
    ],
)
def test_key_formats(text: str, keys: list[str]) -> None:
    assert parse_keys(text, "secret s") == keys


@pytest.mark.parametrize("text", ["", " , ", "[]", '{"a": 1}', "[1]", "[not json"])
def test_empty_or_malformed_keys_are_refused(text: str) -> None:
    with pytest.raises(SetupError) as info:
        parse_keys(text, "secret s")
    assert info.value.message.startswith("secret s")


def test_no_request_batching_on_lambda_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # One request per execution environment at a time: nothing to batch with.
    for name in [k for k in os.environ if k.startswith("ORTSERVE_")]:
        monkeypatch.delenv(name)
    assert LambdaSettings().max_batch == 1
    assert ServerSettings().max_batch == 4
    monkeypatch.setenv("ORTSERVE_MAX_BATCH", "2")
    assert LambdaSettings().max_batch == 2
