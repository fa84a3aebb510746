"""The documented example requests work as written against what `make demo` serves (#27 item
2): README.md's first request, then every `curl` and Python example of the HTTP API page's
"Calling it" (docs/api.md) up to the Ollama API's, run in order against `make demo`'s
server. The store holds the suite's bake of `make demo`'s real model where `make demo` looks
for it (`qwen2.5-coder:0.5b`), so nothing is baked or downloaded; the examples name the model
as `make demo` serves it, and only the port is changed; each answer is read for a loop
(#39: at the defaults, greedy SmolLM2 looped)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import subprocess
from pathlib import Path

from benchmarks.sampling_profiles import looped
from tests.functional.storehelp import demo, spec, stored
from tests.models import DEMO_MODEL, ROOT

# (file, first heading, the heading that ends the examples): README.md's first request,
# then the API page from the first request example to the end of the Ollama API's.
SECTIONS = (
    (ROOT / "README.md", "## A first request", "## Documentation"),
    (ROOT / "docs" / "api.md", "## Calling it", "## Prompts and text"),
)
DEMO_ADDRESS = "8000"  # make demo's port, as the examples write it


def _examples() -> tuple[list[str], list[str]]:
    """The sections' shell commands (each `curl` whole, its lines joined) and Python
    blocks, in the pages' order."""
    commands: list[str] = []
    python: list[str] = []
    for path, first, last in SECTIONS:
        text = path.read_text(encoding="utf-8")
        section = text[text.index(first) : text.index(last)]
        for lang, body in re.findall(r"```(sh|python)\n(.*?)```", section, re.DOTALL):
            if lang == "python":
                python.append(body)
                continue
            pending = ""
            for line in body.splitlines():
                pending = f"{pending}\n{line}" if pending else line
                try:
                    words = shlex.split(pending, comments=True)
                except ValueError:  # a quote still open: the command goes on
                    continue
                if words:
                    commands.append(pending)
                pending = ""
            assert not pending, f"unfinished command in {path.name}: {pending!r}"
    return commands, python


def test_the_readme_examples_are_found() -> None:
    # The suite's stand-in for `make demo`'s model is the Makefile's MODEL.
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^MODEL\s+\?=\s*(\S+)$", makefile, re.M)[1] == DEMO_MODEL  # type: ignore[index]
    commands, python = _examples()
    assert len(commands) >= 8 and len(python) >= 4, (commands, python)
    assert all(shlex.split(c, comments=True)[0] == "curl" for c in commands), commands
    assert all(f"localhost:{DEMO_ADDRESS}/" in c for c in commands), commands
    assert all(f"127.0.0.1:{DEMO_ADDRESS}" in p or "client." in p for p in python), python


# The keys under which a reply (whole, a stream's events, NDJSON lines) carries its text.
_TEXT_KEYS = {"content", "text", "generated_text", "response", "delta", "output_text"}


def _reply_text(output: str) -> str:
    """The generated text in a curl's output (JSON, SSE events or NDJSON lines): every
    string under a text key, in order ("" for a reply without one, e.g. /v1/models)."""
    found: list[str] = []

    def walk(node: object, key: str = "") -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif isinstance(node, str) and key in _TEXT_KEYS:
            found.append(node)

    for line in output.splitlines() or [output]:
        with contextlib.suppress(ValueError):
            walk(json.loads(line.removeprefix("data: ").strip()))
    return "".join(found)


def _check_the_pages_tool_call(output: str) -> None:
    """#53 item 7: the call the API page says its tool-calling curl gets is the one it
    gets (it said `{"city": "Paris"}`; the 135M model answered `{"city": "Paris,"}`)."""
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    said = re.search(r"gets `(\w+)` with the arguments `(\{.*?\})`", page, re.DOTALL)
    assert said is not None, "docs/api.md no longer says what its tool-calling curl gets"
    (call,) = json.loads(output)["choices"][0]["message"]["tool_calls"]
    got = (call["function"]["name"], json.loads(call["function"]["arguments"]))
    assert got == (said[1], json.loads(said[2])), got


def test_the_readme_examples_work_against_make_demo(tmp_path: Path, demo_model_dir: Path) -> None:
    """At the defaults, with the real model `make demo` serves: each answer is there and
    makes sense as text (no loop), not only a 200."""
    home = tmp_path / "home"
    stored(home, spec(DEMO_MODEL), demo_model_dir)
    commands, python = _examples()
    answered = 0
    with demo(home, tmp_path / "venv", DEMO_MODEL) as server:
        address = f"127.0.0.1:{server.port}"
        for command in commands:
            args = [
                a.replace(f"localhost:{DEMO_ADDRESS}", address)
                for a in shlex.split(command, comments=True)
            ]
            proc = subprocess.run(
                [*args, "--fail-with-body", "--max-time", "120"],
                capture_output=True,
                text=True,
                check=False,
            )
            assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
            assert proc.stdout.strip(), command
            if '"tool_choice": "required"' in command:
                _check_the_pages_tool_call(proc.stdout)
            text = _reply_text(proc.stdout)
            assert not looped(text), (command, text)
            answered += bool(text.strip())
        namespace: dict[str, object] = {}
        for block in python:
            code = block.replace(f"127.0.0.1:{DEMO_ADDRESS}", address)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(code, "docs/api.md", "exec"), namespace)  # the page's own code
            assert printed.getvalue().strip(), block
            assert not looped(printed.getvalue()), (block, printed.getvalue())
    assert answered >= 6, answered  # the generation examples' text was found and read
