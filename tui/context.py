"""Context-window accounting: does the conversation still fit, and if not, how many of the oldest turns
must leave it. Nothing is ever dropped without asking; this module only does the arithmetic."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tui.backend import with_system_prompt
from tui.messages import ChatMessage, GenerationSettings
from tui.storage import StoredMessage


@dataclass
class ContextCheck:
    used: int  # tokens of the prompt as it would be sent now
    n_ctx: int
    reserve: int  # tokens kept free for the reply
    drop: int  # how many of the oldest in-context messages must go (0: it fits)
    impossible: bool = False  # even the last message alone does not fit

    @property
    def fits(self) -> bool:
        return self.drop == 0 and not self.impossible


def reply_reserve(settings: GenerationSettings, n_ctx: int) -> int:
    """Room kept for the reply: max tokens, but never more than a quarter of the window (a 4096-token
    max on a 4096 window would otherwise forbid any prompt; the engine caps the reply at the window)."""
    return max(1, min(settings.max_tokens, n_ctx // 4))


def check_context(
    messages: Sequence[StoredMessage],
    settings: GenerationSettings,
    n_ctx: int,
    count_tokens: Callable[[Sequence[ChatMessage]], int | None],
) -> ContextCheck | None:
    """None when the backend cannot count tokens. Drops whole turns from the front: the oldest in-context
    messages up to the next user message, so the model never sees a reply without its question."""
    live = [m for m in messages if m.in_context]
    reserve = reply_reserve(settings, n_ctx)

    def used_without(k: int) -> int | None:
        return count_tokens(with_system_prompt([m.as_chat() for m in live[k:]], settings))

    used = used_without(0)
    if used is None:
        return None
    if used + reserve <= n_ctx:
        return ContextCheck(used, n_ctx, reserve, 0)
    starts = [i for i, m in enumerate(live) if m.role == "user" and i > 0]  # where a later turn begins
    for k in starts:
        tokens = used_without(k)
        if tokens is not None and tokens + reserve <= n_ctx:
            return ContextCheck(used, n_ctx, reserve, k)
    return ContextCheck(used, n_ctx, reserve, starts[-1] if starts else 0, impossible=True)


def drop_oldest(messages: Sequence[StoredMessage], count: int) -> None:
    """Mark the `count` oldest in-context messages as outside the context (kept, saved, shown dimmed)."""
    for m in [m for m in messages if m.in_context][:count]:
        m.in_context = False
