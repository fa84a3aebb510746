"""What picking tokens in our code costs (core.picker, issue 54): `python -m
benchmarks.picker --model-dir FOLDER`.

One sequence decodes `--new-tokens` tokens after a `--prompt`-token prompt, two ways on the
same baked model, alternating (A/B/A/B...): `og` (og's own search at the sampling: the way
a sampled request decoded before) and `picker` (a neutral generator, greedy with no
penalty, and our pick each step: the way a sampled request decodes now, through the prompt
cache or not), until EOS or the count (tokens/s is per token decoded; a prompt of
arbitrary ids seldom ends early). Prints the median decode tokens/s of each and their
ratio. Not a test: figures for docs/measurements.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from ortserve.core.engine import Engine, neutral
from ortserve.core.generation import Sampling
from ortserve.core.settings import EngineSettings

QWEN = Sampling(0.7, 0.8, 20, 1.1)  # Qwen2.5-Coder's generation_config.json


def _decode(
    engine: Engine, search: dict[str, Any], pick: bool, prompt: list[int], new: int
) -> float:
    """Decode tokens/s of one sequence (after its first token)."""
    steps = engine.model.generator(search, None, ())
    if pick:
        steps.pick(QWEN, None)
    steps.append(prompt)
    steps.step(None)
    start = time.perf_counter()
    count = 0
    for _ in range(new - 1):
        token, _, _ = steps.step(None)
        if token < 0:
            break
        count += 1
    return count / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    settings = EngineSettings(model_dir=args.model_dir, providers="cpu", threads=args.threads)
    engine = Engine.load(settings)
    prompt = [(i * 7919) % 20000 + 300 for i in range(args.prompt)]
    length = args.prompt + args.new_tokens
    variants = {
        "og": ({"max_length": length, **QWEN.search()}, False),
        "picker": ({"max_length": length, **neutral(None).search()}, True),
    }
    speeds: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(args.reps + 1):  # the first round warms up, and is not counted
        for name, (search, pick) in variants.items():
            speed = _decode(engine, search, pick, prompt, args.new_tokens)
            if rep:
                speeds[name].append(speed)
    og, picker = (statistics.median(speeds[name]) for name in variants)
    print(
        f"{args.model_dir}: {args.prompt}-token prompt, {args.new_tokens} new tokens, "
        f"{args.threads} threads, medians of {args.reps}, sampling {QWEN}"
    )
    print(f"og's search: {og:.1f} tok/s; our pick: {picker:.1f} tok/s; ratio {picker / og:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
