"""A GGUF conversion cut short (an error, Ctrl-C, SIGTERM) leaves no half checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortserve.bake import gguf
from ortserve.cli import Terminated


@pytest.mark.parametrize("stop", [KeyboardInterrupt, Terminated])
def test_a_conversion_cut_short_leaves_no_partial_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: type[BaseException]
) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF")
    cache = tmp_path / "cache"
    cache.mkdir()

    def cut(_: Path, out: Path, digest: str) -> None:  # stopped halfway through writing
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}", encoding="utf-8")
        raise stop

    monkeypatch.setattr(gguf, "_convert", cut)
    with pytest.raises(stop):
        gguf.checkpoint_from_gguf(source, cache)
    assert list(cache.iterdir()) == []
