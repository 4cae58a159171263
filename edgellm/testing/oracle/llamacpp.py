"""Using llama-cpp-python (the oracle of the fixtures) where it runs: only the scripts that write the
committed fixtures import it, never the default test run."""

from __future__ import annotations


def without_extra_buffer_types() -> None:
    """Make every llama_cpp.Llama load with llama.cpp's CPU "extra" buffer types off (the AMX and
    repacked-weight matmuls): on a VM whose CPU reports AMX the kernel may not grant it, and the first
    block-quantized matmul through the AMX buffer type dies with SIGILL. The plain ggml-cpu kernels remain.
    Idempotent."""
    import llama_cpp.llama_cpp as low_level  # the module llama_cpp.Llama takes its default params from

    default = low_level.llama_model_default_params
    if getattr(default, "without_extra_bufts", False):
        return

    def params():  # noqa: ANN202
        p = default()
        p.use_extra_bufts = False
        return p

    params.without_extra_bufts = True
    low_level.llama_model_default_params = params
