"""Long English text with code that ships with Python: its reference manual's topics
(`pydoc_data`), for benchmarks that need long prompts of real text."""

from __future__ import annotations

import functools

# Characters a token of the manual's text takes (Qwen2.5's tokenizer: about 4.4).
CHARS_PER_TOKEN = 4.4


@functools.cache
def manual() -> str:
    """The Python reference manual's topics, in name order."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[name] for name in sorted(topics.topics))
