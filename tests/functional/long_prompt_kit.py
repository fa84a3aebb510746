"""Helpers for the long-prompt tests (test_long_prompts.py, test_long_prompt_slots.py,
test_long_prompt_memory.py): prompts of a given length for the 135M shape, and the
process's memory from /proc."""

from __future__ import annotations

MIB = 1 << 20
# The 135M shape (SmolLM2: 30 layers, 3 KV heads of 64): fp32 keys and values a token.
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4


def long_prompt(tokens: int) -> str:
    """About `tokens` tokens of text (" edge" is four tokens in this shape's vocabulary)."""
    return " ".join(["edge"] * (tokens // 4))


def status_mib(pid: int, key: str) -> float:
    """A size from /proc/PID/status (VmRSS, VmHWM), in MiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith(f"{key}:"))
    return int(line.split()[1]) / 1024


def reset_peak(pid: int) -> None:
    """Start VmHWM afresh from the current RSS (Linux 4.0+: clear_refs 5)."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as refs:
        refs.write("5")
