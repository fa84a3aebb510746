"""An aarch64 Python on this x86_64 machine: Debian arm64 packages run by qemu user-mode.

There is no binfmt registration here, so every aarch64 program is started as
`qemu-aarch64-static ...`. `python()` returns a host shell script inside the emulated
root that does that; it passes its own name on as the guest's argv[0] (`-0 "$0"`), so
`python -m venv` records the script as the venv's interpreter and the venv's
`bin/python` and console scripts run on the host like native ones.

The root is built without chroot or host configuration changes: `apt-get download` of
bookworm's arm64 packages (its own lists and cache folders), `dpkg -x` into a folder,
cached under `.cache/` by package list.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.models import ROOT

QEMU = "qemu-aarch64-static"
# Enough for python3.11 with ssl, sqlite, ctypes (bookworm; the verified list).
PACKAGES = (
    "libc6",
    "libstdc++6",
    "libgcc-s1",
    "libgomp1",
    "zlib1g",
    "libexpat1",
    "libssl3",
    "libffi8",
    "libbz2-1.0",
    "liblzma5",
    "libsqlite3-0",
    "libuuid1",
    "libncursesw6",
    "libtinfo6",
    "libreadline8",
    "libdb5.3",
    "libcrypt1",
    "libnsl2",
    "libtirpc3",
    "libgssapi-krb5-2",
    "libkrb5-3",
    "libk5crypto3",
    "libkrb5support0",
    "libcom-err2",
    "libkeyutils1",
    "media-types",
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "python3.11",
)
# SVE/SME off: a Cortex-A76 (Raspberry Pi 5) has neither, and -cpu must agree with the
# cpuinfo below, which onnxruntime reads to pick its kernels.
CPU = "max,sve=off,sme=off"
# A Raspberry Pi 5 CPU (Cortex-A76: implementer 0x41, part 0xd0b). onnxruntime segfaults at
# import when it parses the host's x86 /proc/cpuinfo; qemu's -L serves ROOT/proc/cpuinfo
# instead because that file exists.
_CPUINFO_ENTRY = (
    "processor\t: {n}\nBogoMIPS\t: 108.00\n"
    "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
    "asimdrdm lrcpc dcpop asimddp\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x4\nCPU part\t: 0xd0b\n"
    "CPU revision\t: 1\n\n"
)
_WRAPPER = """#!/bin/sh
# aarch64 python3.11 under qemu user-mode (written by tests/edge_bundle_qemu.py)
exec {qemu} -cpu {cpu} -L "{root}" -0 "$0" "{root}/usr/bin/python3.11" "$@"
"""


class QemuUnavailable(Exception):
    """qemu user-mode emulation cannot be had on this machine (the reason is the message)."""


def qemu() -> str:
    """The qemu-aarch64-static path, installing Debian's qemu-user-static if missing.

    Raises:
        QemuUnavailable: Not installed, and it cannot be installed here.
    """
    found = shutil.which(QEMU)
    if found:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise QemuUnavailable(
            f"{QEMU} is not installed and cannot be installed here (needs root and apt-get): "
            "apt-get install qemu-user-static"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "qemu-user-static"]
    for cmd in (["apt-get", "update", "-qq"], install):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0 and cmd is install:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise QemuUnavailable(f"apt-get install qemu-user-static failed: {tail}")
    found = shutil.which(QEMU)
    if not found:
        raise QemuUnavailable(f"{QEMU} is still missing after installing qemu-user-static")
    return found


def _apt(work: Path, *args: str, cwd: Path | None = None) -> None:
    options = [
        "-oAPT::Architecture=arm64",
        "-oAPT::Architectures=arm64",
        f"-oDir::State::Lists={work / 'lists'}",
        f"-oDir::Cache={work / 'cache'}",
        "-oAPT::Sandbox::User=root",
        "-qq",
    ]
    proc = subprocess.run(
        ["apt-get", *options, *args], capture_output=True, text=True, cwd=cwd, check=False
    )
    if proc.returncode != 0:
        raise QemuUnavailable(f"apt-get {args[0]} (arm64) failed: {proc.stderr.strip()[-500:]}")


def _build_root(root: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="arm64-apt-") as tmp:
        work = Path(tmp)
        for sub in ("lists/partial", "cache/archives/partial", "debs"):
            (work / sub).mkdir(parents=True)
        _apt(work, "update")
        _apt(work, "download", *PACKAGES, cwd=work / "debs")
        for deb in sorted((work / "debs").glob("*.deb")):
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    (root / "proc").mkdir()
    cpus = os.cpu_count() or 1
    text = "".join(_CPUINFO_ENTRY.format(n=n) for n in range(cpus))
    (root / "proc" / "cpuinfo").write_text(text, encoding="utf-8")


def aarch64_root() -> Path:
    """The emulated root (bookworm arm64 with python3.11), built once and cached.

    Raises:
        QemuUnavailable: qemu or the arm64 packages cannot be had.
    """
    qemu()
    key = hashlib.sha256(repr((PACKAGES, _CPUINFO_ENTRY, os.cpu_count())).encode()).hexdigest()
    root = ROOT / ".cache" / f"aarch64-root-{key[:16]}"
    if not (root / ".complete").is_file():
        if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
            raise QemuUnavailable("apt-get and dpkg are needed to build the arm64 root")
        shutil.rmtree(root, ignore_errors=True)
        tmp = root.with_name(f".{root.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            _build_root(tmp)
            (tmp / ".complete").touch()
            tmp.rename(root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def python(root: Path) -> Path:
    """The host script that runs the emulated python3.11 (written into `root` if needed)."""
    wrapper = root / "usr" / "local" / "bin" / "python3"
    text = _WRAPPER.format(qemu=qemu(), cpu=CPU, root=root)
    if not wrapper.is_file() or wrapper.read_text(encoding="utf-8") != text:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(text, encoding="utf-8")
        wrapper.chmod(0o755)
    return wrapper
