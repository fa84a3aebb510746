"""The edge daemon's engine process (core.engine_process), through the real daemon: a
fault in the engine (a signal, weights changed under it) costs only the requests in it;
the daemon answers its probes throughout, says why, restarts the engine and serves again,
and refuses a request that was in the engine at two faults."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import models
from tests.functional.test_edge_daemon import LONG, PROMPT, Daemon

pytestmark = pytest.mark.slow

WAIT_S = 600  # the longest a request here may take before the test calls it hung
KEY = "engine-test-key"
OTHER_KEY = "engine-test-other-key"  # another tenant


@pytest.fixture
def start(tiny_model_dir: Path) -> Iterator[Any]:
    daemons: list[Daemon] = []

    def start_daemon(model_dir: Path | None = None, **env: str) -> Daemon:
        settings = {"API_KEYS": KEY, **env}
        daemon = Daemon(
            model_dir or tiny_model_dir, {f"ORTSERVE_{k}": v for k, v in settings.items()}
        )
        # A probe shows the engine's pid (and the requests in it) only to a request with a key.
        daemon.http.headers["authorization"] = f"Bearer {KEY}"
        daemons.append(daemon)
        daemon.wait_for("READY=1")
        return daemon

    yield start_daemon
    for daemon in daemons:
        daemon.close()


def _engine(daemon: Daemon) -> dict[str, Any]:
    engine: dict[str, Any] = daemon.http.get("/healthz").json()["engine"]
    return engine


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not reaped, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def _healthy_until(daemon: Daemon, stop: threading.Event, seen: list[int]) -> None:
    """Ask /healthz until `stop`; each answer's status code goes to `seen`."""
    with httpx.Client(base_url=daemon.url, timeout=5) as client:
        while not stop.is_set():
            seen.append(client.get("/healthz").status_code)
            time.sleep(0.01)


