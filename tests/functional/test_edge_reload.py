"""Blue/green model switches on the real edge daemon: SIGHUP (`systemctl reload`) and
`ortserve rollback`, under a continuous load that must not see one failed request.

Models live as on a board: STATE/models/<name>/ with the symlinks STATE/current (the
daemon's ORTSERVE_MODEL_DIR) and STATE/previous.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.support.servers import ORTSERVE
from ortserve.core.manifest import manifest_digest, read_manifest, write_manifest
from ortserve.edge.switch import set_link
from tests.functional.test_edge_daemon import PROMPT, start  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slow


def _model_copy(source: Path, dest: Path, revision: str | None = None) -> Path:
    """A copy of a baked folder (hard links); another `revision` gives it another digest."""
    shutil.copytree(source, dest, copy_function=os.link)
    if revision is not None:
        manifest = read_manifest(dest).model_copy(update={"revision": revision})
        (dest / "manifest.json").unlink()  # not through the link into the cache
        write_manifest(dest, manifest)
    return dest


@pytest.fixture
def state(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A board's state directory: models blue and green, `current` -> blue."""
    root = tmp_path / "state"
    (root / "models").mkdir(parents=True)
    _model_copy(tiny_model_dir, root / "models" / "blue")
    _model_copy(tiny_model_dir, root / "models" / "green", revision="green")
    set_link(root / "current", "models/blue")
    return root


class Load:
    """Clients that send requests back to back (buffered and streamed) until stopped,
    counting answers by status and noting every failure."""

    def __init__(self, url: str, clients: int = 4) -> None:
        self.url = url
        self.statuses: Counter[int] = Counter()
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, index: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while not self._stop.is_set():
                body = {"prompt": PROMPT, "max_new_tokens": 24, "stream": index % 2 == 1}
                try:
                    reply = http.post("/generate", json=body)
                    text = reply.text
                except httpx.HTTPError as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                self.statuses[reply.status_code] += 1
                if reply.status_code != 200 or '"error":' in text:
                    self.failures.append(f"{reply.status_code}: {text[:200]}")

    def total(self) -> int:
        return sum(self.statuses.values())

    def answered(self, count: int, timeout: float = 60) -> int:
        """Wait until `count` more requests are answered (rather than a time that depends
        on the machine's speed); the total then."""
        target = self.total() + count
        deadline = time.monotonic() + timeout
        while self.total() < target:
            assert time.monotonic() < deadline, f"{self.total()} answered, {target} wanted"
            time.sleep(0.01)
        return self.total()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


def _served(daemon: Any) -> dict[str, Any]:
    payload: dict[str, Any] = daemon.http.get("/readyz").json()
    return payload


def _wait_served(daemon: Any, digest: str, timeout: float = 60) -> float:
    """Seconds until /readyz serves `digest`."""
    start_t = time.monotonic()
    while time.monotonic() - start_t < timeout:
        if _served(daemon).get("manifest_digest") == digest:
            return time.monotonic() - start_t
        time.sleep(0.01)
    raise AssertionError(f"{digest[:12]} not served: {_served(daemon)}")


