"""Model folders on a board and the switch between them: `ortserve reload` and `rollback`.

A board keeps each model in a versioned folder and names the serving one with symlinks
(relative, so they hold under systemd's DynamicUser state directory and under a prefix):

    /var/lib/ortserve/models/<manifest digest>/   one baked model each
    /var/lib/ortserve/current  -> models/<digest>  what the unit serves (ORTSERVE_MODEL_DIR)
    /var/lib/ortserve/previous -> models/<digest>  what `rollback` goes back to

A rollback swaps the two links (each replaced atomically, `current` last), asks the daemon
to reload (SIGHUP: `systemctl reload ortserve`, or a PID) and waits until /readyz serves
the expected manifest digest. If the daemon reports that the reload failed, the links are
put back, so they name what serves. On a daemon with keys, /readyz says only its status
without one: the switch asks it with the first admin key (else API key) of the daemon's
settings file. Standard library only: the CLI imports this lazily.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_DIR = Path("/var/lib/ortserve")
ENV_FILE = Path("/etc/ortserve/ortserve.env")
UNIT = "ortserve.service"
CURRENT, PREVIOUS, MODELS = "current", "previous", "models"
_POLL_S = 0.05


class SwitchError(Exception):
    """A switch that cannot be done, or did not take; the message says why."""


@dataclass(frozen=True)
class Outcome:
    """How a switch ended.

    Attributes:
        digest: The manifest digest /readyz serves now (None: not asked).
        seconds: From the flip to /readyz serving it.
        model: The served model's name.
    """

    digest: str | None
    seconds: float
    model: str | None = None


def link_target(state_dir: Path, name: str) -> str | None:
    """Where the symlink `state_dir/name` points (as written), or None if there is none."""
    try:
        return os.readlink(state_dir / name)
    except OSError:
        return None


def set_link(path: Path, target: str) -> None:
    """Point the symlink `path` at `target` atomically (a new link renamed over it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def restore_link(link: Path, serving: Path) -> bool:
    """After a failed reload, point the symlink `link` (the daemon's ORTSERVE_MODEL_DIR,
    e.g. `current`) back at the folder that still serves, so that a restart serves it
    too rather than the folder that failed. Relative where `serving` is beside the
    link's folder, as `ortserve reload` writes it. False: `link` is no symlink, names
    `serving` already, or cannot be changed (the error is logged by the caller's text).
    """
    if not link.is_symlink():
        return False
    try:
        if link.resolve() == serving.resolve():
            return False
        base = link.parent.resolve()
        target = serving.resolve()
        written = target.relative_to(base).as_posix() if target.is_relative_to(base) else target
        set_link(link, str(written))
    except OSError:
        return False
    return True


def folder_digest(folder: Path) -> str:
    """The manifest digest of a model folder (core.manifest.manifest_digest, without
    importing it: sha256 of manifest.json)."""
    with (folder / "manifest.json").open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def serving_folder(state_dir: Path, digest: str) -> str | None:
    """The link target (`models/NAME`) of the model folder whose digest is `digest`, or
    None when no folder under `state_dir/models` has it."""
    models = state_dir / MODELS
    for folder in sorted(models.iterdir()) if models.is_dir() else []:
        try:
            if folder_digest(folder) == digest:
                return f"{MODELS}/{folder.name}"
        except OSError:
            continue  # an incomplete folder: not what serves
    return None


def swap(state_dir: Path) -> tuple[str, str]:
    """Swap `current` and `previous`; returns (new current, new previous) targets."""
    current, previous = link_target(state_dir, CURRENT), link_target(state_dir, PREVIOUS)
    if current is None:
        raise SwitchError(f"{state_dir / CURRENT} is not a symlink: nothing is installed there")
    if previous is None:
        raise SwitchError(f"no previous model to roll back to ({state_dir / PREVIOUS} is absent)")
    if not (state_dir / previous / "manifest.json").is_file():
        raise SwitchError(f"the previous model {state_dir / previous} is gone or incomplete")
    set_link(state_dir / PREVIOUS, current)
    set_link(state_dir / CURRENT, previous)
    return previous, current


def env_values(env_file: Path) -> dict[str, str]:
    """The settings in the daemon's settings file (`NAME=value` lines); none if unreadable."""
    values: dict[str, str] = {}
    try:
        lines = env_file.read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith("#"):
            values[key.strip()] = value.strip().strip("'\"")
    return values


def listen_url(env_file: Path) -> str:
    """The daemon's URL from its settings file (ORTSERVE_HOST/PORT), else the default."""
    return local_url(env_values(env_file))


def local_key(env_file: Path) -> str | None:
    """A key /readyz answers in full to: the first of ORTSERVE_ADMIN_KEYS, else of
    ORTSERVE_API_KEYS, in the daemon's settings file; None without either."""
    values = env_values(env_file)
    for name in ("ORTSERVE_ADMIN_KEYS", "ORTSERVE_API_KEYS"):
        keys = [k.strip() for k in values.get(name, "").split(",") if k.strip()]
        if keys:
            return keys[0]
    return None


def local_url(values: Mapping[str, str]) -> str:
    """The URL of a daemon on this machine that ORTSERVE_HOST/PORT in `values` (default
    127.0.0.1:8000) make listen: a wildcard address is reached on the loopback."""
    host = values.get("ORTSERVE_HOST", "127.0.0.1")
    if host in ("", "0.0.0.0"):  # noqa: S104 (a wildcard listener is reached on loopback)
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    port = values.get("ORTSERVE_PORT", "8000")
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def readyz(url: str, timeout: float = 5.0, key: str | None = None) -> dict[str, Any]:
    """GET /readyz's JSON (a 503 has a body too), asked with `key` where given (a daemon
    with keys tells its model and reloads only to a request with one).

    Raises:
        SwitchError: The daemon does not answer.
    """
    if not url.startswith(("http://", "https://")):
        raise SwitchError(f"not an http(s) URL: {url}")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    # The scheme is checked above (no file: or custom schemes).
    request = urllib.request.Request(f"{url.rstrip('/')}/readyz", headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310
            body = reply.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except (OSError, ValueError) as exc:
        raise SwitchError(f"the daemon does not answer at {url}: {exc}") from None
    try:
        payload: dict[str, Any] = json.loads(body)
    except ValueError:
        raise SwitchError(f"{url}/readyz did not answer JSON") from None
    return payload


def reload_count(payload: dict[str, Any]) -> int:
    """Reloads the daemon has finished, from a /readyz payload."""
    reload = payload.get("reload") or {}
    return int(reload.get("count", 0))


def signal_reload(pid: int | None, unit: str) -> None:
    """Ask the daemon to reload: SIGHUP to `pid`, or `systemctl reload unit`.

    Raises:
        SwitchError: No such process, or systemctl failed.
    """
    if pid is not None:
        try:
            os.kill(pid, signal.SIGHUP)
        except OSError as exc:
            raise SwitchError(f"cannot signal process {pid}: {exc.strerror}") from None
        return
    systemctl = shutil.which("systemctl")
    if systemctl is None or not Path("/run/systemd/system").is_dir():
        raise SwitchError("systemd does not run this machine: pass --pid (or --no-reload)")
    proc = subprocess.run([systemctl, "reload", unit], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SwitchError(f"systemctl reload {unit} failed: {proc.stderr.strip()}")


def wait_served(
    url: str, digest: str, count_before: int, timeout: float, key: str | None = None
) -> dict[str, Any]:
    """Wait until /readyz (asked with `key`) serves `digest`; the payload then.

    Raises:
        SwitchError: The daemon reported a failed reload (with its reason), or the time ran out.
    """
    deadline = time.monotonic() + timeout
    payload: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            payload = readyz(url, key=key)
        except SwitchError:
            payload = {}  # restarting, or briefly too busy: ask again
        if payload.get("manifest_digest") == digest and payload.get("status") == "ready":
            return payload
        reload = payload.get("reload") or {}
        if reload_count(payload) > count_before and reload.get("status") == "failed":
            raise SwitchError(f"the daemon could not load it: {reload.get('reason')}")
        time.sleep(_POLL_S)
    raise SwitchError(
        f"/readyz did not serve {digest[:12]} within {timeout:g} s "
        f"(it serves {str(payload.get('manifest_digest'))[:12]}, {payload.get('status')})"
    )


def switch(
    state_dir: Path,
    url: str,
    *,
    rollback: bool,
    pid: int | None = None,
    unit: str = UNIT,
    reload: bool = True,
    timeout: float = 120.0,
    key: str | None = None,
) -> Outcome:
    """Roll back (swap `current` and `previous`) or only reload, and wait for /readyz.

    Without `reload` the links are swapped and nothing is asked of the daemon (it serves
    the new `current` from its next start or reload). /readyz is asked with `key`
    (None: `local_key` of ENV_FILE, the unit's settings).

    Raises:
        SwitchError: Nothing to switch to, the daemon is unreachable, or it could not load
            the model: a rollback's links are then put back as they were, and a reload's
            `current` names the folder that still serves again (so that a restart does not
            load the broken one).
    """
    if rollback and link_target(state_dir, PREVIOUS) is None:
        raise SwitchError(f"no previous model to roll back to ({state_dir / PREVIOUS} is absent)")
    target = state_dir / (PREVIOUS if rollback else CURRENT)
    try:
        digest = folder_digest(target)
    except OSError as exc:
        raise SwitchError(f"no model at {target}: {exc.strerror or exc}") from None
    key = key if key is not None else local_key(ENV_FILE)
    before = readyz(url, key=key) if reload else {}
    count_before = reload_count(before)
    start = time.monotonic()
    links = {name: link_target(state_dir, name) for name in (PREVIOUS, CURRENT)}
    if rollback:
        swap(state_dir)
    if not reload:
        return Outcome(None, time.monotonic() - start)
    try:
        signal_reload(pid, unit)
        payload = wait_served(url, digest, count_before, timeout, key)
    except SwitchError as exc:
        if rollback:
            # The links name what serves again: set, not swapped back (the daemon itself
            # points `current` at what serves after a failed reload, maybe first).
            for name, was in links.items():
                if was is not None:
                    set_link(state_dir / name, was)
            raise
        served = before.get("manifest_digest")
        back = serving_folder(state_dir, served) if isinstance(served, str) else None
        if back is None:
            raise
        if back != link_target(state_dir, CURRENT):  # else the daemon did it already
            set_link(state_dir / CURRENT, back)
        raise SwitchError(
            f"{exc}; {state_dir / CURRENT} names the serving model again ({back})"
        ) from None
    return Outcome(digest, time.monotonic() - start, payload.get("model"))
