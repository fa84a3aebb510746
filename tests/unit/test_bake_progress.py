"""A long bake step says it is alive, and still returns (or times out) like subprocess.run;
the model builder's output becomes progress: layers done of the total, a percentage and the
time left (#27 item 5); the steps that run in-process have the same heartbeat (#39)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ortserve.bake import errors
from ortserve.bake.progress import BuilderProgress


def test_a_long_step_has_a_heartbeat(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(errors, "HEARTBEAT_S", 0.1)
    code = "import sys, time; time.sleep(0.45); print('out'); print('err', file=sys.stderr)"
    proc = errors.run_step([sys.executable, "-c", code], "the model builder")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "out\n", "err\n")
    beats = [line for line in capsys.readouterr().err.splitlines() if "still running" in line]
    assert beats and beats[0].startswith("[bake] the model builder: still running (")


def test_a_step_past_its_timeout_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors, "HEARTBEAT_S", 0.05)
    with pytest.raises(subprocess.TimeoutExpired):
        errors.run_step([sys.executable, "-c", "import time; time.sleep(30)"], "pip", timeout=0.3)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_builders_lines_become_layers_a_percentage_and_a_time_left() -> None:
    out, clock = io.StringIO(), _Clock()
    progress = BuilderProgress(30, stream=out, tty=False, interval=9, clock=clock)
    progress.feed("Loading weights: 100%|██████████| 273/273 [00:02<00:00, 120.5it/s]")
    clock.now += 1
    for layer in range(12):
        progress.feed(f"Reading layer {layer}")
    clock.now += 8
    progress.beat()  # 8 s into the phase: no line yet
    clock.now += 1
    progress.beat()
    clock.now += 12
    progress.feed("Reading LM head")
    progress.feed("Saving ONNX model in /tmp/out")
    progress.feed("Progress: [#########           ] 45.45%")
    clock.now += 30
    progress.beat()
    progress.feed(
        "Saving lm_head.MatMul.weight_Q4G32 (u8, [512,2,16]):  12%|█ | 5/41 [00:00<00:01]"
    )
    progress.close()
    assert out.getvalue().splitlines() == [
        "[bake] the model builder: loading the checkpoint: 273 tensors done in 1 s",
        "[bake] the model builder: building layers: 12/30 layers (40%), 9 s, about 13 s left",
        "[bake] the model builder: building layers: 30 layers done in 21 s",
        "[bake] the model builder: quantizing: 45%, 30 s, about 36 s left",
        # The builder moved on: k_quant's last `Progress: 100%` ends no line before this.
        "[bake] the model builder: quantizing: done in 30 s",
        "[bake] the model builder: saving tensors: 5/41 tensors (12%), 0 s",
    ]


def test_the_streaming_quantizer_is_counted_in_weights() -> None:
    out, clock = io.StringIO(), _Clock()
    progress = BuilderProgress(4, stream=out, tty=False, interval=1, clock=clock)
    progress.feed("Saving ONNX model in /tmp/out")
    progress.feed("Quantizing weight 1/20 /model/layers.0/attn/qkv_proj/MatMul int8")
    progress.feed("Quantizing weight 5/20 /model/layers.0/mlp/down_proj/MatMul int4")
    clock.now += 5
    progress.beat()
    progress.feed("Quantizing weight 20/20 /lm_head/MatMul int8")
    progress.close()
    assert out.getvalue().splitlines() == [
        "[bake] the model builder: quantizing: 5/20 weights (25%), 5 s, about 15 s left",
        "[bake] the model builder: quantizing: 20 weights done in 5 s",
    ]


def test_the_streaming_quantizer_estimates_by_values_not_weights() -> None:
    """#53 item 6: "about 4 s left" before the LM head, then 20 s more: the last weight
    is the biggest, so the share of values done, not of weights, makes the estimate."""
    out, clock = io.StringIO(), _Clock()
    progress = BuilderProgress(4, stream=out, tty=False, interval=1, clock=clock)
    progress.feed("Saving ONNX model in /tmp/out")
    progress.feed("Quantizing weight 1/3 /model/layers.0/attn/qkv_proj/MatMul int4 (values 10/100)")
    progress.feed("Quantizing weight 2/3 /model/layers.0/mlp/down_proj/MatMul int4 (values 25/100)")
    clock.now += 5  # two of three weights (67%) in 5 s, but a quarter of the values
    progress.beat()
    progress.feed("Quantizing weight 3/3 /lm_head/MatMul int4 (values 100/100)")
    progress.close()
    assert out.getvalue().splitlines() == [
        "[bake] the model builder: quantizing: 2/3 weights (25% of the work), 5 s, about 15 s left",
        "[bake] the model builder: quantizing: 3 weights done in 5 s",
    ]


def test_the_default_quantizer_is_counted_in_layers() -> None:
    out, clock = io.StringIO(), _Clock()
    progress = BuilderProgress(4, stream=out, tty=False, interval=1, clock=clock)
    progress.feed("Saving ONNX model in /tmp/out")
    logged = "2026-12-03 13:47:48,859 onnxruntime.quantization.matmul_nbits_quantizer [INFO]"
    progress.feed(f"{logged} - start to quantize /model/layers.1/attn/qkv_proj/MatMul ...")
    clock.now += 5
    progress.beat()
    assert out.getvalue() == (
        "[bake] the model builder: quantizing: 1/4 layers (25%), 5 s, about 15 s left\n"
    )


def test_at_a_terminal_each_phase_is_a_bar() -> None:
    out = io.StringIO()
    progress = BuilderProgress(2, stream=out, tty=True)
    progress.feed("Reading layer 0")
    progress.feed("Saving ONNX model in /tmp/out")
    progress.close()
    text = out.getvalue()
    assert "[bake] builder: building layers:  50%|" in text and "| 1/2 [" in text, text
    assert "[bake] builder: building layers: 100%|" in text and "2/2" in text, text
    assert "[bake] builder: quantizing: " in text, text


def test_a_steps_output_is_read_as_it_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The builder's lines reach the progress while it runs (a bake's log shows them
    minutes before it ends), and its whole output is still kept for the failure message."""
    monkeypatch.setattr(errors, "_TICK_S", 0.05)
    code = (
        "import sys, time\n"
        "print('Reading layer 0'); print('Reading layer 1', flush=True)\n"
        "time.sleep(1.0)\n"
        "print('Reading layer 2'); print('Saving ONNX model in /x')\n"
        "print('\\rProgress: [##  ] 50.00%', end='', flush=True)\n"
        "print('boom', file=sys.stderr); sys.exit(3)\n"
    )
    out = io.StringIO()
    progress = BuilderProgress(3, stream=out, tty=False, interval=0.3)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = errors.run_step(
        [sys.executable, "-c", code], "the model builder", env=env, progress=progress
    )
    assert proc.returncode == 3 and proc.stderr == "boom\n"
    assert proc.stdout == (
        "Reading layer 0\nReading layer 1\nReading layer 2\n"
        "Saving ONNX model in /x\n\nProgress: [##  ] 50.00%"
    )
    lines = out.getvalue().splitlines()
    assert any(": building layers: 2/3 layers (67%), " in line for line in lines), lines
    assert lines[-2:] == [
        "[bake] the model builder: building layers: 3 layers done in 1 s",
        "[bake] the model builder: quantizing: 50%, 0 s",
    ]


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """Python's own SIGINT handler, as in `ortserve bake` run from a terminal (a pytest-xdist
    worker ignores SIGINT: its controller handles Ctrl-C)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_a_ctrl_c_while_the_step_starts_still_kills_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal in Popen()'s window (the child exec'd, Popen() not yet returned) used to
    leave the step running alone: now it is held and delivered once the step is owned."""
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen_then_ctrl_c(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        started.append(proc)
        os.kill(os.getpid(), signal.SIGINT)  # as if it came just before Popen() returned
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        errors.run_step([sys.executable, "-c", "import time; time.sleep(60)"], "a step")
    (proc,) = started
    assert proc.returncode is not None  # killed and reaped, not left sleeping
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


@pytest.mark.usefixtures("ctrl_c_raises")
def test_signals_held_are_delivered_even_when_the_step_cannot_start() -> None:
    with pytest.raises(FileNotFoundError):
        errors.run_step(["/no/such/program"], "a step")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    held = errors._SignalsHeld()
    os.kill(os.getpid(), signal.SIGINT)  # held: no KeyboardInterrupt here
    with pytest.raises(KeyboardInterrupt):
        held.release()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_pip_steps_heartbeat_names_the_step_not_its_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """#35 item 10: "cannot download the x86_64 wheels ...: still running" read like an
    error; the heartbeat names pip's command, the failure keeps its words."""
    from ortserve.bake import package_edge
    from ortserve.bake.errors import BakeError

    monkeypatch.setattr(errors, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(errors, "_TICK_S", 0.05)
    sleeper = [sys.executable, "-c", "import time; time.sleep(0.3)"]
    real = errors.run_step
    monkeypatch.setattr(package_edge, "run_step", lambda cmd, what, **kw: real(sleeper, what, **kw))
    package_edge._pip(["download", "x"], "cannot download the x86_64 wheels", "hint")
    beats = [line for line in capsys.readouterr().err.splitlines() if "still running" in line]
    assert beats and all(b.startswith("[bake] pip download: still running (") for b in beats)
    failing = [sys.executable, "-c", "import sys; sys.exit('ERROR: no such wheel')"]
    monkeypatch.setattr(package_edge, "run_step", lambda cmd, what, **kw: real(failing, what, **kw))
    with pytest.raises(BakeError, match=r"^cannot download the x86_64 wheels: no such wheel; hint"):
        package_edge._pip(["download", "x"], "cannot download the x86_64 wheels", "hint")


def _beats(text: str, what: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"{what}: still running (")]


def test_an_in_process_step_has_the_same_heartbeat_and_it_stops_with_the_step(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(errors, "HEARTBEAT_S", 0.05)
    with errors.heartbeat("GGUF x.gguf: converting"):
        time.sleep(0.3)
    beats = _beats(capsys.readouterr().err, "[bake] GGUF x.gguf: converting")
    assert 2 <= len(beats) <= 6, beats
    time.sleep(0.2)
    assert capsys.readouterr().err == ""  # no beat once the step is over


def test_the_gguf_conversion_has_a_heartbeat(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """#39: the conversion (transformers, in-process) said nothing for 78 s."""
    from ortserve.bake import gguf

    def slow_convert(source: Path, out: Path, digest: str) -> None:
        time.sleep(0.3)
        out.mkdir(parents=True)
        for name in (*gguf._NEEDED, gguf.CHECKPOINT_WEIGHTS[0]):
            (out / name).write_text("{}")

    monkeypatch.setattr(errors, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(gguf, "_convert", slow_convert)
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF")
    out = gguf.checkpoint_from_gguf(source, tmp_path / "cache")
    assert (out / "config.json").is_file()
    assert _beats(capsys.readouterr().err, "[bake] GGUF m.gguf: converting")


def test_the_quality_gate_has_a_heartbeat(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """#39: the gate (transformers' load and forward, in-process) said nothing for 44 s."""
    from ortserve.bake import quality

    ids = [1, 2, 3, 4]
    logits = np.random.default_rng(0).normal(size=(len(ids), 8))

    def slow_reference(
        checkpoint: Path, scored: list[int], adapter: Path | None = None
    ) -> np.ndarray[Any, Any]:
        time.sleep(0.3)
        return logits

    class Baked:
        context_length = 0

        def logits(self, scored: list[int], adapter: str | None = None) -> np.ndarray[Any, Any]:
            time.sleep(0.3)
            return logits

    monkeypatch.setattr(errors, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(quality, "_gate_ids", lambda checkpoint: ids)
    monkeypatch.setattr(quality, "_reference_logits", slow_reference)
    scored = quality.reference(tmp_path, Baked.context_length)
    result = quality.check(scored, Baked(), 1.25, random_weights=False)
    assert result.status == "passed" and result.ppl_ratio == 1.0
    # Its two steps each have their own count (one name twice read as a counter restarting).
    err = capsys.readouterr().err
    assert _beats(err, "[bake] quality gate, the reference"), err
    assert _beats(err, "[bake] quality gate, the baked model"), err


def test_the_makefiles_heartbeat_runs_the_command_as_it_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make demo`'s pip install goes through errors.py as a script (tests/unit/
    test_make_install.py): its exit status, its output untouched, a beat on stdout."""
    monkeypatch.setattr(errors, "HEARTBEAT_S", 0.05)
    code = "import time; time.sleep(0.3); print('Successfully installed'); raise SystemExit(3)"
    assert errors._main(["make: pip install", sys.executable, "-c", code]) == 3
    out = capsys.readouterr().out
    assert _beats(out, "make: pip install"), out
