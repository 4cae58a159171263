"""Model architectures, one file each; `build_model` picks the class from the GGUF's architecture."""

from __future__ import annotations

from edgellm.arch.common import ForwardBatch
from edgellm.arch.gemma3 import Gemma3Model
from edgellm.arch.llama import LlamaModel

ARCHITECTURES = {"llama": LlamaModel, "qwen2": LlamaModel, "qwen3": LlamaModel, "gemma3": Gemma3Model}

__all__ = ["ARCHITECTURES", "ForwardBatch", "Gemma3Model", "LlamaModel"]
