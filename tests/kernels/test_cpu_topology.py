"""The cores edgellm sizes itself by are the ones the process may run on."""

import os
import subprocess
import sys

import pytest

from edgellm.testing.limits import HANG_S
from edgellm.testing.paths import ROOT


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_an_affinity_mask_caps_the_cores_and_the_chats_drawing_budget() -> None:
    """`taskset -c 0 edgellm chat`: one core to share, so the UI's frame budget is one core's (drawing
    costs the engine its share of that core), not the whole machine's."""
    code = (
        "import os\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from edgellm.cpu_topology import physical_cores\n"
        "import tui.app\n"
        "print(physical_cores(), tui.app.DRAW_CPU_SHARE, tui.app.DRAWING_COST_TO_ENGINE)"
    )
    env = {k: v for k, v in os.environ.items() if k != "EDGELLM_UI_CPU_SHARE"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=HANG_S
    )
    assert out.returncode == 0, out.stderr
    cores, share, per_core = out.stdout.split()
    assert int(cores) == 1
    assert float(share) == pytest.approx(float(per_core))
