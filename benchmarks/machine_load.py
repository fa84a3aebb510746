"""How busy the machine is: benchmarks time a run only when other processes leave it quiet."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path


def cpu_snapshot() -> tuple[float, float, float]:
    """(busy CPU s of the machine, CPU s of this process and its reaped children, time)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields)
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    own = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        own += usage.ru_utime + usage.ru_stime
    return busy, own, time.monotonic()


def other_load(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """Cores that other processes (or the hypervisor's steal) used between two snapshots."""
    wall = after[2] - before[2]
    other = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, other / wall) if wall > 0 else 0.0


def wait_quiet(limit_s: float, max_load: float) -> None:
    """Wait (up to `limit_s`) until other processes use at most `max_load` cores."""
    deadline = time.monotonic() + limit_s
    told = False
    while True:
        before = cpu_snapshot()
        time.sleep(0.5)
        load = other_load(before, cpu_snapshot())
        if load <= max_load:
            return
        if time.monotonic() > deadline:
            print(f"  the machine is still busy ({load:.2f} cores used by others); measuring")
            return
        if not told:
            print(f"  waiting: other processes use {load:.2f} cores", flush=True)
            told = True
