"""How a model's names compare, in the store and in the API: in any case, and with or
without Ollama's default tag `:latest` (`SmolLM2:latest` names `smollm2`)."""

from __future__ import annotations

LATEST = ":latest"


def name_key(name: str) -> str:
    """`name` as names are compared: trimmed, lower case, without a `:latest` tag."""
    key = name.strip().lower()
    return key.removesuffix(LATEST) if key != LATEST else key


def same_name(given: str, name: str) -> bool:
    """Whether `given` names `name` (see the module's rule)."""
    return name_key(given) == name_key(name)
