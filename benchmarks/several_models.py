"""The memory of several models served together (core.registry) beside the sum of each
alone: `ortserve serve A [B [C]]` on loopback, one request to each model (so that each is
loaded and has run), then the daemon's and its engine processes' VmRSS (now) and VmHWM
(each process's own peak, summed), and what the memory budget counts (core.sizing).

    python -m benchmarks.several_models --model A_DIR --model B_DIR --model C_DIR \\
        --json benchmarks/results/several-models-DATE.json

Each model is given as its baked folder; the first is the server's model. Runs: each
model alone, then the first two together, then all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.support.machine import environment
from benchmarks.support.servers import ORTSERVE, daemon_pids, free_port, memory_kib, serve_process
from ortserve.core.manifest import read_manifest


def _ask(base: str, folder: Path, name: str) -> None:
    """One request to the model served under `name` (an embedding, or 16 tokens)."""
    if read_manifest(folder).kind == "embedding":
        body: dict[str, Any] = {"model": name, "input": ["A first sentence to embed."] * 4}
        reply = httpx.post(f"{base}/v1/embeddings", json=body, timeout=300)
    else:
        body = {
            "model": name,
            "messages": [{"role": "user", "content": "Write a Python function that adds."}],
            "max_tokens": 16,
            "temperature": 0,
        }
        reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)
    reply.raise_for_status()


def measure(folders: list[Path]) -> dict[str, Any]:
    """Serve `folders` together; memory once each has answered one request."""
    port = free_port()
    names = [f"m{i}" for i in range(len(folders))]
    more = [f"{n}={f}" for n, f in zip(names[1:], folders[1:], strict=True)]
    cmd = [*ORTSERVE, "serve", str(folders[0]), *more, "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "ORTSERVE_LOG_FORMAT": "json"}
    with serve_process(cmd, env, port) as server:
        listed = httpx.get(f"{server.base}/v1/models", timeout=60).json()["data"]
        first = listed[0]["id"]
        for name, folder in zip([first, *names[1:]], folders, strict=True):
            _ask(server.base, folder, name)
        time.sleep(1.0)
        pids = daemon_pids(server.base, server.proc.pid)
        rss = memory_kib(pids, "VmRSS") // 1024
        hwm = memory_kib(pids, "VmHWM") // 1024
    return {
        "models": [read_manifest(f).model_name for f in folders],
        "processes": len(pids),
        "rss_mib": rss,
        "hwm_mib": hwm,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, action="append", required=True)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    folders: list[Path] = args.model
    alone = [measure([f]) for f in folders]
    together = [measure(folders[:n]) for n in range(2, len(folders) + 1)]
    rows = []
    for run in together:
        count = len(run["models"])
        summed = [alone[i] for i in range(count)]
        rows.append(
            {
                **run,
                "sum_alone_rss_mib": sum(a["rss_mib"] for a in summed),
                "sum_alone_hwm_mib": sum(a["hwm_mib"] for a in summed),
            }
        )
    record = {"environment": environment(), "alone": alone, "together": rows}
    print("| models | together: RSS / peak MiB | each alone, summed: RSS / peak MiB |")
    print("|---|---:|---:|")
    for a in alone:
        print(f"| {a['models'][0]} alone | {a['rss_mib']} / {a['hwm_mib']} | |")
    for r in rows:
        print(
            f"| {' + '.join(r['models'])} | {r['rss_mib']} / {r['hwm_mib']} | "
            f"{r['sum_alone_rss_mib']} / {r['sum_alone_hwm_mib']} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
