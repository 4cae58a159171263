"""Model architectures, one file each (registry.py finds them): an architecture's file declares its
`SPEC` (arch/spec.py: the GGUF keys, tensors, flags and checks gguf/ reads) beside its forward pass
(`MODEL`), the class `ARCHITECTURES` builds the model with from the GGUF's architecture."""

from __future__ import annotations

from edgellm.arch.common import ForwardBatch
from edgellm.arch.registry import model_classes

ARCHITECTURES = model_classes()

__all__ = ["ARCHITECTURES", "ForwardBatch"]
