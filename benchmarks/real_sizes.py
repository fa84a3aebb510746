"""The real-sizes figure (#36, #50): Qwen2.5-Coder 0.5B and 1.5B beside llama.cpp on the same file.

Run: `python -m benchmarks.real_sizes [--out docs/img/real-sizes.png]` after the runs it
reads (their commands are in docs/measurements.md, "Real models at deployed sizes" and
"2026-12-07"), for each model:

- `benchmarks.quality`'s record (perplexity of each bake and of llama.cpp on the GGUF,
  folder sizes) and `benchmarks.engine_bench`'s (prefill and decode, og variants and
  llama.cpp alternating, medians) at 128 and 2,048 tokens;
- `engine_bench`'s at 4,000 tokens and `benchmarks.needle`'s (long contexts);
- `benchmarks.load --llama-server`'s (several users: aggregate tokens/s, TTFT, 503s).

It prints three Markdown tables and draws their ratios to llama.cpp in one figure with
the issues' goal lines, each headed by the CPU the records name (figures compare only
within one CPU).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.load import beside_table

RESULTS = Path(__file__).resolve().parent / "results"
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


@dataclass(frozen=True)
class Bake:
    """One og bake of a model: its variant in the quality record and in the speed one."""

    label: str
    quality_variant: str
    speed_variant: str


@dataclass(frozen=True)
class Model:
    """One model's records (files in RESULTS)."""

    label: str
    quality: str
    speed: str
    bakes: tuple[Bake, ...]
    long_context: str  # engine_bench at 4,000 tokens (og_threads: the default bake)
    needle: str
    beside: str  # benchmarks.load --llama-server


_BAKES = (
    Bake("exact (default)", "og-gguf-exact", "og_threads"),
    Bake("--compact", "og-gguf-compact", "og_b"),
)
MODELS = (
    Model(
        "Qwen2.5-Coder-0.5B",
        "quality-qwen2.5-coder-0.5b-compact.json",
        "qwen2.5-coder-0.5b-compact-2026-12-05.json",
        _BAKES,
        "qwen2.5-coder-0.5b-4k-2026-12-07.json",
        "needle-qwen2.5-coder-0.5b-2026-12-07.json",
        "beside-llama-server-qwen2.5-coder-0.5b-batching-2026-12-07.json",
    ),
    Model(
        "Qwen2.5-Coder-1.5B",
        "quality-qwen2.5-coder-1.5b-compact.json",
        "qwen2.5-coder-1.5b-compact-2026-12-05.json",
        _BAKES,
        "qwen2.5-coder-1.5b-4k-2026-12-07.json",
        "needle-qwen2.5-coder-1.5b-2026-12-07.json",
        "beside-llama-server-qwen2.5-coder-1.5b-batching-2026-12-07.json",
    ),
)
X = "\u00d7"  # the times sign of the docs' tables
LLAMA_QUALITY, LLAMA_SPEED = "llama.cpp-gguf", "llama_cpp"
# The issues' goals, as ratios: folder ≤ 1.15x the GGUF, perplexity ≤ 1.02x llama.cpp's,
# decode ≥ 1.1x and prefill ≥ 1.0x llama.cpp's (#36, #50 item 1); decode after 4,000
# tokens ≥ 1.0x (item 2); aggregate tokens/s ≥ 1.2x llama-server's at 4 and 8 streams,
# with p99 TTFT no worse (item 3).
GOALS = {"folder": 1.15, "ppl": 1.02, "decode": 1.1, "prefill": 1.0}
GOALS |= {"decode_4k": 1.0, "streams": 1.2, "ttft_p99": 1.0}
LONG = 4000


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / name).read_text(encoding="utf-8"))
    return data


def cpus() -> list[str]:
    """The CPUs the records name (engine_bench's, quality's, load's and needle's
    `environment.cpu`), each once, in order."""
    found: list[str] = []
    for model in MODELS:
        for name in (model.quality, model.speed, model.long_context, model.needle, model.beside):
            cpu = _load(name).get("environment", {}).get("cpu", "an unnamed CPU")
            if cpu not in found:
                found.append(cpu)
    return found


