"""edge/install.sh on a synthetic bundle: its checks, its options and what it refuses.

Everything here stops before pip runs, so a bundle without real wheels does; the real
install (venv, daemon) is in tests/functional/test_edge_bundle.py.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ortserve.bake.package_edge import write_bundle_manifest
from tests.edge_bundle_kit import (
    ENV_REL,
    MODEL_REL,
    UNIT_REL,
    VENV_REL,
    fake_python,
    host_report,
    install,
    listing,
    synthetic_bundle,
    venv_stamp,
)
from tests.tools import tool

INSTALL_SH = Path(__file__).resolve().parents[2] / "edge" / "install.sh"


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A bundle for this machine's architecture (x86_64 here)."""
    return synthetic_bundle(tmp_path / "bundle", arch=host_report().split()[0])


def _refused(proc: subprocess.CompletedProcess[str], prefix: Path) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "nothing was changed" in proc.stderr, proc.stderr
    assert not prefix.exists(), "a refused install must not touch the prefix"
    return proc.stderr


def test_install_sh_is_posix_sh() -> None:
    subprocess.run(["sh", "-n", str(INSTALL_SH)], check=True)
    if shutil.which("dash"):  # Debian's /bin/sh, and stricter than bash
        subprocess.run(["dash", "-n", str(INSTALL_SH)], check=True)