@pytest.mark.parametrize(
    "sig", [signal.SIGSEGV, signal.SIGKILL, signal.SIGBUS], ids=lambda s: str(s.name)
)
def test_a_signal_mid_stream_ends_that_stream_with_an_error_event_and_the_engine_comes_back(
    start: Any, sig: signal.Signals
) -> None:
    daemon = start(MAX_NEW_TOKENS=str(LONG))
    engine = _engine(daemon)
    assert engine["process"] == "separate" and engine["state"] == "ready"
    pid = engine["pid"]
    assert pid != daemon.proc.pid and _running(pid)
    probes: list[int] = []
    stop = threading.Event()
    prober = threading.Thread(target=_healthy_until, args=(daemon, stop, probes))
    prober.start()
    body = {"prompt": PROMPT, "max_new_tokens": LONG, "stream": True}
    try:
        with daemon.http.stream("POST", "/generate", json=body) as reply:
            chunks = reply.iter_raw()
            first = next(chunks)
            os.kill(pid, sig)
            rest = b"".join(chunks)
        # The next request waits for the new engine and is served.
        again = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 8})
    finally:
        stop.set()
        prober.join()
    events = [
        json.loads(b.removeprefix("data: ")) for b in (first + rest).decode().split("\n\n") if b
    ]
    assert events[-1]["error"]["code"] == "engine_restarting", events[-1]
    assert sig.name in events[-1]["error"]["message"]
    assert again.status_code == 200, again.text
    assert again.json()["tokens_generated"] == 8
    assert probes and set(probes) == {200}  # /healthz answered throughout
    engine = _engine(daemon)
    assert engine["state"] == "ready" and engine["restarts"] == {sig.name: 1}
    assert engine["last_exit"] == sig.name and engine["pid"] != pid
    metrics = daemon.http.get("/metrics").text
    assert f'ortserve_engine_restarts_total{{cause="{sig.name}"}} 1.0' in metrics
    assert f"ended: {sig.name}; restarting it" in daemon.stderr()
    new_pid = engine["pid"]
    assert daemon.stop() == 0
    deadline = time.monotonic() + 10  # the engine ends with the daemon
    while _running(new_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(new_pid)


@pytest.mark.parametrize(
    "sig", [signal.SIGSEGV, signal.SIGKILL, signal.SIGBUS], ids=lambda s: str(s.name)
)
def test_a_signal_mid_prefill_is_a_503_to_retry_and_a_request_in_two_faults_is_refused(
    start: Any, sig: signal.Signals
) -> None:
    # The 135M shape and small prefill parts: a 1,500-token prompt's prefill takes from
    # about a second (a quiet AMD EPYC) to 25 s (a quiet 2-vCPU Xeon; more beside the
    # suite's other workers), so the kill lands in it (before the first token). No prompt
    # cache: a retried prompt would be in it, with next to nothing to prefill. The waits
    # are for that slowest case: they bound a hang, they time nothing.
    # Two tenants (issue 49): a fault counts against the tenant whose request was in it;
    # another tenant sending the same prompt is not refused (nor can it get it refused).
    daemon = start(
        models.shape_135m(),
        PREFILL_CHUNK_TOKENS="16",
        MAX_BATCH="1",
        PROMPT_CACHE_SLOTS="0",
        API_KEYS=f"{KEY},{OTHER_KEY}",
    )
    body = {"prompt": "The quick brown fox jumps. " * 250, "max_new_tokens": 1}

    def killed_mid_prefill() -> httpx.Response:
        answer: dict[str, httpx.Response] = {}

        def ask() -> None:
            with httpx.Client(
                base_url=daemon.url, timeout=WAIT_S, headers={"authorization": f"Bearer {KEY}"}
            ) as client:
                answer["reply"] = client.post("/generate", json=body)

        pid = _engine(daemon)["pid"]
        asking = threading.Thread(target=ask)
        asking.start()
        deadline = time.monotonic() + 10
        while daemon.http.get("/healthz").json()["active"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        time.sleep(0.1)  # into the prefill's parts
        os.kill(pid, sig)
        asking.join(WAIT_S)
        return answer["reply"]

    first = killed_mid_prefill()
    assert first.status_code == 503, first.text
    assert first.headers["retry-after"] == "5"
    assert first.json()["error"]["code"] == "engine_restarting"
    assert sig.name in first.json()["error"]["message"]
    if sig != signal.SIGSEGV:  # the rest does not depend on the signal: once is enough
        short = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 4})
        assert short.status_code == 200, short.text  # the engine is back
        assert _engine(daemon)["restarts"] == {sig.name: 1}
        return
    retried = daemon.http.post("/generate", json=body, timeout=WAIT_S)  # a retry is served
    assert retried.status_code == 200, retried.text
    assert killed_mid_prefill().status_code == 503  # the same request, in a second fault
    refused = daemon.http.post("/generate", json=body)
    assert refused.status_code == 400
    assert "twice" in refused.json()["error"]["message"]
    other = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 4})
    assert other.status_code == 200, other.text
    theirs = daemon.http.post(
        "/generate", json=body, headers={"authorization": f"Bearer {OTHER_KEY}"}, timeout=WAIT_S
    )
    assert theirs.status_code == 200, theirs.text  # the same prompt, another tenant: served
    assert _engine(daemon)["restarts"] == {sig.name: 2}


def test_weights_truncated_under_the_engine_leave_the_daemon_up_and_saying_why(
    start: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    daemon = start(folder)
    data = next(folder.glob("*.onnx.data"))
    size = data.stat().st_size
    with data.open("r+b") as handle:  # as a `cp` over it does, before it writes
        handle.truncate(size // 2)
    fault = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 8})
    assert fault.status_code == 503, fault.text  # SIGBUS in the engine, not in the daemon
    assert daemon.proc.poll() is None
    deadline = time.monotonic() + 30
    while _engine(daemon)["state"] == "restarting":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert daemon.http.get("/healthz").status_code == 200
    ready = daemon.http.get("/readyz")
    assert ready.status_code == 503 and ready.json()["status"] == "failed"
    engine = ready.json()["engine"]
    assert engine["restarts"] == {"SIGBUS": 1}
    assert f"has {size // 2} bytes, the manifest says {size}" in engine["reason"]
    refused = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 8})
    assert refused.status_code == 503 and "retry-after" not in refused.headers
    # The files put back, a reload (SIGHUP) serves them again.
    shutil.copyfile(tiny_model_dir / data.name, data)
    daemon.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while daemon.http.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, daemon.stderr()
        time.sleep(0.05)
    served = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 8})
    assert served.status_code == 200, served.text
    assert daemon.stop() == 0