def test_reload_and_rollback_under_load_lose_no_request(start: Any, state: Path) -> None:  # noqa: F811
    blue = manifest_digest(state / "models" / "blue")
    green = manifest_digest(state / "models" / "green")
    assert blue != green
    daemon = start(state / "current", MAX_CONCURRENCY="2", MAX_QUEUE="64")
    daemon.wait_for("READY=1")
    assert _served(daemon)["manifest_digest"] == blue
    load = Load(daemon.url)
    try:
        before = load.answered(8)
        assert not load.failures, load.failures

        # The update: `current` -> green, then `systemctl reload` (SIGHUP).
        set_link(state / "previous", "models/blue")
        set_link(state / "current", "models/green")
        signalled = time.monotonic()
        daemon.proc.send_signal(signal.SIGHUP)
        switch_s = _wait_served(daemon, green)
        ready = _served(daemon)
        assert ready["status"] == "ready"
        assert ready["reload"]["status"] == "switched"
        assert ready["reload"]["count"] == 1
        # Where it loaded from is a path: a server without keys shows it to nobody.
        assert "model_dir" not in ready["reload"]
        assert "MONOTONIC_USEC=" in daemon.wait_for("RELOADING=1", timeout=10)
        reloading = daemon.when("RELOADING=1")
        assert reloading >= signalled - 0.5
        # /readyz serves green as soon as the switch is made; READY=1 follows it.
        assert daemon.wait_for("READY=1", timeout=10, after=reloading)
        during_green = load.answered(8)

        # The rollback: the real CLI swaps the links, signals, waits for /readyz.
        proc = _switch_cli("rollback", state, daemon, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert f"rolled back to ortserve/tiny-llama-random-weights ({blue[:12]})" in proc.stdout
        rollback_s = float(re.search(r"\) (\d+\.\d+) s after", proc.stdout).group(1))  # type: ignore[union-attr]
        assert os.readlink(state / "current") == "models/blue"
        assert os.readlink(state / "previous") == "models/green"
        assert _served(daemon)["manifest_digest"] == blue
        assert _served(daemon)["reload"]["count"] == 2
        load.answered(8)  # served by blue again
    finally:
        load.stop()
    assert not load.failures, load.failures[:5]
    assert load.total() > during_green > before
    assert set(load.statuses) == {200}
    # The swapped-out model is freed once its requests end (its batcher idles out first).
    deadline = time.monotonic() + 15
    while "is freed" not in daemon.stderr() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "the previous model" in daemon.stderr() and "is freed" in daemon.stderr()
    assert daemon.proc.poll() is None  # SIGHUP no longer ends the process
    print(
        f"\nblue/green under load: switch {switch_s:.2f} s (SIGHUP -> /readyz serves "
        f"the new digest), rollback {rollback_s:.2f} s (ortserve rollback: links swapped "
        f"-> /readyz serves the old digest); {load.total()} requests, 0 failed"
    )
    assert rollback_s <= 10


def _switch_cli(
    command: str, state: Path, daemon: Any, timeout: int = 30
) -> subprocess.CompletedProcess[str]:
    """`ortserve reload` / `ortserve rollback` against `daemon`, as an operator runs it."""
    return subprocess.run(
        [
            *ORTSERVE,
            command,
            "--state-dir",
            str(state),
            "--url",
            daemon.url,
            "--pid",
            str(daemon.proc.pid),
            "--timeout",
            str(timeout),
        ],
        capture_output=True,
        text=True,
        timeout=2 * timeout,
        check=False,
    )


def test_a_failed_reload_keeps_the_old_model_serving_and_says_why(
    start: Any,  # noqa: F811
    state: Path,
) -> None:
    blue = manifest_digest(state / "models" / "blue")
    broken = _model_copy(state / "models" / "blue", state / "models" / "broken", "broken")
    data = broken / "model.onnx.data"
    raw = data.read_bytes()
    data.unlink()
    data.write_bytes(raw[:1000])  # truncated: the size check fails
    daemon = start(state / "current")
    daemon.wait_for("READY=1")
    set_link(state / "current", "models/broken")
    daemon.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while (_served(daemon).get("reload") or {}).get("status") != "failed":
        assert time.monotonic() < deadline, _served(daemon)
        time.sleep(0.02)
    reply = daemon.http.get("/readyz")
    assert reply.status_code == 200  # the old model serves
    body = reply.json()
    assert body["status"] == "ready" and body["manifest_digest"] == blue
    assert "model.onnx.data" in body["reload"]["reason"]
    assert body["reload"]["manifest_digest"] == manifest_digest(broken)
    generate = daemon.http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 4})
    assert generate.status_code == 200
    status = daemon.wait_for("READY=1\nSTATUS=reload failed")
    assert "still serving ortserve/tiny-llama-random-weights" in status
    assert "reload of" in daemon.stderr() and "model.onnx.data" in daemon.stderr()

    # The daemon points `current` back at the model that serves (a restart would
    # otherwise load the broken one) and says so (#35 item 10).
    assert "points at it again" in status
    assert os.readlink(state / "current") == "models/blue"

    # A folder with the serving model's very manifest, its weights truncated: a failed
    # reload, not "unchanged" (#35 item 10).
    same = _model_copy(state / "models" / "blue", state / "models" / "same")
    (same / "model.onnx.data").unlink()
    (same / "model.onnx.data").write_bytes(raw[:1000])
    assert manifest_digest(same) == blue
    set_link(state / "current", "models/same")
    reloads = int(_served(daemon)["reload"]["count"])
    daemon.proc.send_signal(signal.SIGHUP)
    while int((_served(daemon).get("reload") or {}).get("count", 0)) == reloads:
        assert time.monotonic() < deadline + 30, _served(daemon)
        time.sleep(0.02)
    report = _served(daemon)["reload"]
    assert report["status"] == "failed" and "model.onnx.data" in report["reason"], report
    while os.readlink(state / "current") != "models/blue":  # just after the report
        assert time.monotonic() < deadline + 30
        time.sleep(0.02)

    # `ortserve reload` of a model that cannot load points `current` back at the model
    # that serves and says why.
    set_link(state / "current", "models/broken")
    proc = _switch_cli("reload", state, daemon)
    assert proc.returncode == 1
    assert "could not load it" in proc.stderr and "names the serving model again" in proc.stderr
    assert os.readlink(state / "current") == "models/blue"
    assert _served(daemon)["manifest_digest"] == blue

    # `ortserve rollback` to a model that cannot load puts the links back and says why.
    set_link(state / "current", "models/blue")
    set_link(state / "previous", "models/broken")
    proc = _switch_cli("rollback", state, daemon)
    assert proc.returncode == 1
    assert "could not load it" in proc.stderr and "model.onnx.data" in proc.stderr
    assert os.readlink(state / "current") == "models/blue"
    assert os.readlink(state / "previous") == "models/broken"
    assert _served(daemon)["manifest_digest"] == blue
