"""`ChatBackend`: what the app needs from whatever produces replies (an in-process model, a server, or a
scripted fake in tests). Only the dataclasses of `tui.messages` cross this boundary."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol, runtime_checkable

from tui.messages import BackendInfo, ChatMessage, GenerationSettings, StreamEvent

# The app draws a streaming reply at most this often (and less often when frames are dear: ChatApp), so a
# backend may hand it the reply's tokens in batches this far apart.
FRAME_INTERVAL_S = 1 / 15


def env_number(name: str, default: float, lo: float, hi: float, whole: bool = False) -> float:
    """A numeric setting from the environment, in [lo, hi] (and a whole number if `whole`); a bad value
    ends the program with a message naming it (never a traceback, never silently the default or rounded)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not lo <= value <= hi or (whole and not value.is_integer()):
        kind = "whole number" if whole else "number"
        raise SystemExit(f"{name} must be a {kind} in [{lo:g}, {hi:g}], got {raw!r}")
    return value


@runtime_checkable
class ChatBackend(Protocol):
    model: str

    async def load(self, progress: Callable[[str], None]) -> BackendInfo:
        """Get ready (load weights, compile kernels, reach the server), reporting readable progress
        lines; raises BackendError with a readable message on failure. Must not block the event loop."""
        ...

    def count_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        """Tokens the conversation takes in the context window as it would be sent (chat template
        applied, generation prompt included); None when the backend cannot tell."""
        ...

    def stream(
        self, messages: Sequence[ChatMessage], settings: GenerationSettings
    ) -> AsyncIterator[StreamEvent]:
        """Yields StreamDelta pieces of the reply, then one StreamDone. `messages` are final (system
        prompt included); `settings` only steer sampling. Leaving the iteration early stops the reply (and
        frees what it held). Raises BackendError on failure."""
        ...

    async def close(self) -> None:
        ...


def with_system_prompt(messages: Sequence[ChatMessage], settings: GenerationSettings) -> list[ChatMessage]:
    """The messages as sent: the settings' system prompt first when there is one."""
    out = [m for m in messages if m.role != "system"]
    if settings.system_prompt.strip():
        out.insert(0, ChatMessage("system", settings.system_prompt))
    return out