def test_an_allocation_past_the_engine_ceiling_fails_that_request_and_nothing_else() -> None:
    """ORTSERVE_ENGINE_MEMORY_MB (RLIMIT_DATA) in the engine process: a request whose KV
    cache would pass it fails at its start; the engine, and the next request, go on."""
    from ortserve.core.errors import GenerationError
    from ortserve.core.generation import GenerationRequest, SamplingOptions
    from ortserve.core.service import Service
    from ortserve.core.settings import EngineSettings

    # The 135M shape: ~280 MiB of data after the load; 8,000 tokens of KV cache are
    # 360 MiB more (og allocates a sequence's whole room at its start).
    settings = EngineSettings(
        model_dir=models.shape_135m(),
        providers="cpu",
        engine_process=True,
        engine_memory_mb=400,
        prompt_cache_slots=0,
    )
    service = Service.load(settings)
    try:
        pid = service.engine.model.describe()["pid"]

        def first_tokens(new: int) -> list[str]:
            options = SamplingOptions(max_new_tokens=new, min_new_tokens=2)
            stream = service.stream(GenerationRequest(prompt="Hi there", options=options))
            try:
                return [next(stream), next(stream)]
            finally:
                stream.close()

        assert len(first_tokens(16)) == 2
        with pytest.raises(GenerationError, match="Could not allocate the key-value cache"):
            first_tokens(8000)
        assert len(first_tokens(16)) == 2
        engine = service.engine.model.describe()
        assert engine["pid"] == pid and engine["restarts"] == {}
    finally:
        service.engine.close()


def test_closing_the_engine_ends_a_stream_reading_from_it(tiny_model_dir: Path) -> None:
    """A reload retires the old model's engine process (`Engine.close`) once its requests
    ended; a generation still reading from it then ends with a 503 to retry, never hangs."""
    from ortserve.core.errors import EngineFaultError
    from ortserve.core.generation import GenerationRequest, SamplingOptions
    from ortserve.core.service import Service
    from ortserve.core.settings import EngineSettings

    settings = EngineSettings(model_dir=tiny_model_dir, providers="cpu", engine_process=True)
    service = Service.load(settings)
    options = SamplingOptions(max_new_tokens=LONG, min_new_tokens=LONG)
    stream = service.stream(GenerationRequest(prompt=PROMPT, options=options))
    outcome: list[BaseException] = []
    started = threading.Event()

    def read() -> None:
        try:
            for _ in stream:
                started.set()
        except BaseException as exc:  # what the reader saw is the test's
            outcome.append(exc)
        finally:
            started.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(30)
    pid = service.engine.model.describe()["pid"]
    service.engine.close()
    reader.join(30)
    assert not reader.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], EngineFaultError), outcome
    assert not _running(pid)
    assert service.engine.model.describe()["restarts"] == {}  # closed, not a fault


