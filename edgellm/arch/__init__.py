"""Model architectures, one file each; `build_model` picks the class from the GGUF's architecture."""

from __future__ import annotations

from edgellm.arch.common import ForwardBatch
from edgellm.arch.gemma2 import Gemma2Model
from edgellm.arch.gemma3 import Gemma3Model
from edgellm.arch.granite import GraniteModel
from edgellm.arch.llama import LlamaModel
from edgellm.arch.olmo2 import Olmo2Model
from edgellm.arch.olmoe import OlmoeModel
from edgellm.arch.qwen2moe import Qwen2MoeModel
from edgellm.arch.qwen3moe import Qwen3MoeModel

ARCHITECTURES = {
    "llama": LlamaModel,
    "qwen2": LlamaModel,
    "qwen3": LlamaModel,
    "gemma2": Gemma2Model,
    "gemma3": Gemma3Model,
    "granite": GraniteModel,
    "olmo2": Olmo2Model,
    "qwen3moe": Qwen3MoeModel,
    "qwen2moe": Qwen2MoeModel,
    "olmoe": OlmoeModel,
}

__all__ = [
    "ARCHITECTURES",
    "ForwardBatch",
    "Gemma2Model",
    "Gemma3Model",
    "GraniteModel",
    "LlamaModel",
    "Olmo2Model",
    "OlmoeModel",
    "Qwen2MoeModel",
    "Qwen3MoeModel",
]
