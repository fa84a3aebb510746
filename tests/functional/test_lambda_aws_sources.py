"""Cold-start sources on AWS, with moto: the model from S3, API keys from Secrets Manager, SSM."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from ortserve.core.manifest import manifest_digest
from ortserve.functions.aws.errors import SetupError
from ortserve.functions.aws.model_source import fetch_model
from ortserve.functions.aws.runtime import LambdaApp
from tests.functional.harness import API_KEY
from tests.functional.lambda_target import LambdaTarget, lambda_app

BUCKET = "ortserve-models"
PREFIX = "tiny/int4"
URI = f"s3://{BUCKET}/{PREFIX}"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        yield


@pytest.fixture
def bucket(aws: None, tiny_model_dir: Path) -> Any:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    for path in sorted(tiny_model_dir.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), BUCKET, f"{PREFIX}/{path.relative_to(tiny_model_dir)}")
    return s3


def _s3_app(tmp_path: Path, **kw: Any) -> LambdaApp:
    # model_dir is where the baked-in model would be: empty, so only S3 can serve.
    return lambda_app(
        tmp_path / "no-baked-model", model_s3_uri=URI, model_cache_dir=tmp_path / "cache", **kw
    )


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# -- the model from S3 -------------------------------------------------------------------


def test_model_from_s3(
    bucket: Any, tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = _s3_app(tmp_path, model_sha256=manifest_digest(tiny_model_dir))
    target = LambdaTarget(app.handle)
    ready = target.call("GET", "/readyz").json()
    assert ready["status"] == "ready"
    assert ready["manifest_digest"] == manifest_digest(tiny_model_dir)
    assert target.call("POST", "/generate", {"prompt": "Hi", "max_new_tokens": 4}).status == 200
    cold = next(line for line in _lines(capsys.readouterr().out) if line["message"] == "cold start")
    assert cold["model_source"] == URI and cold["downloaded_mb"] > 0
    assert "read 3x" in cold["load_plan"]  # download, hash and load were estimated
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".partial")]
    assert leftovers == []


def test_a_tampered_file_is_refused(bucket: Any, tmp_path: Path, tiny_model_dir: Path) -> None:
    data = bytearray((tiny_model_dir / "model.onnx.data").read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the hash can tell
    bucket.put_object(Bucket=BUCKET, Key=f"{PREFIX}/model.onnx.data", Body=bytes(data))
    target = LambdaTarget(_s3_app(tmp_path).handle)
    ready = target.call("GET", "/readyz")
    assert ready.status == 503
    assert "model.onnx.data does not match its sha256" in ready.json()["reason"]
    reply = target.call("POST", "/generate", {"prompt": "x"})
    assert reply.status == 503 and reply.json()["error"]["code"] == "model_unavailable"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".lock"]  # nothing kept


def test_a_missing_object_is_named(bucket: Any, tmp_path: Path) -> None:
    bucket.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/tokenizer.json")
    ready = LambdaTarget(_s3_app(tmp_path).handle).call("GET", "/readyz")
    assert ready.status == 503
    assert ready.json()["reason"] == (
        f"s3://{BUCKET}/{PREFIX}/tokenizer.json does not exist (the model folder is incomplete)"
    )


def test_no_model_at_the_uri_and_a_wrong_pin(bucket: Any, tmp_path: Path) -> None:
    with pytest.raises(SetupError, match=r"manifest\.json does not exist"):
        fetch_model(f"s3://{BUCKET}/elsewhere", tmp_path)
    with pytest.raises(SetupError, match="not the pinned model"):
        fetch_model(URI, tmp_path, expected_digest="0" * 64)


def test_an_unusable_cache_folder_is_a_clear_error(bucket: Any, tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    with pytest.raises(SetupError, match="cannot keep the model in"):
        fetch_model(URI, blocked)


def test_an_unsafe_manifest_path_is_refused(
    bucket: Any, tmp_path: Path, tiny_model_dir: Path
) -> None:
    manifest = json.loads((tiny_model_dir / "manifest.json").read_text())
    manifest["files"][0]["path"] = "../../escape"
    bucket.put_object(Bucket=BUCKET, Key=f"{PREFIX}/manifest.json", Body=json.dumps(manifest))
    with pytest.raises(SetupError, match="unsafe path"):
        fetch_model(URI, tmp_path / "cache")
    assert not (tmp_path / "escape").exists()


class _CountingS3:
    """An S3 client that counts downloads (shared by two racing cold starts)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.downloads = 0
        self._lock = threading.Lock()

    def download_file(self, bucket: str, key: str, filename: str) -> None:
        with self._lock:
            self.downloads += 1
        self.client.download_file(bucket, key, filename)