def test_a_hung_engine_is_killed_and_the_next_request_served(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine stuck in one call (here: stopped with SIGSTOP, as a native deadlock
    would leave it) is killed once the call has run past the request timeout by
    HUNG_AFTER_TIMEOUT_S; its requests get the 503 to retry, and a new engine serves."""
    from ortserve.core import engine_process
    from ortserve.core.errors import EngineFaultError
    from ortserve.core.generation import GenerationRequest, SamplingOptions
    from ortserve.core.service import Service
    from ortserve.core.settings import EngineSettings

    monkeypatch.setattr(engine_process, "HUNG_AFTER_TIMEOUT_S", 0.5)
    settings = EngineSettings(
        model_dir=tiny_model_dir, providers="cpu", engine_process=True, request_timeout_s=1.0
    )
    service = Service.load(settings)
    try:
        options = SamplingOptions(max_new_tokens=LONG, min_new_tokens=LONG)
        stream = service.stream(GenerationRequest(prompt=PROMPT, options=options))
        next(stream)
        pid = service.engine.model.describe()["pid"]
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(EngineFaultError, match=r"ended \(hung\)"):
            for _ in stream:
                pass
        short = SamplingOptions(max_new_tokens=4, min_new_tokens=4)
        done = service.generate(GenerationRequest(prompt=PROMPT, options=short))
        assert done.completion_tokens == 4
        engine = service.engine.model.describe()
        assert engine["restarts"] == {"hung": 1} and engine["pid"] != pid
        assert not _running(pid)
    finally:
        service.engine.close()


def _maps_og(pid: int) -> bool:
    """Whether process `pid` has onnxruntime-genai's native library mapped (it imported og)."""
    return "onnxruntime_genai" in Path(f"/proc/{pid}/maps").read_text()


def test_the_daemon_itself_never_loads_og_its_engine_process_does(start: Any) -> None:
    """og (its native library, its import-time threads) lives in the engine process only:
    the daemon's own process never imports it (core.og_local; the import contract says the
    same statically)."""
    daemon = start()
    answer = daemon.http.post("/generate", json={"prompt": "Hi", "max_new_tokens": 4})
    assert answer.status_code == 200, answer.text
    engine_pid = _engine(daemon)["pid"]
    assert engine_pid != daemon.proc.pid
    assert _maps_og(engine_pid)
    assert not _maps_og(daemon.proc.pid)


def test_the_engine_process_is_sealed(start: Any) -> None:
    """The engine process starts with allowed environment variables only (no API key, no
    cloud credential, no ORTSERVE_* setting), can gain no privileges, leaves no core dump
    and opens few files; the daemon itself keeps its own."""
    secret = "engine-test-aws-secret"
    os.environ["AWS_SECRET_ACCESS_KEY"] = secret  # the daemon's environment has it
    try:
        daemon = start(ADMIN_KEYS=KEY)
    finally:
        del os.environ["AWS_SECRET_ACCESS_KEY"]
    engine_pid = _engine(daemon)["pid"]
    environ = Path(f"/proc/{engine_pid}/environ").read_bytes().split(b"\0")
    names = {entry.split(b"=", 1)[0].decode() for entry in environ if entry}
    assert "PATH" in names and "ORT_DISABLE_TELEMETRY" in names
    assert not {n for n in names if n.startswith("ORTSERVE_") or n.startswith("AWS_")}, names
    raw = b"\0".join(environ)
    assert KEY.encode() not in raw and secret.encode() not in raw
    parent = Path(f"/proc/{daemon.proc.pid}/environ").read_bytes()
    assert KEY.encode() in parent and secret.encode() in parent  # the daemon's own, kept
    assert "\nNoNewPrivs:\t1\n" in Path(f"/proc/{engine_pid}/status").read_text()
    limits = Path(f"/proc/{engine_pid}/limits").read_text().splitlines()
    assert any(
        line.startswith("Max core file size") and line.split()[4:6] == ["0", "0"] for line in limits
    )
    open_files = next(line for line in limits if line.startswith("Max open files")).split()
    assert int(open_files[3]) <= 256 and int(open_files[4]) <= 256
    # It still works, sealed.
    answer = daemon.http.post("/generate", json={"prompt": "Hi", "max_new_tokens": 4})
    assert answer.status_code == 200, answer.text


def test_a_malformed_message_from_the_engine_is_a_fault_and_the_next_request_served(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message the engine process may not send (here: a reply of no known shape, as a
    child compromised through native code could send) fails its request with the 503 to
    retry, never an exception of another kind in the daemon; the child is killed, counted,
    and a new one serves."""
    from ortserve.core import engine_process
    from ortserve.core.errors import EngineFaultError
    from ortserve.core.generation import GenerationRequest, SamplingOptions
    from ortserve.core.service import Service
    from ortserve.core.settings import EngineSettings

    settings = EngineSettings(model_dir=tiny_model_dir, providers="cpu", engine_process=True)
    service = Service.load(settings)
    honest = engine_process.receive_from_child
    sent = iter([("not", "a", "reply", "at all")])

    def forged(conn: Any) -> Any:
        message = honest(conn)
        return next(sent, message)  # the first reply read is replaced by the forged one

    try:
        options = SamplingOptions(max_new_tokens=4, min_new_tokens=4)
        request = GenerationRequest(prompt=PROMPT, options=options)
        pid = service.engine.model.describe()["pid"]
        monkeypatch.setattr(engine_process, "receive_from_child", forged)
        with pytest.raises(EngineFaultError, match=r"ended \(malformed message\)"):
            service.generate(request)
        assert service.generate(request).completion_tokens == 4
        engine = service.engine.model.describe()
        assert engine["restarts"] == {"malformed message": 1} and engine["pid"] != pid
        assert not _running(pid)
    finally:
        service.engine.close()
