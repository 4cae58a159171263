"""`ScriptedBackend`: a deterministic ChatBackend with no model behind it, for the TUI tests (the app
itself never loads it). Replies come from `reply_for(messages)`, streamed word by word; tokens are
counted as words."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Sequence

from tui.messages import (
    BackendError,
    BackendInfo,
    ChatMessage,
    GenerationSettings,
    StreamDelta,
    StreamDone,
    StreamEvent,
)


def echo_reply(messages: Sequence[ChatMessage]) -> str:
    last = messages[-1].content if messages else ""
    return f"You said: **{last}**"


class ScriptedBackend:
    def __init__(
        self,
        model: str = "scripted",
        reply_for: Callable[[Sequence[ChatMessage]], str] = echo_reply,
        n_ctx: int | None = 4096,
        delay: float = 0.0,
        load_lines: Sequence[str] = ("loading scripted model", "compiling kernels (1/1)"),
        load_error: str | None = None,
        load_gate: asyncio.Event | None = None,
        recommended: dict | None = None,
    ) -> None:
        self.model = model
        self.recommended = recommended or {}  # as a GGUF's general.sampling.* keys give them
        self.reply_for = reply_for
        self.n_ctx = n_ctx
        self.delay = delay  # seconds between streamed words (lets tests stop a reply midway)
        self.load_lines = load_lines
        self.load_error = load_error
        self.load_gate = load_gate  # when set, load() waits for it (tests of the loading screen)
        self.requests: list[tuple[list[ChatMessage], GenerationSettings]] = []
        self.closed = False
        self.aborted = 0

    async def load(self, progress: Callable[[str], None]) -> BackendInfo:
        for line in self.load_lines:
            progress(line)
        if self.load_gate is not None:
            await self.load_gate.wait()
        if self.load_error:
            raise BackendError(self.load_error)
        return BackendInfo(self.model, self.n_ctx, "scripted replies", dict(self.recommended))

    def count_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        return sum(4 + len(m.content.split()) for m in messages) + 3

    async def stream(
        self, messages: Sequence[ChatMessage], settings: GenerationSettings
    ) -> AsyncIterator[StreamEvent]:
        self.requests.append((list(messages), settings))
        text = self.reply_for(messages)
        pieces = re.findall(r"\S+\s*|\s+", text)[: settings.max_tokens]
        done = False
        try:
            for piece in pieces:
                if self.delay:
                    await asyncio.sleep(self.delay)
                yield StreamDelta(piece)
            done = True
        finally:
            if not done:
                self.aborted += 1
        finish = "length" if len(pieces) < len(re.findall(r"\S+\s*|\s+", text)) else "stop"
        yield StreamDone(finish, 0.05, 100.0, len(pieces), self.count_tokens(messages))

    async def close(self) -> None:
        self.closed = True
