"""edgellm: a local/edge LLM inference runtime (GGUF models, Numba kernels, continuous batching)."""

import os as _os

# Numba's workqueue threading layer costs ~80 us per parallel call versus ~2 us for OpenMP (see
# shared notes): prefer OpenMP, fall back where it is missing. Must be set before numba is imported.
_os.environ.setdefault("NUMBA_THREADING_LAYER_PRIORITY", "omp tbb workqueue")

__version__ = "0.1.0"

from edgellm.llm import LLM, GenerationOutput  # noqa: E402
from edgellm.sampling import SamplingParams  # noqa: E402

__all__ = ["LLM", "GenerationOutput", "SamplingParams", "__version__"]
