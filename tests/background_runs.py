"""Simulator runs of the default suite started as soon as collection ends, and waited for by their tests.

The Numba CUDA simulator runs every GPU thread as a Python thread of one process: the two simulator runs (the
CUDA test files, tests/cuda/test_cuda_backend.py; scripts/gpu/gpu_check.sh --sim,
tests/cuda/test_gpu_check.py) are minutes of one-core work each, while the rest of the suite leaves a core of
a small machine idle much of the time (servers waited on, child processes started, one-threaded Python). So
tests/conftest.py starts every run whose test was collected when collection ends, at a lower priority so the
tests beside it keep their timing, and moves those tests to the end of the session, where each
waits for its run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from edgellm.testing.paths import ROOT

NICE = 10


@dataclass
class Run:
    """One background command; `workdir` is its scratch folder (removed at the session's end)."""

    workdir: Path
    proc: subprocess.Popen
    log: object = field(repr=False)

    def wait(self) -> tuple[int, str]:
        self.proc.wait()
        self.log.seek(0)
        return self.proc.returncode, self.log.read()


def _cuda_tests(workdir: Path) -> tuple[list[str], dict[str, str]]:
    # found wherever they sit below tests/ (a file moved into a subfolder is still run)
    names = ("backend", "row_ops", "kv_cache", "engine", "fused", "arch_logits", "attention", "real_shapes",
             "lora")  # fmt: skip
    files = [str(next((ROOT / "tests").rglob(f"test_cuda_{name}.py")).relative_to(ROOT)) for name in names]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    return cmd, dict(os.environ, NUMBA_ENABLE_CUDASIM="1")


def _gpu_check(workdir: Path) -> tuple[list[str], dict[str, str]]:
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    from gpu_wheels import repack

    wheels = workdir / "wheels"
    wheels.mkdir()
    repack("gguf", wheels)
    out, python = str(workdir / "out"), sys.executable
    # The script's per-step limits are the GPU's (inside one 10-minute command there). Here they are hang
    # guards only: the simulator is one-core Python at a lower priority beside the suite, on a machine that
    # may be busy (its compare step once ran past 4x the GPU's 130 s on 2 cores running other work).
    # 20x: 540 s of steps -> 3 hours; the whole run at most 4 (edgellm/testing/limits.py).
    env = dict(os.environ, WHEELS=str(wheels), OUT=out, PYTHON=python, TMPDIR=str(workdir))
    env.setdefault("GPU_CHECK_TIME_SCALE", "20")
    env.pop("NUMBA_ENABLE_CUDASIM", None)  # the script sets it for --sim
    return ["timeout", "-k", "10", str(4 * 3600), "bash", "scripts/gpu/gpu_check.sh", "--sim"], env


COMMANDS = {
    "test_cuda_kernels_in_simulator": _cuda_tests,
    "test_gpu_check_flow_runs_in_the_simulator": _gpu_check,
}
_runs: dict[str, Run] = {}


def start(name: str) -> Run:
    """Start the run the test `name` waits for, once."""
    if name not in _runs:
        workdir = Path(tempfile.mkdtemp(prefix=f"edgellm-{name}-"))
        cmd, env = COMMANDS[name](workdir)
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=lambda: os.nice(NICE))  # fmt: skip
        _runs[name] = Run(workdir, proc, log)
    return _runs[name]


def stop_all() -> None:
    """End the runs nobody waited for (an interrupted session) and remove every run's scratch folder."""
    for run in _runs.values():
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        shutil.rmtree(run.workdir, ignore_errors=True)
