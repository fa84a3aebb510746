"""What the front's commands share (ortserve.cli and ortserve.cli_bake): the help
formatter, argument types, the sampling flags, shell completion of a model's name, sizes
for people."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the CLI starts without core
    from ortserve.core.generation import SamplingOptions

# What a sampling flag left out means (the engine fills it: core.generation).
MODEL_DEFAULT = "default: the model's, as `ortserve show` states it"


def sampling_options(args: argparse.Namespace, max_new_tokens: int) -> SamplingOptions:
    """The sampling flags of `generate` or `run` (`run` has temperature and seed alone);
    one left out is None: the model's default."""
    from ortserve.core.generation import SamplingOptions

    return SamplingOptions(
        max_new_tokens=max_new_tokens,
        temperature=args.temperature,
        top_p=getattr(args, "top_p", None),
        top_k=getattr(args, "top_k", None),
        repetition_penalty=getattr(args, "repetition_penalty", None),
        seed=args.seed,
    )


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows each option's default where it has a real one (not None, an empty
    list or a flag's) and its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unset = default is None or default == [] or isinstance(default, bool)
        if "default" in text or unset or default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int of at least `minimum`, else a one-line usage error."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


# Shell completion of a stored model's name (`ortserve list -q`), as shtab's `complete`
# attribute of an argument; MODEL_OR_FOLDER also offers folders (`serve --model-dir`).
_COMPLETION_FUNCTIONS = {
    "bash": """
_ortserve_stored_models() { compgen -W "$(ortserve list -q 2>/dev/null)" -- "$1"; }
_ortserve_models_or_dirs() { _ortserve_stored_models "$1"; compgen -d -- "$1"; }
""",
    "zsh": """
_ortserve_stored_models() {
  local -a names; names=(${(f)"$(ortserve list -q 2>/dev/null)"})
  compadd -a names
}
_ortserve_models_or_dirs() { _ortserve_stored_models; _files -/ }
""",
}
STORED_MODEL = {
    "bash": "_ortserve_stored_models",
    "zsh": "_ortserve_stored_models",
    "preamble": _COMPLETION_FUNCTIONS,
}
MODEL_OR_FOLDER = {
    "bash": "_ortserve_models_or_dirs",
    "zsh": "_ortserve_models_or_dirs",
    "preamble": _COMPLETION_FUNCTIONS,
}


def human_size(size: int) -> str:
    """Bytes for people, in SI units as `ortserve list` and `prune` show them: 340 kB,
    117 MB, 1.2 GB."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 999.5 or unit == "GB":
            break
        value /= 1000
    return f"{value:.0f} {unit}" if value >= 9.95 or unit == "B" else f"{value:.1f} {unit}"
