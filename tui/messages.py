"""The small messages the TUI and a chat backend exchange. The UI never touches engine internals: it
hands a backend `ChatMessage`s and `GenerationSettings` and gets `StreamDelta`s and one `StreamDone`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

Role = Literal["system", "user", "assistant"]


@dataclass
class ChatMessage:
    role: Role
    content: str


@dataclass
class GenerationSettings:
    system_prompt: str = ""
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 512
    seed: int | None = None  # None: a fresh random seed per reply

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationSettings:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class BackendInfo:
    """What a backend knows once it is ready. n_ctx None: the server did not say."""

    model: str
    n_ctx: int | None
    description: str = ""
    # the sampling the model's GGUF recommends (its general.sampling.* keys) as SamplingParams fields
    recommended: dict[str, Any] = field(default_factory=dict)


@dataclass
class StreamDelta:
    text: str
    reasoning: str = ""  # a thinking model's reasoning (its <think> block), shown folded above the answer
    # the reply's figures so far (as StreamDone's), where the backend knows them: a reply stopped before
    # its StreamDone still shows how fast it came
    ttft: float | None = None
    tokens_per_s: float | None = None


@dataclass
class StreamDone:
    finish_reason: str | None  # "stop" | "length" | "abort" | None (unknown)
    ttft: float | None  # seconds from request to first token
    tokens_per_s: float | None  # decode speed after the first token
    completion_tokens: int
    prompt_tokens: int | None = None


StreamEvent = StreamDelta | StreamDone


class BackendError(Exception):
    """A failure worth showing to the user as is: the message is a readable sentence, not a traceback."""
