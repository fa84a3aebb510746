"""A new user's first hour (#39), scripted, against what `make demo` serves: the real
Qwen2.5-Coder-0.5B-Instruct (#53: chosen by its answers), in a fresh home (the suite's
cached bake stored where `make demo` looks, so nothing is baked or downloaded), with every
entry point at its defaults (no sampling option sent). Each step checks the answer's sense,
not only its status: the demo's own question, `ortserve run` once and in a terminal, the
openai client's chat and Responses, the ollama client, and the playground in Chromium. The
docs' examples run against the same model in test_readme_examples.py."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest

from benchmarks.support.servers import ORTSERVE, ServerProcess
from tests.functional.storehelp import demo, spec, store_env, stored
from tests.functional.terminal import Terminal
from tests.functional.test_playground import run_browser
from tests.models import DEMO_MODEL, run_ortserve

QUESTION = "What is the capital of France?"
NAME = DEMO_MODEL  # a catalog name is its stored name, as `make demo` serves it
ANSWER = re.compile(r"\bParis\b")


@pytest.fixture(scope="module")
def first_hour(
    tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path
) -> Iterator[tuple[Path, ServerProcess]]:
    """`make demo` (its own question) serving the real model from a fresh home."""
    base = tmp_path_factory.mktemp("first-hour")
    home = base / "home"
    stored(home, spec(DEMO_MODEL), demo_model_dir)
    with demo(home, base / "venv", DEMO_MODEL, prompt=None) as server:
        yield home, server


def test_make_demo_answers_its_own_question(first_hour: tuple[Path, ServerProcess]) -> None:
    _, server = first_hour
    assert "Berlin" in server.stdout(), server.stdout()[-2000:]


def test_ortserve_run_answers_once(first_hour: tuple[Path, ServerProcess]) -> None:
    home, _ = first_hour
    proc = run_ortserve("run", NAME, QUESTION, env=store_env(home))
    assert proc.returncode == 0, proc.stderr
    assert ANSWER.search(proc.stdout), proc.stdout


def test_ortserve_run_chats_at_a_terminal(first_hour: tuple[Path, ServerProcess]) -> None:
    home, _ = first_hour
    term = Terminal([*ORTSERVE, "run", NAME], {**os.environ, **store_env(home)})
    term.expect(rb">>> ")
    term.type(QUESTION.encode() + b"\r")
    answer = term.expect(rb">>> ", timeout=120).decode(errors="replace")
    assert ANSWER.search(answer), answer
    term.type(b"/bye\r")
    assert term.exit_code() == 0


def test_the_openai_client_chats_and_responds(first_hour: tuple[Path, ServerProcess]) -> None:
    _, server = first_hour
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="none")
    chat = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": QUESTION}]
    )
    assert ANSWER.search(chat.choices[0].message.content or ""), chat
    response = client.responses.create(model=NAME, input=QUESTION)
    assert ANSWER.search(response.output_text), response


def test_the_ollama_client_chats(first_hour: tuple[Path, ServerProcess]) -> None:
    _, server = first_hour
    reply = ollama.Client(host=server.base).chat(
        model=NAME, messages=[{"role": "user", "content": QUESTION}]
    )
    assert ANSWER.search(reply.message.content or ""), reply


def test_the_playground_answers_in_chromium(
    first_hour: tuple[Path, ServerProcess], tmp_path: Path
) -> None:
    _, server = first_hour
    result = run_browser(server.base, "", tmp_path, QUESTION, first_only=True)
    assert result["problems"] == [], result
    assert ANSWER.search(result["text"]), result
    # The page sent no sampling option: the model's defaults, as everywhere.
    sent = result["firstBody"]
    assert not {"temperature", "top_p", "top_k", "repetition_penalty"} & sent.keys(), sent
