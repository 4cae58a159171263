"""The chat UI yields the CPU to the engine core: once a model is ready its threads run at a lower priority
(drawing competed with the core's kernels on 2 cores), while load threads, and the engine cores they start,
keep the priority the process started with. Run in a child process: niceness cannot be raised back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgellm.testing.limits import HANG_S
from edgellm.testing.paths import ROOT

CHILD = """
import os, queue, subprocess, sys, threading
import tui.local_backend as lb
lb.yield_cpu_to_engine()
main = os.getpriority(os.PRIO_PROCESS, threading.main_thread().native_id)
out = queue.SimpleQueue()
def spawn():  # as a model load does: its process (the engine core) is started from a load thread
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                           capture_output=True, text=True)
    out.put(int(child.stdout))
lb._start_load_thread(spawn)
print(main, out.get(timeout=600))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")
def test_ui_yields_cpu_but_engine_cores_keep_their_priority() -> None:
    start = os.getpriority(os.PRIO_PROCESS, 0)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=ROOT, timeout=HANG_S
    )
    assert proc.returncode == 0, proc.stderr
    ui, core = (int(v) for v in proc.stdout.split())
    assert ui == max(start, 19)
    assert core == start
