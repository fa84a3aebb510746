"""What picking tokens in our code costs (core.picker, issue 54): `python -m
benchmarks.picker --model-dir FOLDER`.

One sequence decodes up to `--new-tokens` tokens after a chat prompt that asks for a long
story (`--repeat` times the request, to make a longer prompt), three ways on the same baked
model, alternating (A/B/C/A/B/C...): `og` (og's own search at the sampling: the way a
sampled request decoded before), `picker` (a neutral generator, greedy with no penalty,
and our pick each step: the way a sampled request decodes now, through the prompt cache or
not) and, for scale, `greedy` (og's argmax alone: no sampling, no penalty). Each runs
until EOS or the count (tokens/s is per token decoded; the story seldom ends early, and
the table gives the tokens each variant decoded). Prints the median decode tokens/s of
each and the ratio of ours to og's. Not a test: figures for docs/measurements.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from ortserve.core.engine import Engine, neutral
from ortserve.core.generation import EffectiveSampling
from ortserve.core.settings import EngineSettings

QWEN = EffectiveSampling(0.7, 0.8, 20, 1.1)  # Qwen2.5-Coder's generation_config.json


def _decode(
    engine: Engine, search: dict[str, Any], pick: bool, prompt: list[int], new: int
) -> tuple[int, float]:
    """Tokens decoded after the first, and the seconds they took."""
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
    return count, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    settings = EngineSettings(model_dir=args.model_dir, providers="cpu", threads=args.threads)
    engine = Engine.load(settings)
    ask = "Write a long, detailed story about a lighthouse keeper and a storm. " * args.repeat
    prompt = engine.encode(
        f"<|im_start|>user\n{ask}<|im_end|>\n<|im_start|>assistant\n"  # Qwen's template
    )
    length = len(prompt) + args.new_tokens
    variants = {
        "og": ({"max_length": length, **QWEN.search()}, False),
        "picker": ({"max_length": length, **neutral(None).search()}, True),
        "greedy": ({"max_length": length, **neutral(None).search()}, False),
    }
    runs: dict[str, list[tuple[int, float]]] = {name: [] for name in variants}
    for rep in range(args.reps + 1):  # the first round warms up, and is not counted
        for name, (search, pick) in variants.items():
            run = _decode(engine, search, pick, prompt, args.new_tokens)
            if rep:
                runs[name].append(run)
    print(
        f"{args.model_dir}: {len(prompt)}-token prompt, up to {args.new_tokens} new tokens, "
        f"{args.threads} threads, medians of {args.reps}, sampling {QWEN}"
    )
    speed = {}
    for name, done in runs.items():
        speed[name] = statistics.median(count / seconds for count, seconds in done)
        counts = [count + 1 for count, _ in done]
        print(f"{name:<7} {speed[name]:6.1f} tok/s  (tokens decoded: {counts})")
    print(f"our pick / og's search: {speed['picker'] / speed['og']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
