"""edgellm: a local/edge LLM inference runtime (GGUF models, Numba kernels, continuous batching)."""

import os as _os
import platform as _platform

# Numba's workqueue threading layer costs ~80 us per parallel call versus ~2 us for OpenMP (see
# shared notes): prefer OpenMP, fall back where it is missing. Must be set before numba is imported.
_os.environ.setdefault("NUMBA_THREADING_LAYER_PRIORITY", "omp tbb workqueue")
# GNU OpenMP's threads spin 300,000 times (milliseconds here) waiting for the next parallel region before
# they sleep. When another process is busy, that spinning holds a core the engine's other thread needs, and
# every region waits out a scheduler time slice: batch-1 decode on 2 cores with one busy process fell from
# ~260 to 1-2 tok/s (llama.cpp falls the same way). 5,000 spins bridge the gaps between a step's regions
# on an idle machine, where a spin lasts longest (Intel's pause: 1,000 did not, and decode ran at ~0.55x
# there), and still let go of the core within a fraction of a millisecond (docs/benchmarks.md); a user's
# own OpenMP setting wins. Read by libgomp when it loads, so it is set here, before any kernel runs (and
# inherited by engine processes).
if "OMP_WAIT_POLICY" not in _os.environ:
    _os.environ.setdefault("GOMP_SPINCOUNT", "5000")
# A forced CPU tier (EDGELLM_CPU_TIER) also sets Numba's target to that tier's instruction set, so the
# generic code around its kernels is what a CPU of that tier runs; on ARM64 Numba's target gets the
# features LLVM does not see there (edgellm/backends/cpu/tiers.py). Set when Numba is first imported
# (edgellm/numba_target.py), so front-ends load no llvmlite for it.
if _os.environ.get("EDGELLM_CPU_TIER") or _platform.machine().lower() in ("aarch64", "arm64"):
    from edgellm.numba_target import install as _install_numba_target

    _install_numba_target()

__version__ = "0.1.0"

from edgellm.engine.config import EngineConfig  # noqa: E402
from edgellm.llm import LLM, GenerationOutput  # noqa: E402
from edgellm.sampling.sampler import SamplingParams  # noqa: E402

__all__ = ["LLM", "EngineConfig", "GenerationOutput", "SamplingParams", "__version__"]
