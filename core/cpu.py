"""How many CPUs this process may really use (affinity and cgroup quotas, as in containers)."""

from __future__ import annotations

import math
import os
from pathlib import Path

_CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
_CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def _cgroup_limit() -> float | None:
    try:
        quota, period = _CGROUP_V2_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(_CGROUP_V1_QUOTA.read_text())
        period_us = int(_CGROUP_V1_PERIOD.read_text())
        if quota_us > 0 and period_us > 0:
            return quota_us / period_us
    except (OSError, ValueError):
        pass
    return None


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        count = os.cpu_count() or 1
    limit = _cgroup_limit()
    if limit is not None:
        count = min(count, max(1, math.ceil(limit)))
    return max(1, count)
