"""Serving-engine core: sequences, paged KV block manager with prefix caching, iteration-level scheduler."""

from edgellm.engine.block_manager import BlockCopy, BlockManager, PrefixMatch
from edgellm.engine.prefix_cache import HashPrefixCache, PrefixCache
from edgellm.engine.scheduler import Scheduler, SchedulerConfig, SchedulerPlan, SchedulerStats
from edgellm.engine.sequence import Sequence, SequenceStatus

__all__ = [
    "BlockCopy",
    "BlockManager",
    "HashPrefixCache",
    "PrefixCache",
    "PrefixMatch",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerPlan",
    "SchedulerStats",
    "Sequence",
    "SequenceStatus",
]
