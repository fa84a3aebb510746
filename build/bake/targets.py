"""Per-target bake defaults: the builder's execution provider and options, and session options.

Defaults were chosen by measurement on a 2-core x86_64 machine (see README, "Bake
defaults"): int4 with block_size 128 decodes faster and prefills about 2x faster than
the builder's default of 32 on CPU, and intra_op_num_threads must be set (left at its
default, onnxruntime-genai ran one thread).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bake.errors import BakeError

PRECISIONS = ("int4", "int8", "fp16", "fp32")


@dataclass(frozen=True)
class Target:
    """What a bake for one deployment target needs.

    Attributes:
        name: The target's name (`--target`).
        builder_ep: The builder's `-e` value.
        runtime_ep: The execution provider the runtime is expected to pick.
        arch: The CPU architecture the target runs on.
        builder_options: The builder's `--extra_options` defaults.
        intra_op_num_threads: Baked thread count; the runtime caps it by usable cores.
    """

    name: str
    builder_ep: str
    runtime_ep: str
    arch: str
    builder_options: dict[str, str] = field(default_factory=dict)
    intra_op_num_threads: int = 2


_CPU_INT4 = {"block_size": "128", "accuracy_level": "4"}

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        # Lambda gives 2 vCPUs at the template's default memory; more above ~3.5 GB.
        Target("lambda-x86_64", "cpu", "cpu", "x86_64", dict(_CPU_INT4), 2),
        Target("lambda-arm64", "cpu", "cpu", "aarch64", dict(_CPU_INT4), 2),
        # The README deploys Cloud Functions with --cpu 2.
        Target("gcf", "cpu", "cpu", "x86_64", dict(_CPU_INT4), 2),
        # Raspberry Pi 5 class boards have 4 cores.
        Target("edge-aarch64", "cpu", "cpu", "aarch64", dict(_CPU_INT4), 4),
        Target("edge-x86_64", "cpu", "cpu", "x86_64", dict(_CPU_INT4), 4),
        Target("cuda", "cuda", "cuda", "x86_64", {}, 1),
    )
}


def get_target(name: str) -> Target:
    """The target called `name`.

    Raises:
        BakeError: No such target.
    """
    try:
        return TARGETS[name]
    except KeyError:
        raise BakeError(f"unknown target {name!r}; choose one of: {', '.join(TARGETS)}") from None


def builder_options(target: Target, precision: str, overrides: dict[str, str]) -> dict[str, str]:
    """The builder's extra options: the target's defaults for int4, then the user's overrides."""
    if precision not in PRECISIONS:
        raise BakeError(f"unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")
    options = dict(target.builder_options) if precision in ("int4", "int8") else {}
    options.update(overrides)
    return options
