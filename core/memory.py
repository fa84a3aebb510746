"""Freed memory goes back to the system (glibc), so a process's RSS follows what it holds.

glibc's malloc serves a request of 128 KiB or more with its own mmap, which free returns
to the system at once, but it raises that threshold to the size of each such block freed
(up to 32 MiB). A server soon allocates its KV caches (a few MiB a layer) from the heap
then, and the heap keeps freed memory: after one 7,000-token prompt on the 135M shape the
process stayed 330 MiB larger with nothing held (malloc_trim gave it back). Fixing the
threshold at 1 MiB keeps large buffers (KV caches, a prefill part's activations and
logits) on mmap, and leaves small ones to the heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
MMAP_THRESHOLD = 1 << 20


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold at `MMAP_THRESHOLD` for this process (once, at load);
    False where the C library is not glibc (musl, macOS, Windows) and nothing changed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
