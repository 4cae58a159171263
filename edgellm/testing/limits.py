"""Wall-clock limits in the tests, and the one up-front kernel compile they rely on.

A limit in a test is a hang guard, never a speed figure: the suite runs on 2-core laptops busy with other
work, where a first start compiles Numba kernels for minutes (the whole cold compile: ~3-10 minutes on 2
busy cores) and a warm model start takes seconds to tens of seconds. So

- the cold compile happens once, up front, with its progress on the terminal (`warm_kernels`, run by
  the model fixtures of tests/conftest.py before the first test that uses a real model), not inside
  whichever test happens to be collected first;
- every limit on a child process that loads a model, or a wait for one, is HANG_S: 30 minutes unless
  EDGELLM_TEST_HANG_S says otherwise. It fails a test that hangs; no busy machine reaches it;
- a limit that is itself what a test checks (a server answering /health within 1 s while it renders a
  hostile template) stays as it is, with a comment saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from edgellm.testing.paths import ROOT

HANG_S = float(os.environ.get("EDGELLM_TEST_HANG_S", "1800"))

_warmed: dict[str, float] = {}


def warm_kernels(model: Path | str, say: Callable[[str], None]) -> float:
    """Run `edgellm run MODEL` once (a 4-token greedy completion of a raw prompt) so that Numba compiles or
    loads every kernel a model of this kind runs, and later child processes load them from the disk cache.
    No limit: it says what it is doing through `say`, line by line, and returns the seconds it took (0 when
    this model was already warmed in this process). A failure here raises with the command's output."""
    key = str(model)
    if key in _warmed:
        return 0.0
    cmd = [sys.executable, "-m", "edgellm", "run", key, "Hello", "--raw", "--max-tokens", "4",
           "--temperature", "0", "--verbose"]  # fmt: skip
    say(f"warming up the kernels on {Path(key).name} (the first run compiles them: minutes, once)")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "compil" in line or "loaded from cache" in line:
            say("  " + line.rstrip())
    if proc.wait() != 0:
        raise RuntimeError(f"warming up the kernels failed ({proc.returncode}):\n{''.join(lines[-40:])}")
    dt = _warmed[key] = time.perf_counter() - t0
    say(f"kernels ready for {Path(key).name} in {dt:.0f} s")
    return dt
