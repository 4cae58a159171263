"""edgellm: a local/edge LLM inference runtime (GGUF models, Numba kernels, continuous batching)."""

import os as _os

# Numba's workqueue threading layer costs ~80 us per parallel call versus ~2 us for OpenMP (see
# shared notes): prefer OpenMP, fall back where it is missing. Must be set before numba is imported.
_os.environ.setdefault("NUMBA_THREADING_LAYER_PRIORITY", "omp tbb workqueue")
# GNU OpenMP teams led by a thread other than the process's main thread (the engine thread behind the
# server and the TUI) ran 3x to 200x slower here (50 and 0.5 tok/s instead of ~140) unless threads are
# bound to cores; bound, every thread gets the same speed. Users can still override it.
_os.environ.setdefault("OMP_PROC_BIND", "true")

__version__ = "0.1.0"

from edgellm.llm import LLM, GenerationOutput  # noqa: E402
from edgellm.sampling import SamplingParams  # noqa: E402

__all__ = ["LLM", "GenerationOutput", "SamplingParams", "__version__"]
