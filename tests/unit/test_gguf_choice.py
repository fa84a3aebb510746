"""Which bakes of a GGUF source import its weights exactly (bake.pipeline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortserve.bake.errors import BakeError
from ortserve.bake.pipeline import BakeRequest, _exact_import
from ortserve.bake.sources import ResolvedSource


def _source(gguf: Path | None) -> ResolvedSource:
    return ResolvedSource("x", "gguf", Path("/nowhere"), "hf", "m", gguf=gguf)


def test_an_int4_bake_of_a_gguf_imports_it_unless_asked_to_requantize() -> None:
    gguf = Path("m.Q4_1.gguf")
    assert _exact_import(_source(gguf), BakeRequest("x", "edge-x86_64"), "int4")
    requantize = BakeRequest("x", "edge-x86_64", requantize=True)
    assert not _exact_import(_source(gguf), requantize, "int4")
    # Another precision quantizes (or keeps) the dequantized weights; a checkpoint has no
    # GGUF to import.
    assert not _exact_import(_source(gguf), BakeRequest("x", "edge-x86_64"), "int8")
    assert not _exact_import(_source(None), BakeRequest("x", "edge-x86_64"), "int4")
    # With --requantize a recipe applies.
    with_recipe = BakeRequest("x", "edge-x86_64", recipe="int8", requantize=True)
    assert not _exact_import(_source(gguf), with_recipe, "int4")


def test_a_recipe_without_requantize_is_refused_in_one_line() -> None:
    request = BakeRequest("x", "edge-x86_64", recipe="int8")
    with pytest.raises(BakeError, match="add --requantize"):
        _exact_import(_source(Path("m.gguf")), request, "int4")
