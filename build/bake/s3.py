"""Download a model folder from an s3://bucket/prefix URI with boto3."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from ortserve.bake.errors import BakeError
from ortserve.core.s3uri import parse_s3_uri


def download_prefix(uri: str, dest: Path) -> Path:
    """Download every object under the URI's prefix into `dest`, keeping relative paths.

    Raises:
        BakeError: No bucket in the URI, no credentials, no such bucket, no objects, or a
            transfer failure.
    """
    try:
        bucket, prefix = parse_s3_uri(uri)
    except ValueError as exc:
        raise BakeError(str(exc)) from None
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    base = f"{prefix}/" if prefix else ""
    client = boto3.client("s3")
    count = 0
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                rel = PurePosixPath(key[len(base) :])
                if not rel.parts or key.endswith("/") or ".." in rel.parts:
                    continue
                target = dest.joinpath(*rel.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, key, str(target))
                count += 1
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise BakeError(
            f"cannot read {uri}: {error.get('Code', 'error')}: {error.get('Message', exc)}"
        ) from exc
    except BotoCoreError as exc:
        raise BakeError(f"cannot read {uri}: {exc}") from exc
    if count == 0:
        raise BakeError(f"{uri} holds no objects")
    return dest
