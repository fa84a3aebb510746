"""Recall at long contexts: a fact at the start of a long chat, asked for at its end.

Run: `python -m benchmarks.needle --model-dir BAKED/model --gguf THE.gguf [--tokens 4000]
[--needles 5] [--json PATH]`. For each needle, one user message: "Remember this: the
access code for the <colour> door is <4 digits>." then about `--tokens` tokens of the
Python reference manual (`pydoc_data`, a different part per needle), then "What is the
access code for the <colour> door? Answer with the number only." Greedy, 16 new tokens,
through the edge daemon (`ortserve serve` on the baked folder, the OpenAI chat route,
its defaults) and through llama.cpp on the same GGUF (llama-cpp-python's
`create_chat_completion`, the GGUF's own chat template, n_ctx 8192, 2 threads). A needle
is recalled when the answer holds its digits. Prints each variant's recalled count and
the prompt's token count as each server counted it. Not a test: figures for
docs/measurements.md (#50's long-context item: the fp32 KV cache's recall, kept).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.support.machine import environment
from benchmarks.support.manual import CHARS_PER_TOKEN, manual
from benchmarks.support.servers import daemon

_COLOURS = ("blue", "green", "red", "yellow", "white", "black", "orange", "purple")


def needles(count: int, tokens: int) -> list[tuple[str, str]]:
    """(the chat's one user message, the digits it must recall), `count` of them."""
    text = manual()
    chars = int(tokens * CHARS_PER_TOKEN)
    rng = np.random.default_rng(0)
    found = []
    for index in range(count):
        colour = _COLOURS[index % len(_COLOURS)]
        code = str(int(rng.integers(1000, 10000)))
        start = int(rng.integers(0, len(text) - chars))
        message = (
            f"Remember this: the access code for the {colour} door is {code}.\n\n"
            f"{text[start : start + chars]}\n\n"
            f"What is the access code for the {colour} door? Answer with the number only."
        )
        found.append((message, code))
    return found


def ask_daemon(base: str, message: str) -> tuple[str, int]:
    body = {
        "messages": [{"role": "user", "content": message}],
        "max_tokens": 16,
        "temperature": 0,
    }
    response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=900)
    response.raise_for_status()
    answer = response.json()
    return str(answer["choices"][0]["message"]["content"]), int(answer["usage"]["prompt_tokens"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, required=True, help="a baked model folder")
    parser.add_argument("--gguf", type=Path, help="the GGUF it was baked from (llama.cpp)")
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--needles", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    asked = needles(args.needles, args.tokens)
    rows: dict[str, list[dict[str, Any]]] = {"ortserve": [], "llama.cpp": []}
    env = {**os.environ, "ORTSERVE_PROVIDERS": "cpu", "ORTSERVE_THREADS": str(args.threads)}
    env["ORTSERVE_PROMPT_CACHE_SLOTS"] = "0"
    with daemon(args.model_dir, env) as (base, _):
        for message, code in asked:
            answer, prompt = ask_daemon(base, message)
            rows["ortserve"].append({"code": code, "answer": answer, "prompt_tokens": prompt})
            print(json.dumps({"ortserve": rows["ortserve"][-1]}), flush=True)
    if args.gguf is not None:
        from llama_cpp import Llama

        llm = Llama(
            str(args.gguf),
            n_ctx=8192,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            verbose=False,
        )
        for message, code in asked:
            out: Any = llm.create_chat_completion(
                [{"role": "user", "content": message}], max_tokens=16, temperature=0
            )
            row = {
                "code": code,
                "answer": out["choices"][0]["message"]["content"],
                "prompt_tokens": out["usage"]["prompt_tokens"],
            }
            rows["llama.cpp"].append(row)
            print(json.dumps({"llama.cpp": row}), flush=True)
    for name, found in rows.items():
        if found:
            recalled = sum(r["code"] in r["answer"] for r in found)
            tokens = sorted(r["prompt_tokens"] for r in found)
            print(f"{name}: {recalled}/{len(found)} recalled, prompts of {tokens} tokens")
    if args.json:
        args.json.write_text(json.dumps({"environment": environment(), **rows}, indent=2))


if __name__ == "__main__":
    main()
