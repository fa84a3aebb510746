"""Which sampling profile answers the docs' example prompts sensibly:
`python -m benchmarks.sampling_profiles MODEL_DIR [--seeds 10] [--out FILE]`.

Each candidate profile answers each prompt of the README, docs and `--help` (chat, as
`ortserve run` asks; one raw prompt, as `TextGenerator.generate`) once if greedy, else
once per seed. An answer is sensible when a keyword check passes (Paris, Berlin, a
scattering word, two fruits, a greeting) and no 4-word run recurs 3 times (a loop).
Prints one row per profile and prompt; the table is in docs/measurements.md. Not a test:
the checks are coarse, read the samples (`--out`) too.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortserve.core.generation import GenerationRequest, SamplingOptions
from ortserve.core.service import Service
from ortserve.core.settings import EngineSettings

_FRUITS = ("apple", "banana", "orange", "grape", "strawberr", "mango", "pear", "cherr", "lemon")
_GREETING = re.compile(r"\b(hello|hi|help|assist|how)\b")
Check = Callable[[str], bool]
# (name, chat?, prompt, new tokens, check)
PROMPTS: list[tuple[str, bool, str, int, Check]] = [
    ("France", True, "What is the capital of France?", 256, lambda t: "paris" in t),
    ("Germany", True, "What is the capital of Germany?", 256, lambda t: "berlin" in t),
    (
        "sky",
        True,
        "Why is the sky blue?",
        160,
        lambda t: any(w in t for w in ("scatter", "wavelength", "rayleigh")),
    ),
    ("fruits", True, "Name three fruits.", 96, lambda t: sum(f in t for f in _FRUITS) >= 2),
    ("Hi", True, "Hi", 32, lambda t: bool(_GREETING.search(t))),
    ("Hello", True, "Hello", 64, lambda t: bool(_GREETING.search(t))),
    ("raw France", False, "The capital of France is", 16, lambda t: "paris" in t),
]
PROFILES: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0, "repetition_penalty": 1.0},
    "greedy rep 1.1": {"temperature": 0.0, "repetition_penalty": 1.1},
    "greedy rep 1.15": {"temperature": 0.0, "repetition_penalty": 1.15},
    "greedy rep 1.2": {"temperature": 0.0, "repetition_penalty": 1.2},
    "greedy rep 1.3": {"temperature": 0.0, "repetition_penalty": 1.3},
    "t 0.1 p 0.9 k 40 rep 1.2": {
        "temperature": 0.1,
        "top_p": 0.9,
        "top_k": 40,
        "repetition_penalty": 1.2,
    },
    "t 0.2 p 0.9 k 40 rep 1.1": {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "repetition_penalty": 1.1,
    },
    "t 0.3 p 0.8 k 20 rep 1.1": {
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.1,
    },
    "t 0.7 p 0.8 k 20 rep 1.05 (Qwen's)": {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
    },
    "t 0.8 p 0.9 k 40 (Ollama's)": {
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": 40,
        "repetition_penalty": 1.0,
    },
    "t 1 (OpenAI's)": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0},
}


def looped(text: str) -> bool:
    """Whether some run of 4 words comes 3 times or more."""
    words = text.split()
    grams = [" ".join(words[i : i + 4]) for i in range(len(words) - 3)]
    return any(grams.count(g) >= 3 for g in set(grams))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, help="write every answer here (JSON)")
    args = parser.parse_args()
    service = Service.load(EngineSettings(model_dir=args.model_dir))
    samples: dict[str, list[str]] = {}
    for profile, fields in PROFILES.items():
        runs = 1 if fields["temperature"] == 0 else args.seeds
        for name, chat, prompt, new, check in PROMPTS:
            good = loops = 0
            for seed in range(runs):
                options = SamplingOptions(max_new_tokens=new, seed=seed, **fields)
                request = (
                    GenerationRequest(
                        messages=[{"role": "user", "content": prompt}], options=options
                    )
                    if chat
                    else GenerationRequest(prompt=prompt, options=options)
                )
                text = service.generate(request).text
                loop = looped(text)
                good += check(text.lower()) and not loop
                loops += loop
                samples.setdefault(f"{profile} | {name}", []).append(text)
            print(f"{profile:36} {name:10} sensible {good}/{runs}, loops {loops}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(samples, indent=1, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
