"""The `ortserve` command as a user meets it: version, help, completion, bad invocations."""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.support.servers import ORTSERVE, free_port, serve_process
from tests.functional.harness import SERVER_ENV
from tests.models import SOURCE_CACHE, run_ortserve


def test_version_names_ortserve_and_its_runtime() -> None:
    proc = run_ortserve("--version")
    assert proc.returncode == 0
    assert re.fullmatch(r"ortserve \S+ \(onnxruntime-genai \d+\.\d+\.\d+\)\n", proc.stdout)


def test_help_lists_the_commands_and_each_option_says_its_default() -> None:
    top = run_ortserve("--help").stdout
    for command in ("generate", "probe", "bake", "serve", "completion"):
        assert re.search(rf"^\s+{command}\s", top, re.MULTILINE), command
    assert "entry-point" not in top  # the plugin mechanism is not a user's business
    generate = run_ortserve("generate", "--help").stdout
    assert "(default: 64)" in generate
    # The sampling options' default is the model's (#39), said as such.
    assert re.search(r"0 is greedy \(default: the\s+model's", generate), generate


def test_completion_scripts() -> None:
    for shell in ("bash", "zsh"):
        proc = run_ortserve("completion", shell)
        assert proc.returncode == 0, proc.stderr
        for word in ("generate", "bake", "serve", "--max-new-tokens"):
            assert word in proc.stdout, (shell, word)


def test_bad_invocations_get_one_clear_line(tiny_gcf_bundle: Path) -> None:
    bad = run_ortserve("generate", "--max-new-tokens", "-5", "hi")
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .endswith("argument --max-new-tokens: must be at least 1, got -5")
    )
    assert "KV cache" not in bad.stderr
    bundle = run_ortserve("generate", "--model-dir", str(tiny_gcf_bundle), "hi")
    assert bundle.returncode == 1
    lines = bundle.stderr.strip().splitlines()
    assert len(lines) == 1 and "its model folder is" in lines[0], bundle.stderr
    assert str(tiny_gcf_bundle / "model") in lines[0]


def _run_until_ready(cmd: list[str], env: dict[str, str], port: int) -> str:
    """Start `cmd`, wait for /readyz on `port`, SIGTERM it (exit 0 then); its stderr."""
    with serve_process(cmd, env, port, ready_timeout_s=300, stderr_apart=True) as server:
        assert server.stop() == 0, server.stderr()
        return server.stderr()


def _serve_log(model_dir: Path, level: str) -> str:
    """stderr of `ortserve serve` from start to a SIGTERM once it is ready."""
    port = free_port()
    env = {**os.environ, **SERVER_ENV, "ORTSERVE_LOG_LEVEL": level, "ORTSERVE_PROVIDERS": "auto"}
    cmd = [*ORTSERVE, "serve", "--model-dir", str(model_dir), "--port", str(port)]
    return _run_until_ready(cmd, env, port)


def test_daemon_log_lines_carry_time_and_level(tiny_model_dir: Path) -> None:
    lines = _serve_log(tiny_model_dir, "info").strip().splitlines()
    stamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) ")
    assert lines and all(stamp.match(line) for line in lines), lines
    ready = next(line for line in lines if " ready on " in line)
    # Short (#27 item 10): model, EP, threads; the providers it passed over are in /readyz.
    assert "{" not in ready and "cuda" not in ready and len(ready) < 150, ready
    quiet = _serve_log(tiny_model_dir, "WARNING")
    assert " INFO " not in quiet, quiet


