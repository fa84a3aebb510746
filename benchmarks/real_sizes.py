"""The real-sizes figure (#36): Qwen2.5-Coder 0.5B and 1.5B beside llama.cpp on the same file.

Run: `python -m benchmarks.real_sizes [--out docs/img/real-sizes.png]` after
the runs it reads (their commands are in docs/measurements.md, "Real models at deployed
sizes"): for each model, `benchmarks.quality`'s record (perplexity of each bake and of
llama.cpp on the GGUF, folder sizes) and `benchmarks.engine_bench`'s (prefill and decode,
og variants and llama.cpp alternating, medians). It draws four panels (folder size ÷ the
GGUF, perplexity ÷ llama.cpp's, decode and prefill ÷ llama.cpp's at 128 and 2,048 tokens)
with the issue's goal lines, and prints the same numbers as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    label: str
    quality: str  # file in RESULTS
    speed: str  # file in RESULTS
    bakes: tuple[Bake, ...]


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
    ),
    Model(
        "Qwen2.5-Coder-1.5B",
        "quality-qwen2.5-coder-1.5b-compact.json",
        "qwen2.5-coder-1.5b-compact-2026-12-05.json",
        _BAKES,
    ),
)
X = "\u00d7"  # the times sign of the docs' tables
LLAMA_QUALITY, LLAMA_SPEED = "llama.cpp-gguf", "llama_cpp"
# The goals, as ratios: folder ≤ 1.15x the GGUF, perplexity ≤ 1.02x llama.cpp's,
# decode ≥ 1.1x and prefill ≥ 1.0x llama.cpp's.
GOALS = {"folder": 1.15, "ppl": 1.02, "decode": 1.1, "prefill": 1.0}


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / name).read_text(encoding="utf-8"))
    return data


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


def plot(found: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("folder ÷ GGUF (goal ≤ 1.15)", ["folder"], GOALS["folder"]),
        ("perplexity ÷ llama.cpp's (goal ≤ 1.02)", ["ppl_ratio"], GOALS["ppl"]),
        ("decode ÷ llama.cpp, 128 / 2k (goal ≥ 1.1)", ["decode_128", "decode_2048"], 1.1),
        ("prefill ÷ llama.cpp, 128 / 2k (goal ≥ 1.0)", ["prefill_128", "prefill_2048"], 1.0),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    labels = [f"{r['model'].removeprefix('Qwen2.5-Coder-')}\n{r['bake']}" for r in found]
    for ax, (title, keys, goal) in zip(axes, panels, strict=True):
        width = 0.8 / len(keys)
        for i, key in enumerate(keys):
            xs = [x + (i - (len(keys) - 1) / 2) * width for x in range(len(found))]
            bars = ax.bar(xs, [r[key] for r in found], width, label=key.split("_")[-1])
            ax.bar_label(bars, fmt="%.2f", fontsize=7)
        ax.axhline(goal, color="red", linestyle="--", linewidth=1)
        ax.axhline(1.0, color="gray", linewidth=0.5)
        if keys == ["ppl_ratio"]:
            ax.set_ylim(0.9, 1.15)  # the differences are a few percent
        ax.set_xticks(range(len(found)), labels, fontsize=7)
        ax.set_title(title, fontsize=9)
        if len(keys) > 1:
            ax.legend(fontsize=7, title="prompt", title_fontsize=7)
    fig.suptitle(
        "Qwen2.5-Coder Q4_K_M GGUFs: og bakes beside llama.cpp on the same file "
        "(2 threads, alternating, medians of 3; red: #36's goals)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DOCS_IMG / "real-sizes.png")
    args = parser.parse_args(argv)
    found = rows()
    print(table(found))
    plot(found, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
