"""The CPUs this process may use: os.cpu_count() is the node's, and ignores this process's affinity and a cgroup
CPU quota (a pod's limit), either of which caps what threads can run at once."""

from __future__ import annotations

import os
from pathlib import Path


def affinity_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cgroup_cpu_quota() -> float | None:
    """CPUs the cgroup v2 quota allows (`cpu.max`); None without a quota or a readable one."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    quota = cgroup_cpu_quota()
    return affinity_cpus() if quota is None else max(1, min(affinity_cpus(), int(quota)))