@pytest.mark.slow
def test_run_with_a_recipe_is_another_stored_bake(tmp_path: Path) -> None:
    env = {
        **os.environ,
        **SERVER_ENV,
        "ORTSERVE_HOME": str(tmp_path / "home"),
        "ORTSERVE_CACHE_DIR": str(SOURCE_CACHE),
    }
    port = free_port()
    run = [*ORTSERVE, "run", "builtin:tiny-llama", "--port", str(port)]
    assert "baking" in _run_until_ready([*run, "--recipe", "k-quant-mixed"], env, port)
    assert "is in the store" in _run_until_ready([*run, "--recipe", "k-quant-mixed"], env, port)
    assert "baking" in _run_until_ready(run, env, port)
    manifests = sorted((tmp_path / "home" / "models").glob("*/model/manifest.json"))
    recipes = sorted(json.loads(p.read_text())["builder_options"]["recipe"] for p in manifests)
    assert recipes == ["k-quant-mixed", "q4km-like"]
    bad = subprocess.run(
        [*run, "--recipe", "best"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1 and "unknown recipe 'best'" in bad.stderr


@pytest.mark.slow
def test_run_bakes_once_into_the_store_then_list_show_serve_rm(tmp_path: Path) -> None:
    env = {
        **os.environ,
        **SERVER_ENV,
        "ORTSERVE_HOME": str(tmp_path / "home"),
        "ORTSERVE_CACHE_DIR": str(SOURCE_CACHE),
    }
    port = free_port()
    run = [*ORTSERVE, "run", "builtin:tiny-llama", "--port", str(port)]
    first = _run_until_ready(run, env, port)
    assert "ortserve run: baking builtin:tiny-llama" in first
    second = _run_until_ready(run, env, port)
    assert "is in the store" in second and "baking" not in second
    listed = run_ortserve("list", env=env).stdout.splitlines()
    assert listed[0].split()[:5] == ["NAME", "ID", "TARGET", "PRECISION", "SIZE"]
    (row,) = listed[1:]
    short, name = row.split()[:2]
    assert short == "tiny-llama" and name.startswith("tiny-llama-edge-")
    assert "int4" in row and "random weights" in row
    shown = run_ortserve("show", "tiny-llama", env=env)
    assert shown.returncode == 0 and "quality:" in shown.stdout, shown.stderr
    assert "sampling:   greedy, repetition_penalty 1.0 (generation_config.json)" in shown.stdout
    serve = [*ORTSERVE, "serve", "--model-dir", name, "--port", str(port)]
    _run_until_ready(serve, env, port)
    assert run_ortserve("rm", name, env=env).stdout.strip() == f"removed {short} ({name})"
    assert "no models in" in run_ortserve("list", env=env).stdout
    missing = run_ortserve("rm", name, env=env)
    assert missing.returncode == 1 and "no stored model" in missing.stderr


def test_ctrl_c_during_generate_is_one_line_and_exit_130(tiny_model_dir: Path) -> None:
    n = "2000"  # about 5 kB of text from the tiny model: more than the pipe below holds
    env = {**os.environ, "ORTSERVE_MAX_NEW_TOKENS": n, "ORTSERVE_PROVIDERS": "cpu"}
    cmd = [
        *ORTSERVE,
        "generate",
        "--model-dir",
        str(tiny_model_dir),
        "--max-new-tokens",
        n,
        "Hello",
    ]
    with _sigint_as_in_a_terminal():
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        # A 4 kB pipe that is not read: the generation fills it and waits on it, surely
        # mid-stream when the signal comes.
        fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        deadline = time.monotonic() + 120
        while _unread(proc.stdout.fileno()) < 3500 and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.decode().strip().splitlines() == ["ortserve generate: interrupted"]


@contextlib.contextmanager
def _sigint_as_in_a_terminal() -> Iterator[None]:
    """Commands started within get SIGINT at its default action, as a shell at a terminal
    starts them. A test run started in the background by a shell without job control
    (`make test &` in a script) has SIGINT ignored, which children inherit, exec keeps and
    Python then leaves alone: the command ignored the Ctrl-C these tests send and
    finished with 0 (both failed so; their SIGTERM twin passed). A handler, unlike
    SIG_IGN, is reset to the default by exec; it is this process's own only meanwhile."""
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _unread(fd: int) -> int:
    """Bytes waiting in the pipe `fd` reads."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


def _builder_of(folder: Path, bake: int) -> int | None:
    """The pid of the model builder baking under `folder`, if one runs: the bake's child
    (not one of the builder's own helpers, forked with its command line a moment)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError, IndexError):
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            parent = int((cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if "ortserve.bake.upstream" in text and str(folder) in text and parent == bake:
                return int(cmdline.parent.name)
    return None


def _state(pid: int) -> str | None:
    """Process `pid`'s state (R running, S sleeping, Z zombie, ...), None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


def _in_group(stat: Path, group: int) -> bool:
    """Whether the process of /proc/PID/`stat` is in process group `group`."""
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[2]) == group
    except (OSError, IndexError, ValueError):
        return False


def _running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, dead but not yet reaped, does not)."""
    return _state(pid) not in (None, "Z", "X")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_a_bake_stopped_by_a_signal_says_one_line_and_leaves_nothing(
    tmp_path: Path, sig: signal.Signals, code: int, said: str
) -> None:
    """Ctrl-C or SIGTERM while the model builder runs: one line, 130 or 143, no temporary
    folder beside the output (where `ortserve run` keeps its store) and no builder left."""
    store = tmp_path / "store"
    cmd = [
        *ORTSERVE,
        "bake",
        "--model",
        "builtin:tiny-llama",
        "--target",
        "edge-x86_64",
        "--model-only",
        "--out",
        str(store / "tiny"),
    ]
    env = {**os.environ, "ORTSERVE_CACHE_DIR": str(tmp_path / "cache")}
    with _sigint_as_in_a_terminal():
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    try:
        assert proc.stderr is not None
        said_before = []
        for line in proc.stderr:  # the builder (a child) starts after this line
            said_before.append(line)
            if "converting with the onnxruntime-genai builder" in line:
                break
        # The builder runs, and the bake sleeps waiting for it (not still in Popen(),
        # between the builder's exec and the `with` that owns it: a window a loaded
        # machine widens).
        deadline = time.monotonic() + 30
        while (builder := _builder_of(store, proc.pid)) is None or _state(proc.pid) != "S":
            assert proc.poll() is None and time.monotonic() < deadline, said_before
            time.sleep(0.01)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1] == f"ortserve bake: {said}", err
    assert "Traceback" not in err, err
    assert list(store.iterdir()) == [], "a partial folder was left in the store"
    assert not _running(builder), "the model builder outlived the bake"
    helpers = [  # what the builder started: its process group (the bake's `run_step`)
        stat.parent.name
        for stat in Path("/proc").glob("[0-9]*/stat")
        if _in_group(stat, builder) and _running(int(stat.parent.name))
    ]
    assert not helpers, f"the builder's helpers outlived the bake: {helpers}"


@pytest.mark.parametrize("command", ["show", "completion"])
def test_a_closed_stdout_gets_no_traceback(tiny_model_dir: Path, command: str) -> None:
    """`ortserve show X | head` where head has already left: no BrokenPipe traceback."""
    args = [str(tiny_model_dir)] if command == "show" else ["zsh"]
    proc = subprocess.Popen(
        [*ORTSERVE, command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # no reader left before it writes: each write is EPIPE
    err = proc.stderr.read()
    assert proc.wait(60) == 1
    assert err == ""
