"""GGML quantization: block layouts, numpy reference unpackers and the per-type traits table."""

from edgellm.quants.layouts import BLOCK_DTYPES, view_blocks
from edgellm.quants.traits import QUANT_TRAITS, QuantTraits, UnsupportedQuantError, get_traits

__all__ = [
    "BLOCK_DTYPES",
    "QUANT_TRAITS",
    "QuantTraits",
    "UnsupportedQuantError",
    "get_traits",
    "view_blocks",
]
