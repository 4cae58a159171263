"""The oracle, llama.cpp (llama-cpp-python 0.3.36), as the fixture scripts load it. Never imported by the
default test run: only scripts that write the committed fixtures use it."""

from __future__ import annotations


def without_extra_buffer_types() -> None:
    """llama.cpp's CPU "extra" buffer types (the AMX and repacked-weight matmuls) off: on a VM whose CPU
    reports AMX the kernel may not grant it (Illegal instruction on the first block-quantized matmul), and
    the plain ggml-cpu kernels are the reference the fixtures are compared against anyway."""
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
