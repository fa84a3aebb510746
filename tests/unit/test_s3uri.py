"""`core.s3uri.parse_s3_uri`, the one split of an s3:// URI (the bake and the Lambda adapter)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortserve.bake.errors import BakeError
from ortserve.bake.s3 import download_prefix
from ortserve.core.s3uri import parse_s3_uri
from ortserve.functions.aws.errors import SetupError
from ortserve.functions.aws.model_source import fetch_model, remote_model_bytes


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket/models/tiny", ("bucket", "models/tiny")),
        ("s3://bucket/models/tiny/", ("bucket", "models/tiny")),
        ("s3://bucket//models/tiny//", ("bucket", "models/tiny")),
        ("s3://bucket", ("bucket", "")),
        ("s3://bucket/", ("bucket", "")),
    ],
)
def test_splits_bucket_and_prefix_without_slashes_around_the_prefix(
    uri: str, expected: tuple[str, str]
) -> None:
    assert parse_s3_uri(uri) == expected


@pytest.mark.parametrize("uri", ["s3://", "s3:///models/tiny"])
def test_a_uri_without_a_bucket_is_refused(uri: str) -> None:
    with pytest.raises(ValueError, match=r"has no bucket name \(use s3://bucket/prefix\)"):
        parse_s3_uri(uri)


def test_each_caller_says_it_in_its_own_error(tmp_path: Path) -> None:
    """No network: the URI is refused before any client is made."""
    message = "s3:///m has no bucket name (use s3://bucket/prefix)"
    with pytest.raises(BakeError) as bake:
        download_prefix("s3:///m", tmp_path / "bake")
    assert str(bake.value) == message
    with pytest.raises(SetupError) as lam:
        fetch_model("s3:///m", tmp_path / "lambda")
    assert lam.value.message == message
    assert remote_model_bytes("s3:///m") is None
