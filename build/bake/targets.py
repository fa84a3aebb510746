"""Per-target bake defaults: the builder's execution provider and options, and session options.

Defaults were chosen on real weights (SmolLM2-135M-Instruct; docs/measurements.md, "Quality"): int4
k_quant at block 32 with the lm_head and llama.cpp's "mixed" sensitive layers at int8
(the builder's `k_quant_mixed`). Block-128 RTN, the first default, was fast but broke
answers; plain block-32 RTN (the builder's default) loses a third more perplexity.
intra_op_num_threads must be set (left at its default, onnxruntime-genai ran one thread).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortserve.bake.errors import BakeError
from ortserve.bake.recipes import DEFAULT_RECIPE, RECIPES, Recipe

PRECISIONS = ("int4", "int8", "fp16", "fp32")
# The quality gate's default limit (bake.quality).
# On SmolLM2-135M-Instruct and the gate's text (docs/measurements.md, "Quality"): the default bake
# scores 1.16, plain RTN block 32 1.34 and RTN block 128 (which answers "Le Grand Jestam"
# for the capital of France) 1.61.
DEFAULT_MAX_PPL_RATIO = 1.25


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
        recipe: The int4 bake's recipe (bake.recipes) unless `--recipe` names another;
            None: the builder's own defaults.
    """

    name: str
    builder_ep: str
    runtime_ep: str
    arch: str
    builder_options: dict[str, str] = field(default_factory=dict)
    intra_op_num_threads: int = 2
    recipe: str | None = None


# `algo_config` needs a block size that divides every weight row (k_quant at 128 fails
# on SmolLM2's 576-wide rows); 32 divides the hidden sizes of the models we serve.
_CPU_INT4 = RECIPES[DEFAULT_RECIPE].builder_options()
# Logits of each pass's last position only (+9-18% prefill; a 2,048-token prompt's
# logits for every position are 1.2 GB at Qwen2.5's vocabulary): og 0.18's builder takes
# position -1 of every row, a pad for a batch's shorter prompts, so bake.upstream makes it
# each row's own last position. Every precision of a CPU target; `--builder-option
# prune_lm_head=false` keeps the logits of every position.
_PRUNED = {"prune_lm_head": "true"}

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        # Lambda gives 2 vCPUs at the template's default memory; more above ~3.5 GB.
        Target("lambda-x86_64", "cpu", "cpu", "x86_64", dict(_CPU_INT4), 2, DEFAULT_RECIPE),
        Target("lambda-arm64", "cpu", "cpu", "aarch64", dict(_CPU_INT4), 2, DEFAULT_RECIPE),
        # docs/cloud-functions.md deploys Cloud Functions with --cpu 2.
        Target("gcf", "cpu", "cpu", "x86_64", dict(_CPU_INT4), 2, DEFAULT_RECIPE),
        # A Cloud Run service instance has 2 vCPUs unless its memory needs more; the
        # image sets ORTSERVE_THREADS to its CPUs (bake.package_cloudrun).
        Target("cloudrun", "cpu", "cpu", "x86_64", dict(_CPU_INT4), 2, DEFAULT_RECIPE),
        # Raspberry Pi 5 class boards have 4 cores.
        Target("edge-aarch64", "cpu", "cpu", "aarch64", dict(_CPU_INT4), 4, DEFAULT_RECIPE),
        Target("edge-x86_64", "cpu", "cpu", "x86_64", dict(_CPU_INT4), 4, DEFAULT_RECIPE),
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


def builder_options(
    target: Target, precision: str, overrides: dict[str, str], recipe: Recipe | None = None
) -> dict[str, str]:
    """The builder's extra options: the target's defaults for the precision (a recipe's
    for an int4 bake with one), then the user's.

    int4 takes the target's (or the recipe's) options whole; int8 (already close to fp32:
    docs/measurements.md, "Quality") keeps its accuracy level at block 128, the faster
    layout, and no int4 algorithm.
    """
    if precision not in PRECISIONS:
        raise BakeError(f"unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")
    options: dict[str, str] = {}
    if precision == "int4":
        options = recipe.builder_options() if recipe else dict(target.builder_options)
    elif precision == "int8" and target.builder_options:
        options = {"block_size": "128", "accuracy_level": target.builder_options["accuracy_level"]}
    if target.runtime_ep == "cpu":
        options |= _PRUNED
    for key, value in overrides.items():
        # og 0.18's builder documents `int4_algo_config` & co. as working aliases, but
        # ignores them without a word: pass the names it reads.
        options[key.removeprefix("int4_")] = value
    return options
