"""The machine's physical cores, without importing Numba: the engine sizes its thread pool by them, and
the chat's UI process (which loads no kernels) sizes its drawing budget by them."""

from __future__ import annotations

import os
from pathlib import Path


def physical_cores() -> int:
    """Physical cores this process may run on: SMT siblings share one FMA/load pipeline (llama.cpp's
    default is the same), and a CPU affinity mask (taskset, a container's cpuset) caps the count."""
    n = _physical_cores_of_machine()
    if hasattr(os, "sched_getaffinity"):
        n = min(n, len(os.sched_getaffinity(0)))
    return max(1, n)


def _physical_cores_of_machine() -> int:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.cpu_count() or 1
    cores, phys, core = set(), None, None
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key = key.strip()
        if key == "physical id":
            phys = val.strip()
        elif key == "core id":
            core = val.strip()
        elif not line.strip() and core is not None:
            cores.add((phys, core))
            phys = core = None
    if core is not None:
        cores.add((phys, core))
    return len(cores) or os.cpu_count() or 1
