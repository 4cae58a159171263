"""runtime.CompileWatch: a start that compiles any kernel says so at once, with a heartbeat while it goes on;
a start that finds every kernel in Numba's disk cache says nothing. Child processes on a cache folder of
their own, with a kernel of their own (a first compile, then a cache load)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from edgellm.testing.limits import HANG_S
from edgellm.testing.paths import ROOT

KERNEL = """
import numba
import numpy as np


@numba.njit(cache=True)
def slow_to_compile(x):
    total = 0.0
    for i in range(x.shape[0]):
        total += np.sin(x[i]) * np.cos(x[i]) + np.sqrt(abs(x[i]))
    return total
"""

CHILD = """
import json, sys, time
import numpy as np
from edgellm.engine.runtime import CompileWatch

lines = []
with CompileWatch(lines.append, heartbeat_s=0.01) as watch:
    time.sleep(0.05)  # nothing compiled yet: no line
    before = list(lines)
    from kernel import slow_to_compile
    slow_to_compile(np.ones(4))
    time.sleep(0.05)
print(json.dumps({"before": before, "lines": lines, "compiled": watch.compiled, "cold": watch.cold}))
"""


def _start(tmp_path: Path) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=f"{tmp_path}:{ROOT}")
    cmd = [sys.executable, "-c", CHILD]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_a_compile_is_announced_at_once_and_a_cached_start_is_silent(tmp_path: Path) -> None:
    (tmp_path / "kernel.py").write_text(KERNEL)
    cold = _start(tmp_path)
    assert cold["before"] == [] and cold["cold"] and cold["compiled"] >= 1
    assert cold["lines"][0].startswith("compiling Numba kernels"), cold["lines"]
    warm = _start(tmp_path)
    assert warm == {"before": [], "lines": [], "compiled": 0, "cold": False}