def test_shellcheck_finds_nothing() -> None:
    shellcheck = tool("shellcheck")
    proc = subprocess.run(
        [shellcheck, "-s", "sh", str(INSTALL_SH)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout


def test_help_lists_every_option(bundle: Path) -> None:
    proc = install(bundle, "--help")
    assert proc.returncode == 0
    for option in ("--prefix", "--python", "--dry-run", "--no-systemd", "--uninstall", "--purge"):
        assert option in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--frobnicate"], "unknown option: --frobnicate"),
        (["--prefix", "relative/dir"], "--prefix must be an absolute path"),
        (["--prefix", "/tmp/with space"], "--prefix may contain only"),
        (["--prefix"], "--prefix needs a directory"),
        (["--purge"], "--purge goes with --uninstall"),
    ],
)
def test_bad_arguments_are_refused(bundle: Path, args: list[str], message: str) -> None:
    proc = install(bundle, *args)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_dry_run_checks_and_plans_but_changes_nothing(bundle: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    python = fake_python(tmp_path / "bin", host_report())
    proc = install(bundle, "--prefix", str(prefix), "--python", str(python), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "checks passed" in proc.stdout
    assert f"would run: {python} -m venv --without-pip {prefix}/{VENV_REL}" in proc.stdout
    digest = hashlib.sha256((bundle / "model" / "manifest.json").read_bytes()).hexdigest()
    models = f"{prefix}/var/lib/ortserve/models"
    assert f"would run: cp -R {bundle}/model {models}/.{digest}.tmp" in proc.stdout
    assert f"would run: mv -T {prefix}/{MODEL_REL}.tmp {prefix}/{MODEL_REL}" in proc.stdout
    assert "--no-index" in proc.stdout
    assert "dry run: nothing was changed" in proc.stdout
    assert not prefix.exists()


@pytest.mark.parametrize(
    ("host", "hinted"),
    [(None, False), ("127.0.0.1", False), ("0.0.0.0", True), ("192.168.1.20", True)],
)
def test_a_lan_listener_is_told_the_unit_allows_loopback_only(
    bundle: Path, tmp_path: Path, host: str | None, hinted: bool
) -> None:
    """The unit drops every packet but loopback's (IPAddressDeny=any): a settings file that
    listens on the LAN gets the drop-in that lets the LAN in."""
    prefix = tmp_path / "prefix"
    if host is not None:
        env_file = prefix / ENV_REL
        env_file.parent.mkdir(parents=True)
        env_file.write_text(f"ORTSERVE_HOST={host}\n", encoding="utf-8")
    python = fake_python(tmp_path / "bin", host_report())
    proc = install(bundle, "--prefix", str(prefix), "--python", str(python), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert ("IPAddressAllow=" in proc.stdout) is hinted, proc.stdout
    if hinted:
        assert f"ORTSERVE_HOST={host}" in proc.stdout and "systemctl edit ortserve" in proc.stdout


def test_a_bundle_for_another_architecture_is_refused(tmp_path: Path) -> None:
    bundle = synthetic_bundle(tmp_path / "bundle", arch="aarch64")
    prefix = tmp_path / "prefix"
    python = fake_python(tmp_path / "bin", "x86_64 64 3.11 glibc-2.36")
    err = _refused(install(bundle, "--prefix", str(prefix), "--python", str(python)), prefix)
    assert f"this bundle is for aarch64, but {python} runs on x86_64" in err
    assert "--target edge-x86_64" in err


@pytest.mark.parametrize(
    ("report", "message"),
    [
        ("x86_64 64 3.10 glibc-2.36", "Python 3.10 ({python}) is too old: ortserve needs"),
        ("x86_64 64 3.13 glibc-2.36", "this bundle has wheels for Python 3.11 3.12, not 3.13"),
        ("x86_64 32 3.11 glibc-2.36", "is a 32-bit program (x86_64): this bundle needs a 64-bit"),
        ("armv7l 32 3.11 glibc-2.36", "is a 32-bit program (armv7l): this bundle needs a 64-bit"),
        ("riscv64 64 3.11 glibc-2.36", "runs on riscv64 (uname -m: "),
        ("x86_64 64 3.11 glibc-2.27", "glibc 2.27 is too old: the wheels need glibc >= 2.28"),
        ("x86_64 64 3.11 none", "the C library is not glibc (musl?)"),
        ("x86_64 64 2.7 glibc-2.36", "Python 2.7 ({python}) is too old"),
    ],
)
def test_an_unfit_python_is_refused(
    bundle: Path, tmp_path: Path, report: str, message: str
) -> None:
    prefix = tmp_path / "prefix"
    python = fake_python(tmp_path / "bin", report)
    err = _refused(install(bundle, "--prefix", str(prefix), "--python", str(python)), prefix)
    assert message.format(python=python) in err


def test_a_missing_python_is_refused(bundle: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    err = _refused(
        install(bundle, "--prefix", str(prefix), "--python", "/nonexistent/python3"), prefix
    )
    assert "Python not found: /nonexistent/python3" in err


def test_a_python_that_cannot_run_is_refused(bundle: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    python = tmp_path / "python3"
    python.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 64)  # an ELF for no machine at all
    python.chmod(0o755)
    err = _refused(install(bundle, "--prefix", str(prefix), "--python", str(python)), prefix)
    assert f"cannot run {python}" in err


def test_a_changed_file_is_refused_and_named(bundle: Path, tmp_path: Path) -> None:
    data = bytearray((bundle / "model" / "model.onnx").read_bytes())
    data[0] ^= 0x01
    (bundle / "model" / "model.onnx").write_bytes(bytes(data))
    prefix = tmp_path / "prefix"
    python = fake_python(tmp_path / "bin", host_report())
    err = _refused(install(bundle, "--prefix", str(prefix), "--python", str(python)), prefix)
    assert "the bundle does not match its manifest" in err
    assert "model/model.onnx: FAILED" in err


def test_a_missing_file_is_refused(bundle: Path, tmp_path: Path) -> None:
    (bundle / "wheels" / "ortserve-0.1.0-py3-none-any.whl").unlink()
    prefix = tmp_path / "prefix"
    python = fake_python(tmp_path / "bin", host_report())
    err = _refused(install(bundle, "--prefix", str(prefix), "--python", str(python)), prefix)
    assert "wheels/ortserve-0.1.0-py3-none-any.whl: FAILED open or read" in err


def test_an_unlisted_wheel_is_refused(bundle: Path, tmp_path: Path) -> None:
    # pip would pick up any wheel in wheels/, so one the bake did not put there is refused.
    (bundle / "wheels" / "evil-1.0-py3-none-any.whl").write_bytes(b"x")
    prefix = tmp_path / "prefix"
    python = fake_python(tmp_path / "bin", host_report())
    err = _refused(install(bundle, "--prefix", str(prefix), "--python", str(python)), prefix)
    assert "files not in the bundle's manifest" in err
    assert "wheels/evil-1.0-py3-none-any.whl" in err


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    bundle = synthetic_bundle(tmp_path / "bundle", arch="aarch64")
    (bundle / "ortserve.env").write_text("changed\n", encoding="utf-8")
    prefix = tmp_path / "prefix"
    python = fake_python(tmp_path / "bin", "x86_64 64 3.10 glibc-2.36")
    err = _refused(install(bundle, "--prefix", str(prefix), "--python", str(python)), prefix)
    assert "this bundle is for aarch64" in err
    assert "Python 3.10" in err
    assert "ortserve.env: FAILED" in err


def test_an_incomplete_bundle_is_refused(bundle: Path, tmp_path: Path) -> None:
    (bundle / "BUNDLE-MANIFEST.sha256").unlink()
    proc = install(bundle, "--prefix", str(tmp_path / "prefix"))
    assert proc.returncode != 0
    assert "not a complete ortserve edge bundle: BUNDLE-MANIFEST.sha256 is missing" in proc.stderr


def _fake_installation(prefix: Path) -> None:
    for rel in (f"{VENV_REL}/bin", MODEL_REL):
        (prefix / rel).mkdir(parents=True)
    (prefix / MODEL_REL / "manifest.json").write_text("{}", encoding="utf-8")
    for rel in (UNIT_REL, ENV_REL):
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_text("x\n", encoding="utf-8")


def test_uninstall_removes_all_but_the_settings(bundle: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    _fake_installation(prefix)
    before = listing(prefix)
    dry = install(bundle, "--uninstall", "--prefix", str(prefix), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would run: rm -rf {prefix}/opt/ortserve" in dry.stdout
    assert listing(prefix) == before
    proc = install(bundle, "--uninstall", "--prefix", str(prefix))
    assert proc.returncode == 0, proc.stderr
    assert not (prefix / "opt" / "ortserve").exists()
    assert not (prefix / "var" / "lib" / "ortserve").exists()
    assert not (prefix / UNIT_REL).exists()
    assert (prefix / ENV_REL).is_file()
    assert "kept your settings" in proc.stdout
    again = install(bundle, "--uninstall", "--prefix", str(prefix))
    assert "nothing to remove" in again.stdout


def test_uninstall_purge_removes_the_settings_too(bundle: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    _fake_installation(prefix)
    proc = install(bundle, "--uninstall", "--purge", "--prefix", str(prefix))
    assert proc.returncode == 0, proc.stderr
    assert not (prefix / "etc" / "ortserve").exists()


_SYSTEMCTL = """#!/bin/sh
echo "$*" >>"$SYSTEMCTL_LOG"
case $1 in
is-active) [ -f "$SYSTEMCTL_ACTIVE" ] ;;
enable) if [ "$2" = --now ]; then touch "$SYSTEMCTL_ACTIVE"; fi ;;
restart) touch "$SYSTEMCTL_ACTIVE" ;;
stop | disable) rm -f "$SYSTEMCTL_ACTIVE" ;;
esac
"""


class FakeSystemd:
    """install.sh made to believe that systemd runs this machine, for a --prefix install:
    its copy in the bundle looks for a test folder instead of /run/systemd/system, and
    `systemctl` is a stub that logs its arguments and keeps the unit's active state."""

    def __init__(self, bundle: Path, tmp_path: Path) -> None:
        run_dir = tmp_path / "run-systemd-system"
        run_dir.mkdir()
        script = bundle / "install.sh"
        text = script.read_text(encoding="utf-8")
        hacked = text.replace("/run/systemd/system", str(run_dir)).replace(
            'elif [ -n "$P" ]; then', "elif false; then"
        )
        assert hacked.count(str(run_dir)) == 1 and "elif false; then" in hacked
        script.write_text(hacked, encoding="utf-8")
        write_bundle_manifest(bundle)
        stubs = tmp_path / "stub-bin"
        stubs.mkdir()
        (stubs / "systemctl").write_text(_SYSTEMCTL, encoding="utf-8")
        (stubs / "systemctl").chmod(0o755)
        self.log = tmp_path / "systemctl.log"
        self.env = {
            **os.environ,
            "PATH": f"{stubs}:{os.environ['PATH']}",
            "SYSTEMCTL_LOG": str(self.log),
            "SYSTEMCTL_ACTIVE": str(tmp_path / "active"),
        }

    def calls(self) -> list[str]:
        """The systemctl calls since the last time this was asked."""
        lines = self.log.read_text(encoding="utf-8").splitlines() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        return lines


def test_systemd_calls_install_start_update_and_remove(bundle: Path, tmp_path: Path) -> None:
    systemd = FakeSystemd(bundle, tmp_path)
    prefix = tmp_path / "prefix"
    python = fake_python(tmp_path / "bin", host_report())
    # A venv built from this bundle already: only the model, unit and settings go in.
    venv_bin = prefix / VENV_REL / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "ortserve").write_text(f'#!/bin/sh\necho "$*" >>{venv_bin}/calls\n', "utf-8")
    (venv_bin / "ortserve").chmod(0o755)
    (prefix / VENV_REL / ".ortserve-bundle").write_text(venv_stamp(bundle, python), "utf-8")
    args = ("--prefix", str(prefix), "--python", str(python))
    unit = "ortserve.service"

    first = install(bundle, *args, env=systemd.env)
    assert first.returncode == 0, first.stderr
    assert "venv" in first.stdout and "up to date" in first.stdout
    assert systemd.calls() == ["daemon-reload", f"is-active --quiet {unit}", f"enable --now {unit}"]
    assert "ortserve runs: systemctl status ortserve" in first.stdout

    again = install(bundle, *args, env=systemd.env)
    assert "nothing changed" in again.stdout
    assert systemd.calls() == [f"enable --now {unit}"]

    # A new model while the service runs: a blue/green reload (`ortserve reload` waits
    # for it), never a stop; the old model stays on disk as `previous`.
    first_model = os.readlink(prefix / MODEL_REL)
    replace = bundle / "model" / "manifest.json"
    replace.write_text('{"model_name": "fake-2"}\n', encoding="utf-8")
    write_bundle_manifest(bundle)
    update = install(bundle, *args, env=systemd.env)
    assert update.returncode == 0, update.stderr
    assert "venv" in update.stdout and "up to date" in update.stdout  # same wheels
    assert "blue/green" in update.stdout
    assert systemd.calls() == [f"is-active --quiet {unit}", f"enable --now {unit}"]
    state = prefix / "var" / "lib" / "ortserve"
    assert (venv_bin / "calls").read_text().splitlines() == [
        f"reload --state-dir {state} --env-file {prefix}/{ENV_REL}"
    ]
    assert os.readlink(state / "previous") == first_model
    assert os.readlink(prefix / MODEL_REL) != first_model
    (venv_bin / "calls").unlink()

    # --rollback while it runs: `ortserve rollback` swaps the links and reloads.
    back = install(bundle, "--rollback", *args, env=systemd.env)
    assert back.returncode == 0, back.stderr
    assert (venv_bin / "calls").read_text().splitlines() == [
        f"rollback --state-dir {state} --env-file {prefix}/{ENV_REL}"
    ]
    systemd.calls()

    # A changed unit file alone: reloaded and restarted.
    (prefix / UNIT_REL).write_text("[Unit]\n", encoding="utf-8")
    install(bundle, *args, env=systemd.env)
    assert systemd.calls() == [
        "daemon-reload",
        f"is-active --quiet {unit}",
        f"restart {unit}",
        f"enable --now {unit}",
    ]

    gone = install(bundle, "--uninstall", *args[:2], env=systemd.env)
    assert gone.returncode == 0, gone.stderr
    assert systemd.calls() == [f"disable --now {unit}", "daemon-reload"]


def test_updates_keep_the_previous_model_and_rollback_swaps_the_links(
    bundle: Path, tmp_path: Path
) -> None:
    prefix = tmp_path / "prefix"
    python = fake_python(tmp_path / "bin", host_report())
    venv = prefix / VENV_REL
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "ortserve").write_text("#!/bin/sh\n", encoding="utf-8")
    (venv / "bin" / "ortserve").chmod(0o755)
    (venv / ".ortserve-bundle").write_text(venv_stamp(bundle, python), "utf-8")
    # An install from before versioned folders: the model in var/lib/ortserve/model.
    state = prefix / "var" / "lib" / "ortserve"
    shutil.copytree(bundle / "model", state / "model")
    (state / "model" / "manifest.json").write_text('{"model_name": "legacy"}\n', "utf-8")
    args = ("--prefix", str(prefix), "--python", str(python), "--no-systemd")

    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    first = install(bundle, *args)
    assert first.returncode == 0, first.stderr
    new = f"models/{digest(read(bundle / 'model' / 'manifest.json'))}"
    legacy = "models/" + digest('{"model_name": "legacy"}\n')
    assert not (state / "model").exists()
    assert os.readlink(state / "current") == new and os.readlink(state / "previous") == legacy
    assert (state / "current" / "model.onnx").is_file()
    assert f"ORTSERVE_MODEL_DIR={state}/current" in first.stdout

    # A third model: the oldest goes, the one it replaces is kept.
    (bundle / "model" / "manifest.json").write_text('{"model_name": "third"}\n', "utf-8")
    write_bundle_manifest(bundle)
    assert install(bundle, *args).returncode == 0
    third = "models/" + digest('{"model_name": "third"}\n')
    assert os.readlink(state / "current") == third and os.readlink(state / "previous") == new
    assert sorted(p.name for p in (state / "models").iterdir()) == sorted(
        [third.split("/")[1], new.split("/")[1]]
    )

    back = install(bundle, "--rollback", *args)
    assert back.returncode == 0, back.stderr
    assert os.readlink(state / "current") == new and os.readlink(state / "previous") == third
    again = install(bundle, "--rollback", *args)
    assert again.returncode == 0
    assert os.readlink(state / "current") == third

    (state / "previous").unlink()
    refused = install(bundle, "--rollback", *args)
    assert refused.returncode == 1
    assert "no previous model to roll back to" in refused.stderr


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")
