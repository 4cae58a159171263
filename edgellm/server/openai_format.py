"""OpenAI response and stream-chunk bodies (chat.completion[.chunk], text_completion), built from the
engine's deltas. Everything here is plain dict building; the app decides when to send what."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from edgellm.engine.outputs import RequestMetrics
from edgellm.engine.protocol import TokenLogprob
from edgellm.tokenizer import Tokenizer

SYSTEM_FINGERPRINT = "edgellm"


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def sse(data: dict[str, Any] | str) -> str:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n"


def reasoning_fields(text: str | None) -> dict[str, str | None]:
    """The reasoning under both names clients read: `reasoning_content` (llama.cpp, LM Studio, DeepSeek's
    API) and `reasoning` (vLLM, Ollama's OpenAI layer)."""
    return {"reasoning_content": text, "reasoning": text}


def usage(
    prompt: int, completion: int, cached: int, overflow: dict[str, Any] | None = None
) -> dict[str, Any]:
    """OpenAI's usage; `overflow`: what a --context-overflow policy dropped (context_overflow.py)."""
    out = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    if overflow is not None:
        out["context_overflow"] = overflow
    return out


def _token(tok: Tokenizer, tid: int) -> tuple[str, list[int]]:
    raw = tok.token_bytes(tid)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(tok: Tokenizer, lps: list[TokenLogprob]) -> list[dict[str, Any]]:
    out = []
    for lp in lps:
        text, raw = _token(tok, lp.token_id)
        top = []
        for tid, v in lp.top:
            t, b = _token(tok, tid)
            top.append({"token": t, "logprob": v, "bytes": b})
        out.append({"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top})
    return out


def llama_probs(tok: Tokenizer, lps: list[TokenLogprob]) -> list[dict[str, Any]]:
    """llama-server's `completion_probabilities` (n_probs): each token with its id, and its alternatives."""

    def entry(tid: int, logprob: float) -> dict[str, Any]:
        text, raw = _token(tok, tid)
        return {"id": tid, "token": text, "bytes": raw, "logprob": logprob}

    return [
        {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(tid, v) for tid, v in lp.top]} for lp in lps
    ]


def completion_logprobs(tok: Tokenizer, lps: list[TokenLogprob], offset: int) -> dict[str, Any]:
    """The legacy completions logprobs object; `offset` is the text offset of the first token."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for lp in lps:
        text, _ = _token(tok, lp.token_id)
        tokens.append(text)
        token_lps.append(lp.logprob)
        # the sampled token first, then the k most likely: OpenAI's "up to logprobs + 1" entries, as vLLM
        top = {text: lp.logprob}
        for tid, v in lp.top:
            top.setdefault(_token(tok, tid)[0], v)
        tops.append(top)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


@dataclass
class Choice:
    """One completion accumulated for a non-streaming response."""

    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    message: dict[str, Any] | None = None  # chat message fields replacing the text (tool calls)
    reasoning: str | None = None  # the think block's text when the reply splits (None: it does not)


@dataclass
class ResponseHead:
    id: str
    model: str
    chat: bool
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, choices: list[dict[str, Any]], with_usage_field: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        }
        if with_usage_field:
            body["usage"] = None
        return body

    def usage_chunk(self, u: dict[str, Any]) -> dict[str, Any]:
        return {**self.chunk([], False), "usage": u}

    def full(self, tok: Tokenizer, choices: list[Choice], want_logprobs: bool, u: dict) -> dict[str, Any]:
        out = []
        for i, c in enumerate(choices):
            if self.chat:
                lp = {"content": chat_logprobs(tok, c.logprobs), "refusal": None} if want_logprobs else None
                message = {"role": "assistant", "content": c.text, "refusal": None, **(c.message or {})}
                if c.reasoning is not None:
                    message.update(reasoning_fields(c.reasoning or None))
                out.append(
                    {
                        "index": i,
                        "message": message,
                        "logprobs": lp,
                        "finish_reason": c.finish_reason,
                    }
                )
            else:
                lp = completion_logprobs(tok, c.logprobs, 0) if want_logprobs else None
                out.append({"index": i, "text": c.text, "logprobs": lp, "finish_reason": c.finish_reason})
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": out,
            "usage": u,
        }


def timings_of(m: RequestMetrics, prompt_tokens: int, cached_tokens: int, predicted: int) -> dict[str, Any]:
    """llama-server's `timings` (its clients show them; OpenAI's ignore them) from the engine's metrics:
    the prompt's computed tokens and the generated ones, each with its time, per token and per second."""
    if m.first_token_time is None:
        return {}
    finished = m.finished_time or time.monotonic()
    prompt_n = max(prompt_tokens - cached_tokens, 0)
    prompt_ms = (m.first_token_time - m.arrival_time) * 1e3
    predicted_ms = (finished - m.first_token_time) * 1e3
    steps = max(predicted - 1, 0)
    return {
        "cache_n": cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n * 1e3 / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": predicted,
        "predicted_ms": predicted_ms,
        # the first token comes with the prompt (prompt_ms): predicted_ms is the other tokens' decode steps
        "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
        "predicted_per_second": steps * 1e3 / predicted_ms if steps and predicted_ms > 0 else 0.0,
    }
