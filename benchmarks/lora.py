"""LoRA adapters (#40): what an adapter costs beside its base model, alternating, medians.

Run: `python -m benchmarks.lora --model-dir LORA/model --plain-dir BASE/model --adapter NAME
--json OUT`. LORA is a bake with `--adapter NAME=PATH`, BASE the same source baked
without (the graph as it is without adapter branches). Measured in one process, the
variants taking turns, `--reps` rounds:

- `load_ms`: loading the adapter (og reads its file), then unloading it, each round;
- `switch_ms`: a new generator with the adapter activated, over one without (the cost
  of switching a request to another adapter: og binds its tensors to the run), and the
  first token's time after a switch beside after the same adapter again;
- decode tokens/s of `--new-tokens` greedy tokens on a 200-token prompt: BASE, LORA
  without an adapter (its rank-0 branches), LORA with the adapter;
- `memory`: the process's RSS before and after loading the adapter (its file's size
  beside), and the adapter file's size beside the PEFT folder's weights.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from ortserve.core.engine import Engine
from ortserve.core.generation import SamplingOptions, Token
from ortserve.core.manifest import read_manifest
from ortserve.core.settings import EngineSettings

PROMPT = (
    "The library opens at nine in the morning and closes at six in the evening. Members "
    "may borrow up to five books at a time, for three weeks each. "
) * 6 + "Summarise the rules above in one sentence."


def _rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _engine(folder: Path, threads: int) -> Engine:
    settings = {"model_dir": folder, "providers": "cpu", "threads": threads}
    return Engine.load(EngineSettings.model_validate({**settings, "prompt_cache_slots": 0}))


def _decode(engine: Engine, ids: list[int], new: int, adapter: str | None) -> tuple[float, float]:
    """(first token's seconds, decode tokens/s after it) of a forced greedy decode."""
    options = SamplingOptions(
        max_new_tokens=new, min_new_tokens=new, temperature=0.0, adapter=adapter
    )
    start = time.perf_counter()
    first = 0.0
    count = 0
    for step in engine.decode(ids, new, options):
        if isinstance(step, Token):
            count += 1
            if count == 1:
                first = time.perf_counter()
    end = time.perf_counter()
    return first - start, (count - 1) / (end - first)


def _generator_ms(engine: Engine, adapter: str | None, reps: int) -> float:
    """Median milliseconds to make a generator (with `adapter` activated)."""
    times = []
    search: dict[str, Any] = {"max_length": 256}
    for _ in range(reps):
        start = time.perf_counter()
        steps = engine.model.generator(search, None, (), adapter=adapter)
        times.append((time.perf_counter() - start) * 1000)
        del steps
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--plain-dir", type=Path, required=True)
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    lora = _engine(args.model_dir, args.threads)
    adapter = lora.adapters[args.adapter]
    adapter_file = args.model_dir / adapter.file
    peft_file = Path(adapter.source) / "adapter_model.safetensors"
    rss_before = _rss_mib()
    lora.load_adapter(args.adapter)
    rss_loaded = _rss_mib()
    loads = []
    for _ in range(args.reps):
        lora.unload_adapter(args.adapter)
        start = time.perf_counter()
        lora.load_adapter(args.adapter)
        loads.append((time.perf_counter() - start) * 1000)
    plain = _engine(args.plain_dir, args.threads)
    ids = lora.encode(PROMPT)
    runs: dict[str, list[tuple[float, float]]] = {"base": [], "lora-none": [], "lora-adapter": []}
    firsts: dict[str, list[float]] = {"switched": [], "same": []}
    for _ in range(args.reps):  # the variants take turns
        runs["base"].append(_decode(plain, ids, args.new_tokens, None))
        runs["lora-none"].append(_decode(lora, ids, args.new_tokens, None))
        # After a request without it: a switch. Then the same adapter again.
        firsts["switched"].append(_decode(lora, ids, 2, args.adapter)[0])
        firsts["same"].append(_decode(lora, ids, 2, args.adapter)[0])
        runs["lora-adapter"].append(_decode(lora, ids, args.new_tokens, args.adapter))
    without, with_adapter = (
        _generator_ms(lora, None, args.reps * 4),
        _generator_ms(lora, args.adapter, args.reps * 4),
    )
    decode = {k: statistics.median(r[1] for r in v) for k, v in runs.items()}
    base_quality = read_manifest(args.model_dir).quality
    result = {
        "model": lora.model_name,
        "adapter": adapter.model_dump(),
        "threads": args.threads,
        "prompt_tokens": len(ids),
        "new_tokens": args.new_tokens,
        "load_ms_median": round(statistics.median(loads), 2),
        "generator_ms": {"without": round(without, 3), "with_adapter": round(with_adapter, 3)},
        "switch_ms": round(with_adapter - without, 3),
        "first_token_ms": {k: round(statistics.median(v) * 1000, 1) for k, v in firsts.items()},
        "decode_tokens_per_s": {k: round(v, 1) for k, v in decode.items()},
        "decode_ratio": {
            "lora-none / base": round(decode["lora-none"] / decode["base"], 3),
            "lora-adapter / base": round(decode["lora-adapter"] / decode["base"], 3),
        },
        "memory": {
            "rss_before_mib": round(rss_before, 1),
            "rss_loaded_mib": round(rss_loaded, 1),
            "adapter_file_mib": round(adapter_file.stat().st_size / 2**20, 2),
            "peft_weights_mib": round(peft_file.stat().st_size / 2**20, 2)
            if peft_file.is_file()
            else None,
        },
        "quality": {
            "base": base_quality.model_dump() if base_quality else None,
            "adapter": adapter.quality.model_dump() if adapter.quality else None,
        },
    }
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
