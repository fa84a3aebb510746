"""The Lambda bake's template rewrite and requirement lock, without a bake."""

from __future__ import annotations

import pytest

from ortserve.bake.errors import BakeError
from ortserve.bake.lock import locked_lines, manylinux_tags
from ortserve.bake.package_lambda import bake_template


def test_a_template_of_another_shape_is_refused_not_half_rewritten() -> None:
    with pytest.raises(BakeError, match=r"template\.yaml changed shape"):
        bake_template("Resources: {}\n", "x86_64")


def test_the_lock_takes_each_file_hash_from_pips_report() -> None:
    item = {
        "metadata": {"name": "Typing_Extensions", "version": "4.16.0"},
        "download_info": {"archive_info": {"hashes": {"sha256": "ab" * 32}}},
    }
    assert locked_lines({"install": [item]}) == [
        f"typing-extensions==4.16.0 --hash=sha256:{'ab' * 32}"
    ]
    del item["download_info"]
    with pytest.raises(BakeError, match="no sha256 for Typing_Extensions"):
        locked_lines({"install": [item]})


def test_the_platform_tags_prefer_the_newest_glibc_as_pip_does() -> None:
    tags = manylinux_tags("aarch64", 34)
    assert tags[0] == "manylinux_2_34_aarch64" and tags[-2:] == [
        "manylinux_2_17_aarch64",
        "manylinux2014_aarch64",
    ]
