"""Model architectures, one file each; `build_model` picks the class from the GGUF's architecture."""

from __future__ import annotations

from edgellm.arch.common import ForwardBatch
from edgellm.arch.gemma2 import Gemma2Model
from edgellm.arch.gemma3 import Gemma3Model
from edgellm.arch.gpt2 import Gpt2Model
from edgellm.arch.gpt_oss import GptOssModel
from edgellm.arch.granite import GraniteModel
from edgellm.arch.lfm2 import Lfm2Model
from edgellm.arch.llama import LlamaModel
from edgellm.arch.olmo2 import Olmo2Model
from edgellm.arch.olmoe import OlmoeModel
from edgellm.arch.phi3 import Phi3Model
from edgellm.arch.qwen2moe import Qwen2MoeModel
from edgellm.arch.qwen3moe import Qwen3MoeModel
from edgellm.arch.smollm3 import SmolLM3Model
from edgellm.arch.starcoder2 import Starcoder2Model

ARCHITECTURES = {
    "llama": LlamaModel,
    "qwen2": LlamaModel,
    "qwen3": LlamaModel,
    "gemma2": Gemma2Model,
    "gemma3": Gemma3Model,
    "granite": GraniteModel,
    "olmo2": Olmo2Model,
    "starcoder2": Starcoder2Model,
    "gpt2": Gpt2Model,
    "phi3": Phi3Model,
    "smollm3": SmolLM3Model,
    "qwen3moe": Qwen3MoeModel,
    "qwen2moe": Qwen2MoeModel,
    "olmoe": OlmoeModel,
    "lfm2": Lfm2Model,
    "gpt-oss": GptOssModel,
}

__all__ = [
    "ARCHITECTURES",
    "ForwardBatch",
    "Gemma2Model",
    "Gemma3Model",
    "Gpt2Model",
    "GptOssModel",
    "GraniteModel",
    "LlamaModel",
    "Lfm2Model",
    "Olmo2Model",
    "Starcoder2Model",
    "Phi3Model",
    "SmolLM3Model",
    "OlmoeModel",
    "Qwen2MoeModel",
    "Qwen3MoeModel",
]
