"""`s3://bucket/prefix` URIs, split one way for the bake and the Lambda adapter alike.

No third-party import: the Lambda image and the bake both import it cheaply.
"""

from __future__ import annotations


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """Split `s3://bucket/prefix` into bucket and prefix (no slashes around the prefix).

    Raises:
        ValueError: The URI names no bucket.
    """
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"{uri} has no bucket name (use s3://bucket/prefix)")
    return bucket, prefix.strip("/")