def long_rows() -> list[dict[str, Any]]:
    """One row per model: prefill and decode at 4,000 tokens of context beside llama.cpp
    (the default bake), and the needles each recalled."""
    out = []
    for model in MODELS:
        medians = _load(model.long_context)["medians"]
        og, fast = medians["og_threads"], medians[LLAMA_SPEED]
        needle = _load(model.needle)
        row: dict[str, Any] = {"model": model.label}
        for kind in ("prefill", "decode"):
            key = f"{kind}_tps_{LONG}"
            row |= {f"{kind}_og": og[key], f"{kind}_llama": fast[key]}
            row[f"{kind}_ratio"] = og[key] / fast[key]
        for server in ("ortserve", "llama.cpp"):
            asked = needle[server]
            row[f"needles_{server}"] = (sum(r["code"] in r["answer"] for r in asked), len(asked))
        out.append(row)
    return out


def stream_rows() -> list[dict[str, Any]]:
    """One row per (model, streams): a level of `benchmarks.load --llama-server`'s record
    (ortserve serve beside llama-server --parallel N), with its model and the ratios the
    figure draws."""
    out = []
    for model in MODELS:
        for level in _load(model.beside)["beside_llama_server"]:
            p99 = level["ortserve"]["ttft_p99_ms"] / level["llama_server"]["ttft_p99_ms"]
            out.append(
                {
                    **level,
                    "model": model.label,
                    "streams": level["clients"],
                    "ratio": level["tokens_per_s_ratio"],
                    "ttft_p99_ratio": p99,
                }
            )
    return out


def rows() -> list[dict[str, Any]]:
    """One row per (model, og bake): its ratios to the GGUF and to llama.cpp."""
    out = []
    for model in MODELS:
        quality = {r["variant"]: r for r in _load(model.quality)["rows"]}
        speed = _load(model.speed)["medians"]
        llama, fast = quality[LLAMA_QUALITY], speed[LLAMA_SPEED]
        for bake in model.bakes:
            q, s = quality[bake.quality_variant], speed[bake.speed_variant]
            row: dict[str, Any] = {
                "model": model.label,
                "bake": bake.label,
                "folder_mb": q["size_mb"],
                "folder": q["size_mb"] / llama["size_mb"],
                "ppl": q["perplexity"],
                "ppl_ratio": q["perplexity"] / llama["perplexity"],
            }
            for kind in ("decode", "prefill"):
                for tokens in (128, 2048):
                    key = f"{kind}_tps_{tokens}"
                    row[key] = s[key]
                    row[f"{kind}_{tokens}"] = s[key] / fast[key]
            out.append(row)
    return out


def table(found: list[dict[str, Any]]) -> str:
    lines = [
        "| model | bake | folder MB (÷ GGUF) | ppl (÷ llama.cpp) | decode 128 / 2k "
        "(÷ llama.cpp) | prefill 128 / 2k (÷ llama.cpp) |",
        "|---|---|---:|---:|---|---|",
    ]
    for r in found:
        lines.append(
            f"| {r['model']} | {r['bake']} | {r['folder_mb']:,.0f} ({r['folder']:.2f}{X}) "
            f"| {r['ppl']:.3f} ({r['ppl_ratio']:.3f}{X}) "
            f"| {r['decode_tps_128']:.1f} / {r['decode_tps_2048']:.1f} "
            f"({r['decode_128']:.2f}{X} / {r['decode_2048']:.2f}{X}) "
            f"| {r['prefill_tps_128']:.0f} / {r['prefill_tps_2048']:.0f} "
            f"({r['prefill_128']:.2f}{X} / {r['prefill_2048']:.2f}{X}) |"
        )
    return "\n".join(lines)


def long_table(found: list[dict[str, Any]]) -> str:
    lines = [
        f"| model | prefill tok/s at {LONG:,}, og / llama.cpp | decode tok/s after {LONG:,}, "
        "og / llama.cpp | needles recalled, ortserve / llama.cpp |",
        "|---|---|---|---|",
    ]
    for r in found:
        ours, theirs = r["needles_ortserve"], r["needles_llama.cpp"]
        lines.append(
            f"| {r['model']} | {r['prefill_og']:.1f} / {r['prefill_llama']:.1f} "
            f"({r['prefill_ratio']:.2f}{X}) | {r['decode_og']:.1f} / {r['decode_llama']:.1f} "
            f"({r['decode_ratio']:.2f}{X}) | {ours[0]} of {ours[1]} / {theirs[0]} of {theirs[1]} |"
        )
    return "\n".join(lines)


