"""Speculative decoding (#40): decode speed and output identity, plain and drafted, alternating.

Run: `python -m benchmarks.speculative --model-dir SPEC/model [--plain-dir PRUNED/model]
[--draft-dir PAIR/model] --json OUT`. SPEC is a bake with `--speculative` (the logits of every
position); each workload's prompt (chat-templated, thousands of tokens for the document
workloads) is decoded greedily, `--new-tokens` at most, by each variant in turn, `--reps`
rounds, medians:

- `pruned`: plain decoding on the default bake (`--plain-dir`: the last position's logits only);
- `plain`: plain decoding on SPEC (`speculative: false`: one token a forward pass);
- `lookup`: prompt lookup on SPEC (the server's default there);
- `draft`: the draft model of `--draft-dir` (a folder whose genai_config has `model.draft`).

Speeds are decode tokens/s after the first token, and the time to it (the prefill, where the
kept logits cost); identity compares each variant's tokens with `plain`'s, and says where
they part (the token, and plain decoding's top-2 margin there). The model's own sampling
defaults apply but temperature (0: greedy); `--repetition-penalty` overrides its penalty.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ortserve.core.engine import Engine
from ortserve.core.generation import GenerationRequest, SamplingOptions, Token
from ortserve.core.settings import EngineSettings

ROOT = Path(__file__).resolve().parents[1]


def _log_text() -> str:
    """A service log of 120 lines, some of them errors (invented, deterministic)."""
    lines = []
    for i in range(120):
        stamp = f"2026-11-{1 + i // 40:02d} {8 + i % 10:02d}:{(7 * i) % 60:02d}:{(13 * i) % 60:02d}"
        if i % 9 == 4:
            lines.append(f"{stamp} api-{i % 3} ERROR upstream timeout after {1000 + 37 * i} ms")
        else:
            lines.append(f"{stamp} api-{i % 3} INFO GET /v1/items/{i * 17} 200 {3 + i % 40} ms")
    return "\n".join(lines)


def _csv_text() -> str:
    rows = ["id,name,city,balance"]
    cities = ("Lisbon", "Oslo", "Kyoto", "Lima", "Accra", "Perth")
    names = ("Ana", "Bo", "Chen", "Dara", "Emil", "Fatou", "Gus", "Hana", "Ivo", "Jun")
    for i in range(40):
        rows.append(f"{i + 1},{names[i % 10]} {chr(65 + i % 26)}.,{cities[i % 6]},{i * 37.5:.2f}")
    return "\n".join(rows)


def workloads() -> dict[str, str]:
    """Each workload's user message: four that repeat their document, two open ones."""
    code = (ROOT / "build" / "bake" / "gguf_blocks.py").read_text()[:4000]
    return {
        "code-edit": "Rename the function `_q4_0` to `_decode_q4_0` in this code and print the "
        f"whole code back, changed:\n\n```python\n{code}\n```",
        "extraction": f"Here is a service log:\n\n{_log_text()}\n\nQuote every ERROR line "
        "exactly as it is written, one per line.",
        "json": f"Convert this CSV to a JSON array of objects, one per row, with the keys id, "
        f"name, city and balance:\n\n{_csv_text()}",
        "quote": f"{(ROOT / 'LICENSE').read_text()[:3000]}\n\nRepeat the second paragraph of "
        "the text above exactly.",
        "chat-story": "Write a short story about a robot who learns to paint.",
        "chat-explain": "Explain how a hash map works, with an example in Python.",
    }


@dataclass
class Run:
    tokens: list[int]
    decode_tps: float
    ttft_s: float
    drafted: int = 0
    accepted: int = 0
    margins: list[float] = field(default_factory=list)  # plain: top-2 margin a token


def _decode(engine: Engine, ids: list[int], new: int, options: SamplingOptions, top: bool) -> Run:
    start = time.perf_counter()
    first = 0.0
    steps: list[Token] = []
    for step in engine.decode(ids, new, options, logprobs=2 if top else None):
        if isinstance(step, Token):
            if not steps:
                first = time.perf_counter()
            steps.append(step)
    end = time.perf_counter()
    tps = (len(steps) - 1) / (end - first) if len(steps) > 1 else 0.0
    drafts = steps[-1].drafts if steps else None
    margins = [
        s.logprob.top[0][1] - s.logprob.top[1][1]
        for s in steps
        if s.logprob is not None and len(s.logprob.top) > 1
    ]
    return Run(
        [s.id for s in steps],
        tps,
        first - start,
        drafts.drafted if drafts else 0,
        drafts.accepted if drafts else 0,
        margins,
    )


