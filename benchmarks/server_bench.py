"""The edge daemon against the service in process and the bare onnxruntime-genai loop,
same model and prompt tokens: `python -m benchmarks.server_bench`.

Alternates (A/B/C/A/B/C...) one streamed generation through the real daemon (`ortserve
serve`, an SSE client over one keep-alive loopback connection: TTFT from sending the
request to the first event, decode tokens/s from the first event to the final one), one
through the service in this process (`Service.stream`, the call the daemon makes: TTFT
from the call to the first delta), and one through the bare og loop (GeneratorParams,
Generator, append_tokens, generate_next_token; the same token ids, the same threads).
All generate greedily from the same prompt (about `--prompt-tokens` tokens); the random
135M-shape model practically never emits EOS, and the token counts come from the
responses (the bare loop forces `--new-tokens`). Prints medians and the ratios; `--json`
writes everything. Not a test: this machine is shared and noisy, so read ratios from one
run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bakes import baked
from benchmarks.engine_bench import og_tokens
from benchmarks.support.servers import daemon
from ortserve.core.engine import Engine
from ortserve.core.generation import GenerationRequest, SamplingOptions
from ortserve.core.service import Service
from ortserve.core.settings import EngineSettings

ROOT = Path(__file__).resolve().parents[1]
WORDS = [
    "edge",
    "boards",
    "run",
    "a",
    "daemon",
    "under",
    "systemd",
    "and",
    "answer",
    "on",
    "the",
    "network",
    "quickly",
]


def _prompt(engine: Engine, tokens: int) -> str:
    words: list[str] = []
    while len(engine.encode(" ".join(words))) < tokens:
        words.append(WORDS[len(words) % len(WORDS)])
    return " ".join(words)


def _server_run(client: httpx.Client, base: str, prompt: str, new_tokens: int) -> dict[str, float]:
    body = {"prompt": prompt, "max_new_tokens": new_tokens, "temperature": 0, "stream": True}
    start = time.perf_counter()
    first = 0.0
    with client.stream("POST", f"{base}/generate", json=body) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            now = time.perf_counter()
            if not first:
                first = now
            if event.get("done"):
                tokens = event["tokens_generated"]
                return {"ttft_s": first - start, "decode_tps": (tokens - 1) / (now - first)}
    raise RuntimeError("the stream ended without its final event")


def _service_run(service: Service, prompt: str, new_tokens: int) -> dict[str, float]:
    options = SamplingOptions(max_new_tokens=new_tokens)
    start = time.perf_counter()
    stream = service.stream(GenerationRequest(prompt=prompt, options=options))
    first = 0.0
    for _ in stream:
        if not first:
            first = time.perf_counter()
    end = time.perf_counter()
    done = stream.completion
    assert done is not None
    return {"ttft_s": first - start, "decode_tps": (done.completion_tokens - 1) / (end - first)}


def _bare_run(model: Any, ids: list[int], new_tokens: int) -> dict[str, float]:
    import onnxruntime_genai as og

    start = time.perf_counter()
    first = 0.0
    count = 0
    for _ in og_tokens(og, model, ids, new_tokens):
        count += 1
        if not first:
            first = time.perf_counter()
    end = time.perf_counter()
    return {"ttft_s": first - start, "decode_tps": (count - 1) / (end - first)}


def _bare_model(model_dir: Path, threads: int) -> Any:
    """The baked folder as og loads it, with the threads the service uses."""
    import onnxruntime_genai as og

    config = og.Config(str(model_dir))
    options = {"intra_op_num_threads": threads}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    return og.Model(config)


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="builtin:smollm2-135m-shape")
    parser.add_argument("--model-dir", type=Path, help="a baked model folder (default: bake)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model_dir = (
        args.model_dir or baked(args.work, args.model, "edge-x86_64", package=False) / "model"
    )
    service = Service.load(
        EngineSettings(model_dir=model_dir, providers="cpu", threads=args.threads)
    )
    engine = service.engine
    prompt = _prompt(engine, args.prompt_tokens)
    ids = engine.encode(prompt)  # the tokens the server and the service feed og
    bare = _bare_model(model_dir, args.threads)
    env = {
        **os.environ,
        "ORTSERVE_THREADS": str(args.threads),
        "ORTSERVE_PROVIDERS": "cpu",
        "ORTSERVE_MAX_NEW_TOKENS": str(args.new_tokens),
    }
    runs: dict[str, list[dict[str, float]]] = {"server": [], "service": [], "bare": []}
    # One keep-alive connection, as HTTP clients (openai's included) use.
    with daemon(model_dir, env) as (base, _), httpx.Client(timeout=300) as client:
        variants: dict[str, Callable[[], dict[str, float]]] = {
            "server": lambda: _server_run(client, base, prompt, args.new_tokens),
            "service": lambda: _service_run(service, prompt, args.new_tokens),
            "bare": lambda: _bare_run(bare, ids, args.new_tokens),
        }
        for run in variants.values():  # warm-up each
            run()
        for _ in range(args.reps):
            for name, run in variants.items():
                runs[name].append(run())
    med: dict[str, dict[str, Any]] = {
        k: {m: statistics.median(r[m] for r in v) for m in ("ttft_s", "decode_tps")}
        for k, v in runs.items()
    }
    print(
        f"{args.model}: prompt {len(ids)} tokens, {args.new_tokens} new, "
        f"{args.threads} threads, medians of {args.reps} alternating runs"
    )
    for name in ("bare", "service", "server"):
        row = med[name]
        ttft_ms, tps = row["ttft_s"] * 1000, row["decode_tps"]
        print(f"  {name:<7} TTFT {ttft_ms:7.2f} ms   decode {tps:7.1f} tok/s")

    def paired(a: str, b: str) -> float:
        return statistics.median(
            x["decode_tps"] / y["decode_tps"] for x, y in zip(runs[a], runs[b], strict=True)
        )

    ratios = {
        f"{a}/{b}": {"medians": med[a]["decode_tps"] / med[b]["decode_tps"], "paired": paired(a, b)}
        for a, b in (("server", "bare"), ("service", "bare"), ("server", "service"))
    }
    for name, ratio in ratios.items():
        print(f"  decode {name:<15} = {ratio['medians']:.3f} (paired {ratio['paired']:.3f})")
    print("  goal: server/bare >= 0.97")
    overhead_ms = (med["server"]["ttft_s"] - med["service"]["ttft_s"]) * 1000
    print(f"  server TTFT - service TTFT = {overhead_ms:+.2f} ms")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "runs": runs,
                    "medians": med,
                    "decode_ratios": ratios,
                    "ttft_overhead_ms": overhead_ms,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
