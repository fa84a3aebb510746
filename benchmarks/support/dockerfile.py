"""Reading a Dockerfile without a Docker engine: its instructions, the final stage's ENV and
the build steps that a test or a benchmark repeats outside Docker.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TASK_ROOT = "${LAMBDA_TASK_ROOT}"


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: its keyword and its arguments as written."""

    keyword: str
    args: str

    def words(self) -> list[str]:
        """The arguments, JSON (exec) form or shell-split."""
        if self.args.startswith("["):
            return [str(w) for w in json.loads(self.args)]
        return shlex.split(self.args)


def parse(path: Path) -> list[Instruction]:
    """Instructions of a Dockerfile (continuations joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            keyword, _, args = line.partition(" ")
            out.append(Instruction(keyword.upper(), args.strip()))
    return out


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    """The instructions of the last build stage (the image Lambda runs)."""
    starts = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    return instructions[starts[-1] :]


def env_of(instructions: list[Instruction]) -> dict[str, str]:
    """The ENV values the final image has (later ones win)."""
    env: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "ENV":
            env.update(word.split("=", 1) for word in ins.words())  # type: ignore[misc]
    return env


def image_env(dockerfile: Path, task_root: Path) -> dict[str, str]:
    """The final image's ENV with the task root replaced by a local folder."""
    env = env_of(final_stage(parse(dockerfile)))
    return {k: v.replace(TASK_ROOT, str(task_root)) for k, v in env.items()}


def compile_steps(dockerfile: Path) -> list[list[str]]:
    """The final stage's `python3 -m compileall` RUN steps, as argument lists."""
    steps = []
    for ins in final_stage(parse(dockerfile)):
        if ins.keyword == "RUN" and "compileall" in ins.args:
            steps.append(ins.words())
    return steps


def run_compile_steps(dockerfile: Path, task_root: Path) -> int:
    """Run the image's bytecode steps on a local bundle with this interpreter.

    Returns:
        How many steps ran.
    """
    steps = compile_steps(dockerfile)
    for words in steps:
        command = [
            sys.executable if w == "python3" else w.replace(TASK_ROOT, str(task_root))
            for w in words
        ]
        subprocess.run(command, check=True, timeout=300)
    return len(steps)
