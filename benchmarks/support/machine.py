"""The machine a benchmark ran on, for its record: figures compare only within one CPU."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def environment() -> dict[str, Any]:
    """A record's `environment`: the CPU's name, its logical CPUs and Python's version."""
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version()}
