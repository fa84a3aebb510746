"""ortserve.core.memory: freed large buffers go back to the system at once (glibc)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_CHILD = """
import sys
import numpy as np
from ortserve.core.memory import return_freed_memory
if sys.argv[1] == "fixed":
    assert return_freed_memory()
def rss():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmRSS"))
# Freeing a 30 MiB block raises glibc's dynamic threshold to 30 MiB: a 24 MiB block then
# comes from the heap, which keeps it when freed (a KV cache after a long prompt).
big = np.ones(30 << 20, dtype=np.uint8)
del big
before = rss()
block = np.ones(24 << 20, dtype=np.uint8)
held = rss() - before
del block
print(held, rss() - before)
"""


def _held_and_kept_kib(mode: str) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return int(out[0]), int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_large_buffer_leaves_the_rss() -> None:
    held, kept = _held_and_kept_kib("fixed")
    assert held > 20 << 10  # the block was really there
    assert kept < 4 << 10  # and is gone once freed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_without_it_glibc_keeps_the_block() -> None:
    """What core.memory works around (glibc 2.36 here): the heap keeps the freed block."""
    held, kept = _held_and_kept_kib("default")
    assert held > 20 << 10
    assert kept > 20 << 10