def _engine(folder: Path, threads: int, ngram: int = 5, draft_tokens: int = 6) -> Engine:
    return Engine.load(
        EngineSettings(
            model_dir=folder,
            providers="cpu",
            threads=threads,
            prompt_cache_slots=0,
            speculative_ngram=ngram,
            speculative_draft_tokens=draft_tokens,
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--plain-dir", type=Path)
    parser.add_argument("--draft-dir", type=Path)
    parser.add_argument("--workloads", default=",".join(workloads()))
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repetition-penalty", type=float)
    parser.add_argument("--ngram", type=int, default=5, help="ORTSERVE_SPECULATIVE_NGRAM")
    parser.add_argument(
        "--draft-tokens", type=int, default=6, help="ORTSERVE_SPECULATIVE_DRAFT_TOKENS"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    engines = {"plain": _engine(args.model_dir, args.threads, args.ngram, args.draft_tokens)}
    engines["lookup"] = engines["plain"]
    if args.plain_dir:
        engines["pruned"] = _engine(args.plain_dir, args.threads)
    if args.draft_dir:
        engines["draft"] = _engine(args.draft_dir, args.threads, args.ngram, args.draft_tokens)
    spec = engines["plain"]
    if spec.speculation is None:
        sys.exit(f"{args.model_dir}: no speculative decoding ({spec.speculation_note})")
    texts = workloads()
    record: dict[str, Any] = {
        "model_dir": str(args.model_dir),
        "speculation": spec.speculation_note,
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "workloads": {},
    }
    for name in args.workloads.split(","):
        request = GenerationRequest(messages=[{"role": "user", "content": texts[name]}])
        ids = spec.prompt_ids(request)
        runs: dict[str, list[Run]] = {v: [] for v in engines}
        greedy = SamplingOptions(
            max_new_tokens=args.new_tokens,
            temperature=0.0,
            repetition_penalty=args.repetition_penalty,
            speculative=False,
        )
        # Plain decoding's tokens and top-2 margins, untimed (log probabilities cost a read).
        reference = _decode(spec, ids, args.new_tokens, greedy, top=True)
        for rep in range(args.reps):
            for variant, engine in engines.items():
                options = replace(greedy, speculative=variant in ("lookup", "draft"))
                run = _decode(engine, ids, args.new_tokens, options, top=False)
                runs[variant].append(run)
                print(
                    f"{name} {variant} rep {rep}: {run.decode_tps:.1f} tok/s, TTFT "
                    f"{run.ttft_s * 1000:.0f} ms, {len(run.tokens)} tokens, drafts "
                    f"{run.accepted}/{run.drafted}",
                    flush=True,
                )
        summary: dict[str, Any] = {"prompt_tokens": len(ids)}
        for variant, done in runs.items():
            tokens = done[-1].tokens
            parted = next(
                (
                    i
                    for i, (a, b) in enumerate(zip(tokens, reference.tokens, strict=False))
                    if a != b
                ),
                None,
            )
            if parted is None and len(tokens) != len(reference.tokens):
                parted = min(len(tokens), len(reference.tokens))
            summary[variant] = {
                "decode_tps": statistics.median(r.decode_tps for r in done),
                "ttft_ms": statistics.median(r.ttft_s for r in done) * 1000,
                "tokens": len(tokens),
                "identical": parted is None,
                "parted_at": parted,
                "margin_there": reference.margins[parted]
                if parted is not None and parted < len(reference.margins)
                else None,
                "drafted": done[-1].drafted,
                "accepted": done[-1].accepted,
            }
        base = summary["plain"]["decode_tps"]
        for variant in runs:
            summary[variant]["speedup"] = summary[variant]["decode_tps"] / base if base else 0.0
        record["workloads"][name] = summary
        print(name, json.dumps(summary), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    _table(record)
    return 0


def _table(record: dict[str, Any]) -> None:
    """The record as a Markdown table: one row a workload, decode ÷ plain per variant."""
    variants = [
        v
        for v in ("pruned", "plain", "lookup", "draft")
        if any(v in w for w in record["workloads"].values())
    ]
    print("| workload | prompt | " + " | ".join(variants) + " |")
    print("|---|---:|" + "---|" * len(variants))
    for name, w in record["workloads"].items():
        cells = []
        for v in variants:
            r = w.get(v)
            if r is None:
                cells.append("")
                continue
            same = "same" if r["identical"] else f"parts at {r['parted_at']}"
            drafts = f", {r['accepted']}/{r['drafted']} drafts" if r["drafted"] else ""
            cells.append(
                f"{r['decode_tps']:.1f} tok/s ({r['speedup']:.2f}\u00d7), TTFT "
                f"{r['ttft_ms']:.0f} ms, {same}{drafts}"
            )
        print(f"| {name} | {w['prompt_tokens']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
