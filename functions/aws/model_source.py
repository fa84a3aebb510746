"""A baked model folder from `s3://bucket/prefix`, downloaded once per execution environment.

Only the files the manifest lists are fetched (s3:GetObject is enough; no listing), into a
private temporary folder that is hash-checked against the manifest and then renamed into
place. A file lock makes concurrent cold starts in one environment (threads or processes)
download once; a later start finds the verified folder and reuses it.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from ortserve.core.errors import ModelIntegrityError
from ortserve.core.manifest import (
    MANIFEST_NAME,
    Manifest,
    manifest_digest,
    read_manifest,
    verify_folder,
)
from ortserve.core.s3uri import parse_s3_uri
from ortserve.functions.aws.errors import SetupError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_MB = 1024 * 1024


@dataclass(frozen=True)
class FetchedModel:
    """Where the model is and what getting it cost.

    Attributes:
        folder: The verified model folder.
        downloaded_bytes: Bytes downloaded now (0 when an earlier start had done it).
        seconds: Wall time of download and verification.
    """

    folder: Path
    downloaded_bytes: int
    seconds: float


def _bucket_and_prefix(uri: str) -> tuple[str, str]:
    try:
        return parse_s3_uri(uri)
    except ValueError as exc:
        raise SetupError(str(exc)) from None


def local_folder(uri: str, cache_dir: Path) -> Path:
    """The folder an S3 model is kept in: one per URI, so a changed setting downloads anew."""
    return cache_dir / hashlib.sha256(uri.encode()).hexdigest()[:16]


@contextmanager
def _locked(cache_dir: Path) -> Iterator[None]:
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        yield


def _key(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix else rel


def _safe_path(root: Path, rel: str) -> Path:
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or ".." in parts:
        raise SetupError(f"the manifest lists an unsafe path {rel!r}: refusing to write it")
    return root.joinpath(*parts)


def s3_client() -> S3Client:
    """A boto3 S3 client (boto3 is imported here, only when an S3 model is configured)."""
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        return boto3.client("s3")
    except BotoCoreError as exc:  # e.g. no region: only on a misconfigured machine
        raise SetupError(f"cannot create an S3 client: {exc}") from exc


def _download(client: S3Client, bucket: str, key: str, dest: Path) -> None:
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    where = f"s3://{bucket}/{key}"
    try:
        client.download_file(bucket, key, str(dest))
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", "error"))
        if code in {"404", "NoSuchKey", "NotFound"}:
            raise SetupError(f"{where} does not exist (the model folder is incomplete)") from exc
        if code in {"403", "AccessDenied"}:
            # Without s3:ListBucket, S3 answers 403 for a missing object too.
            raise SetupError(
                f"access denied to {where}: does the function's role allow s3:GetObject on it "
                "(and does the object exist)?"
            ) from exc
        raise SetupError(f"cannot download {where}: {code}") from exc
    except (BotoCoreError, Boto3Error) as exc:
        raise SetupError(f"cannot download {where}: {exc}") from exc
    except OSError as exc:  # /tmp full or unwritable
        raise SetupError(f"cannot write {dest.name} for {where}: {exc.strerror or exc}") from exc


def _check_space(folder: Path, manifest: Manifest) -> None:
    need = sum(f.size for f in manifest.files)
    free = shutil.disk_usage(folder).free
    if need > free:
        raise SetupError(
            f"the model needs {need / _MB:.0f} MB in {folder.parent} but {free / _MB:.0f} MB are "
            "free: raise the function's EphemeralStorage"
        )


def _fetch_into(
    client: S3Client, bucket: str, prefix: str, staging: Path, expected_digest: str | None
) -> int:
    """Download manifest and files into `staging` and verify every byte; the bytes fetched."""
    _download(client, bucket, _key(prefix, MANIFEST_NAME), staging / MANIFEST_NAME)
    try:
        manifest = read_manifest(staging)
    except ModelIntegrityError as exc:
        raise SetupError(f"s3://{bucket}/{_key(prefix, MANIFEST_NAME)}: {exc.message}") from exc
    if expected_digest is not None and manifest_digest(staging) != expected_digest:
        raise SetupError(
            f"s3://{bucket}/{_key(prefix, MANIFEST_NAME)} is not the pinned model: its sha256 "
            "differs from ORTSERVE_MODEL_SHA256"
        )
    _check_space(staging, manifest)
    for entry in manifest.files:
        dest = _safe_path(staging, entry.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        _download(client, bucket, _key(prefix, entry.path), dest)
    try:
        verify_folder(staging, full_hash=True)
    except ModelIntegrityError as exc:
        raise SetupError(f"the model at s3://{bucket}/{prefix}: {exc.message}") from exc
    return sum(f.size for f in manifest.files) + (staging / MANIFEST_NAME).stat().st_size


def _reusable(folder: Path, expected_digest: str | None) -> bool:
    # It was hashed before it was renamed into place, in this environment's private /tmp:
    # sizes (and the pin) are enough now.
    try:
        verify_folder(folder)
    except ModelIntegrityError:
        return False
    return expected_digest is None or manifest_digest(folder) == expected_digest


def fetch_model(
    uri: str, cache_dir: Path, expected_digest: str | None = None, client: S3Client | None = None
) -> FetchedModel:
    """Make the baked model at `uri` available under `cache_dir`, downloading it at most once.

    Raises:
        SetupError: A URI without a bucket, a missing or unreadable object, a file that
            fails the manifest check, a manifest that is not the pinned one, or too little
            space in /tmp.
    """
    start = time.perf_counter()
    bucket, prefix = _bucket_and_prefix(uri)
    final = local_folder(uri, cache_dir)
    try:
        with _locked(cache_dir):
            if final.is_dir():
                if _reusable(final, expected_digest):
                    return FetchedModel(final, 0, time.perf_counter() - start)
                shutil.rmtree(final, ignore_errors=True)
            staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=cache_dir))
            try:
                size = _fetch_into(client or s3_client(), bucket, prefix, staging, expected_digest)
                staging.rename(final)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:  # the cache folder itself cannot be made or locked
        raise SetupError(f"cannot keep the model in {cache_dir}: {exc.strerror or exc}") from exc
    return FetchedModel(final, size, time.perf_counter() - start)


def remote_model_bytes(uri: str, client: S3Client | None = None) -> int | None:
    """The model's size from its manifest in S3 (one small GET), or None if unreadable."""
    from botocore.exceptions import BotoCoreError, ClientError
    from pydantic import ValidationError

    try:
        bucket, prefix = _bucket_and_prefix(uri)
        s3 = client or s3_client()
        data = s3.get_object(Bucket=bucket, Key=_key(prefix, MANIFEST_NAME))["Body"].read()
        return sum(f.size for f in Manifest.model_validate_json(data).files)
    except (ClientError, BotoCoreError, ValidationError, SetupError):
        return None
