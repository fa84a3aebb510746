"""Which model answers a newcomer's first questions right (#53 item 1):
`python -m benchmarks.first_answers MODEL [MODEL ...] [--seeds 3] [--out FILE]`.

MODEL is a stored model's name or a baked folder. Twenty everyday questions (general
knowledge, arithmetic, units, two short code tasks, one SQL query), asked as a chat at
the model's own defaults (no sampling option sent, as `make demo` and `ortserve run`
ask), each once per seed (a greedy model's seeds give one answer). An answer is right
when its check passes: a word or number in the text, or, for the code tasks, the
function in the answer's code block runs (in a child Python, 10 s at most) and returns
what it should. A question counts as right when most of its seeds are. Prints one row
per model (score, seconds per answer, how many answers ran to the token limit), and
with `--out` every answer, to read: the checks are coarse on purpose.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Check = Callable[[str], bool]
NEW_TOKENS = 256  # room for a short function and its explanation


def _word(*words: str) -> Check:
    """Right when one of `words` is in the answer as a whole word (any case)."""
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(w) for w in words) + r")\b", re.I)
    return lambda text: bool(pattern.search(text))


def _number(value: str, *spelled: str) -> Check:
    """Right when the number is in the answer (not inside a longer number), or spelled."""
    digits = re.compile(rf"(?<![\d.]){re.escape(value)}(?![\d])")
    word = _word(*spelled) if spelled else (lambda _t: False)
    return lambda text: bool(digits.search(text.replace(",", ""))) or word(text)


_CODE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def _runs(function: str, calls: list[tuple[str, object]]) -> Check:
    """Right when the answer's code (its first fenced block, else the whole text)
    defines `function` and each call returns what it should."""

    def check(text: str) -> bool:
        blocks = _CODE.findall(text)
        code = blocks[0] if blocks else text
        probe = "\n".join(
            f"assert {function}({args}) == {want!r}, {args!r}" for args, want in calls
        )
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-c", f"{code}\n{probe}\n"],
                capture_output=True,
                timeout=10,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0

    return check


QUESTIONS: list[tuple[str, Check]] = [
    ("What is the capital of France?", _word("Paris")),
    ("What is the capital of Japan?", _word("Tokyo")),
    ("What is the capital of Australia?", _word("Canberra")),
    ("Which planet is known as the Red Planet?", _word("Mars")),
    ("At what temperature in degrees Celsius does water boil at sea level?", _number("100")),
    ("How many continents are there?", _number("7", "seven")),
    ("How many legs does a spider have?", _number("8", "eight")),
    ("How many minutes are in an hour?", _number("60", "sixty")),
    ("What is 12 + 7?", _number("19", "nineteen")),
    ("What is 9 times 8?", _number("72", "seventy-two")),
    ("What is 100 divided by 4?", _number("25", "twenty-five")),
    ("Who wrote Romeo and Juliet?", _word("Shakespeare")),
    ("What is the largest ocean on Earth?", _word("Pacific")),
    ("Which gas do plants take in from the air to make food?", _word("carbon dioxide", "CO2")),
    ("What is the chemical symbol for gold?", _word("Au")),
    ("Which language is mainly spoken in Brazil?", _word("Portuguese")),
    ("What is the opposite of hot?", _word("cold")),
    (
        "Write a Python function named square that returns the square of a number.",
        _runs("square", [("3", 9), ("-4", 16)]),
    ),
    (
        "Write a Python function named reverse that reverses a string.",
        _runs("reverse", [("'abc'", "cba"), ("''", "")]),
    ),
    (
        "Write a SQL query that selects every row of the table users.",
        lambda t: bool(re.search(r"select\s+\*\s+from\s+[`\"]?users\b", t, re.I)),
    ),
]


def score(model: str, seeds: int, greedy_too: bool = False) -> dict[str, Any]:
    """Ask each question of `model` once per seed (`greedy_too`: greedy, once, whatever
    its defaults); its figures and answers."""
    from ortserve import TextGenerator

    generator = TextGenerator(model)
    greedy = greedy_too or generator.engine.sampling_defaults.temperature == 0
    sampling: dict[str, Any] = {"temperature": 0.0} if greedy_too else {}
    runs = 1 if greedy else seeds
    answers: list[dict[str, Any]] = []
    right = 0
    seconds = 0.0
    at_limit = 0
    for question, check in QUESTIONS:
        votes = 0
        for seed in range(runs):
            start = time.perf_counter()
            reply = generator.chat(
                [{"role": "user", "content": question}],
                max_new_tokens=NEW_TOKENS,
                seed=seed,
                **sampling,
            )
            seconds += time.perf_counter() - start
            ok = check(reply["generated_text"])
            votes += ok
            at_limit += reply["finish_reason"] == "length"
            answers.append(
                {"question": question, "seed": seed, "right": ok, "answer": reply["generated_text"]}
            )
        right += votes * 2 > runs
    return {
        "model": model,
        "name": generator.model_name,
        "greedy": greedy,
        "defaults": not greedy_too,
        "seeds": runs,
        "right": right,
        "questions": len(QUESTIONS),
        "seconds_per_answer": seconds / (len(QUESTIONS) * runs),
        "at_token_limit": at_limit,
        "answers": answers,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="stored model names or baked folders")
    parser.add_argument("--seeds", type=int, default=3, help="answers per question if sampled")
    parser.add_argument("--greedy", action="store_true", help="greedy, not the defaults")
    parser.add_argument("--out", type=Path, help="write every answer here (JSON)")
    args = parser.parse_args(argv)
    results = []
    print("| model | right of 20 | seeds | s per answer | at the token limit |")
    print("|---|---:|---:|---:|---:|")
    for model in args.models:
        result = score(model, args.seeds, args.greedy)
        results.append(result)
        print(
            f"| {result['name']}{' (greedy)' if args.greedy else ''} | {result['right']} | "
            f"{result['seeds']} | "
            f"{result['seconds_per_answer']:.1f} | {result['at_token_limit']} |",
            flush=True,
        )
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
