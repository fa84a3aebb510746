"""ortserve's Python API: `from ortserve import TextGenerator`.

A name for users' scripts; the code lives in core (core/textgen.py).
"""

from __future__ import annotations

from core.errors import OrtServeError
from core.textgen import TextGenerator

__all__ = ["OrtServeError", "TextGenerator"]
