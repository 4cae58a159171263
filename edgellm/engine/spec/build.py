"""The engine core's speculator for a SpeculativeConfig: the proposer and, for `draft`, its model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgellm.engine.spec.config import SpeculativeConfig
from edgellm.engine.spec.ngram import NgramProposer
from edgellm.engine.spec.speculator import Speculator


def build_speculator(
    config: SpeculativeConfig | None, core: Any, log: Callable[[str], None] | None = None
) -> Speculator | None:
    """core: the EngineCoreProc being built (its config, backend, context and KV block size)."""
    if config is None:
        return None
    if config.method == "ngram":
        proposer = NgramProposer(config.ngram_min, config.ngram_max)
    else:
        from edgellm.engine.spec.draft import DraftProposer

        proposer = DraftProposer.load(config.model, core, log)
    if log:
        log(f"speculative decoding: {config.method}, up to {config.num_tokens} draft tokens per step")
    return Speculator(config, proposer)