def test_racing_cold_starts_download_once(
    bucket: Any, tmp_path: Path, tiny_model_dir: Path
) -> None:
    client = _CountingS3(bucket)
    results: list[Any] = []

    def start() -> None:
        results.append(fetch_model(URI, tmp_path, client=client))  # type: ignore[arg-type]

    threads = [threading.Thread(target=start) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    files = len(list(tiny_model_dir.iterdir()))
    assert client.downloads == files  # manifest and every file, once
    assert results[0].folder == results[1].folder
    assert sorted(r.downloaded_bytes > 0 for r in results) == [False, True]
    again = fetch_model(URI, tmp_path, client=client)  # type: ignore[arg-type]
    assert again.downloaded_bytes == 0 and client.downloads == files


# -- API keys ----------------------------------------------------------------------------


def test_keys_from_secrets_manager(aws: None, tiny_model_dir: Path) -> None:
    sm = boto3.client("secretsmanager")
    arn = sm.create_secret(Name="ortserve/api-keys", SecretString='["sm-key-1", "sm-key-2"]')["ARN"]
    app = lambda_app(tiny_model_dir, api_keys_secret_id=arn)
    target = LambdaTarget(app.handle)
    for key in ("sm-key-1", "sm-key-2", API_KEY):  # the secret's keys are added to the setting's
        assert (
            target.call("GET", "/v1/models", headers={"authorization": f"Bearer {key}"}).status
            == 200
        )
    assert target.call("GET", "/v1/models", headers={"authorization": "Bearer x"}).status == 401


def test_keys_from_ssm(aws: None, tiny_model_dir: Path) -> None:
    boto3.client("ssm").put_parameter(
        Name="/ortserve/api-keys", Value="ssm-key-1,ssm-key-2", Type="SecureString"
    )
    app = lambda_app(tiny_model_dir, api_keys=[], api_keys_ssm_parameter="/ortserve/api-keys")
    target = LambdaTarget(app.handle)
    assert (
        target.call(
            "GET", "/v1/models", headers={"authorization": "", "x-api-key": "ssm-key-2"}
        ).status
        == 200
    )
    assert target.call("GET", "/v1/models", headers={"authorization": ""}).status == 401


@pytest.mark.parametrize(
    ("secret", "reason"),
    [
        (
            None,
            "cannot read the API keys from Secrets Manager secret ortserve/keys: "
            "ResourceNotFoundException",
        ),
        ("[]", "Secrets Manager secret ortserve/keys holds no API key"),
    ],
)
def test_unusable_keys_fail_closed(
    aws: None, tiny_model_dir: Path, secret: str | None, reason: str
) -> None:
    if secret is not None:
        boto3.client("secretsmanager").create_secret(Name="ortserve/keys", SecretString=secret)
    app = lambda_app(tiny_model_dir, api_keys=[], api_keys_secret_id="ortserve/keys")
    target = LambdaTarget(app.handle)
    ready = target.call("GET", "/readyz")
    assert ready.status == 503 and ready.json()["reason"] == reason
    # Without its keys the function serves nothing, even to a caller without a key.
    for path, body in (("/v1/models", None), ("/generate", {"prompt": "x"})):
        reply = target.call("POST" if body else "GET", path, body, headers={"authorization": ""})
        assert reply.status == 503
