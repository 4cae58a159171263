"""`RemoteBackend`: chats with an OpenAI-compatible server (`edgellm serve`, llama.cpp, vLLM...) through
the official openai client, streaming the reply."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from tui.messages import (
    BackendError,
    BackendInfo,
    ChatMessage,
    GenerationSettings,
    StreamDelta,
    StreamDone,
    StreamEvent,
)

# Fields servers use to publish the context window on /v1/models entries (edgellm, vLLM, llama.cpp).
_CTX_FIELDS = ("n_ctx", "context_length", "max_model_len", "context_window")


def _context_size(entry: Any) -> int | None:
    extra = dict(getattr(entry, "model_extra", None) or {})
    for source in (extra, extra.get("meta") or {}):
        for name in (*_CTX_FIELDS, "n_ctx_train"):
            value = source.get(name) if isinstance(source, dict) else None
            if isinstance(value, int) and value > 0:
                return value
    return None


class RemoteBackend:
    def __init__(self, url: str, model: str | None = None, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.model = model or ""
        self.api_key = api_key
        self._client: Any = None
        self._can_tokenize = True  # until the server shows it has no /tokenize
        self._counts: dict[str, int] = {}

    def _readable(self, e: Exception) -> str:
        import openai

        if isinstance(e, openai.APIConnectionError):
            return f"Server unreachable at {self.url}: is `edgellm serve` running there?"
        if isinstance(e, openai.AuthenticationError):
            return f"The server at {self.url} refused the API key (pass --api-key)."
        if isinstance(e, openai.APIStatusError):
            body = e.body if isinstance(e.body, dict) else {}
            detail = (body.get("error") or {}).get("message") if isinstance(body.get("error"), dict) else None
            return f"Server error {e.status_code}: {detail or body.get('message') or e.message}"
        return f"{type(e).__name__}: {e}"

    async def load(self, progress: Callable[[str], None]) -> BackendInfo:
        try:
            import openai
        except ImportError as e:
            raise BackendError("Chatting with a server needs the openai package: pip install openai") from e
        self._client = openai.AsyncOpenAI(base_url=self.url, api_key=self.api_key or "none", max_retries=0,
                                          timeout=600.0)
        progress(f"connecting to {self.url}...")
        try:
            listing = await self._client.models.list()
        except Exception as e:
            raise BackendError(self._readable(e)) from e
        entries = list(listing.data)
        if not entries and not self.model:
            raise BackendError(f"The server at {self.url} lists no models.")
        chosen = next((m for m in entries if m.id == self.model), None)
        if chosen is None and entries and not self.model:
            chosen = entries[0]
            self.model = chosen.id
        progress(f"ready: {self.model} at {self.url}")
        return BackendInfo(self.model, _context_size(chosen) if chosen else None, f"server {self.url}")

    def count_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        """Through the server's /tokenize with `messages` (edgellm serve has it; the OpenAI API has no such
        call): None when the server lacks it, and the app falls back to the usage replies report. A short
        blocking call to a local server; answers are cached, failures switch it off."""
        if not self._can_tokenize or self._client is None:
            return None
        payload = json.dumps({"messages": [{"role": m.role, "content": m.content} for m in messages]})
        if payload in self._counts:
            return self._counts[payload]
        root = self.url.removesuffix("/v1")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(f"{root}/tokenize", payload.encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=2.0) as resp:
                count = json.loads(resp.read()).get("count")
        except (urllib.error.URLError, OSError, ValueError):
            count = None
        if not isinstance(count, int):
            self._can_tokenize = False
            return None
        self._counts[payload] = count
        return count

    async def stream(
        self, messages: Sequence[ChatMessage], settings: GenerationSettings
    ) -> AsyncIterator[StreamEvent]:
        if self._client is None:
            raise BackendError("not connected to the server yet")
        t0 = time.perf_counter()
        first: float | None = None
        last = t0
        chunks = 0
        finish: str | None = None
        usage = None
        try:
            stream = await self._client.chat.completions.create(
                model=self.model,
                messages=[{"role": m.role, "content": m.content} for m in messages],
                temperature=settings.temperature,
                top_p=settings.top_p,
                max_tokens=settings.max_tokens,
                seed=settings.seed,
                stream=True,
                stream_options={"include_usage": True},
            )
        except Exception as e:
            raise BackendError(self._readable(e)) from e
        try:
            async for chunk in stream:
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
                    text = choice.delta.content if choice.delta else None
                    extra = (choice.delta.model_extra or {}) if choice.delta else {}
                    reasoning = extra.get("reasoning_content") or extra.get("reasoning")
                    if text or isinstance(reasoning, str) and reasoning:
                        last = time.perf_counter()
                        first = first or last
                        chunks += 1
                        tps = (chunks - 1) / (last - first) if last > first else None  # a chunk a token
                        yield StreamDelta(
                            text or "", reasoning if isinstance(reasoning, str) else "", first - t0, tps
                        )
        except Exception as e:
            raise BackendError(self._readable(e)) from e
        finally:
            await stream.close()  # closing the connection is how the server learns to stop
        n = usage.completion_tokens if usage else chunks
        tps = (n - 1) / (last - first) if first is not None and last > first and n > 1 else None
        yield StreamDone(finish, None if first is None else first - t0, tps, n,
                         usage.prompt_tokens if usage else None)

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
