"""Every float32 in [-104, 0] through the vectorised expf (edgellm/backends/cpu/expf.py) against the
process's own C-library expf (np.exp in Numba, one libm call each): prints the variant picked and the
inputs whose bits differ. ~1.1 billion inputs, ~1 minute on 2 threads.

    python scripts/profile/check_expf.py
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit, prange

from edgellm.backends.cpu.expf import (
    EXP2_TABLE,
    FMA,
    LIBM,
    PLAIN,
    UNDERFLOW,
    _expf_fma,
    _expf_plain,
    vector_expf_variant,
)

FIRST, END = 0x80000000, 0xC2D00001  # -0.0 .. -104.0 by their bits, both included


@njit(parallel=True)
def _mismatches(first: int, n: int, variant: int, tab: np.ndarray) -> np.ndarray:
    bad = np.zeros(n, np.bool_)
    for i in prange(n):
        x = np.array([np.uint32(first + i)]).view(np.float32)[0]
        got = _expf_fma(x, tab) if variant == FMA else _expf_plain(x, tab)
        bad[i] = got != np.exp(x)
    return bad


def main() -> None:
    variant = vector_expf_variant()
    names = {FMA: "FMA", PLAIN: "PLAIN", LIBM: "LIBM (the scalar loop: nothing to check)"}
    print(f"variant picked: {names[variant]}; underflow below {UNDERFLOW}")
    for v in (FMA, PLAIN):
        t = time.perf_counter()
        bad = np.flatnonzero(_mismatches(FIRST, END - FIRST, v, EXP2_TABLE))
        shown = [hex(FIRST + int(i)) for i in bad[:8]]
        took = time.perf_counter() - t
        print(f"{names[v]}: {bad.size} of {END - FIRST} inputs differ from libm {shown} ({took:.0f} s)")


if __name__ == "__main__":
    main()