def _bars(ax: Any, labels: list[str], series: dict[str, list[float]], goal: float) -> None:
    """Grouped bars, one group per label, with the goal line and the 1.0 line."""
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(goal, color="red", linestyle="--", linewidth=1)
    ax.axhline(1.0, color="gray", linewidth=0.5)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    if len(series) > 1:
        ax.legend(fontsize=7)


def plot(
    found: list[dict[str, Any]],
    longs: list[dict[str, Any]],
    streams: list[dict[str, Any]],
    cpu: str,
    out: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(17, 8.4))
    labels = [f"{r['model'].removeprefix('Qwen2.5-Coder-')}\n{r['bake']}" for r in found]
    panels = [
        ("folder ÷ GGUF (goal ≤ 1.15)", {"": [r["folder"] for r in found]}, GOALS["folder"]),
        ("perplexity ÷ llama.cpp's (goal ≤ 1.02)", {"": [r["ppl_ratio"] for r in found]}, 1.02),
        (
            "decode ÷ llama.cpp, 128 / 2k (goal ≥ 1.1)",
            {f"{t} tokens": [r[f"decode_{t}"] for r in found] for t in (128, 2048)},
            GOALS["decode"],
        ),
        (
            "prefill ÷ llama.cpp, 128 / 2k (goal ≥ 1.0)",
            {f"{t} tokens": [r[f"prefill_{t}"] for r in found] for t in (128, 2048)},
            GOALS["prefill"],
        ),
    ]
    for ax, (title, series, goal) in zip(axes[0], panels, strict=True):
        _bars(ax, labels, series, goal)
        ax.set_title(title, fontsize=9)
    axes[0][1].set_ylim(0.9, 1.15)  # the differences are a few percent
    models = [r["model"].removeprefix("Qwen2.5-Coder-") for r in longs]
    long_series = {kind: [r[f"{kind}_ratio"] for r in longs] for kind in ("prefill", "decode")}
    _bars(axes[1][0], models, long_series, GOALS["decode_4k"])
    axes[1][0].set_title(
        f"at {LONG:,} tokens of context ÷ llama.cpp (decode goal ≥ 1.0)", fontsize=9
    )
    recalled = {
        server: [r[f"needles_{server}"][0] / r[f"needles_{server}"][1] for r in longs]
        for server in ("ortserve", "llama.cpp")
    }
    _bars(axes[1][1], models, recalled, 1.0)
    axes[1][1].set_title(f"needles recalled at {LONG:,} tokens (share)", fontsize=9)
    levels = sorted({r["streams"] for r in streams})
    by_model = {m: {r["streams"]: r for r in streams if r["model"].endswith(m)} for m in models}
    for ax, key, title, goal in (
        (axes[1][2], "ratio", "new tokens/s ÷ llama-server, N streams (goal ≥ 1.2 at 4, 8)", 1.2),
        (axes[1][3], "ttft_p99_ratio", "TTFT p99 ÷ llama-server's (goal ≤ 1.0)", 1.0),
    ):
        series = {
            f"{n} stream{'s' if n > 1 else ''}": [by_model[m][n][key] for m in models]
            for n in levels
        }
        _bars(ax, models, series, goal)
        ax.set_title(title, fontsize=9)
    fig.suptitle(
        f"Qwen2.5-Coder Q4_K_M GGUFs: ortserve beside llama.cpp on the same file, {cpu} "
        "(2 threads, alternating; red: the goals of #36 and #50)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DOCS_IMG / "real-sizes.png")
    args = parser.parse_args(argv)
    cpu = " / ".join(cpus())
    found, longs, streams = rows(), long_rows(), stream_rows()
    print(f"Measured on: {cpu}\n")
    print(table(found), long_table(longs), beside_table(streams), sep="\n\n")
    plot(found, longs, streams, cpu, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
