"""Conversations and settings on disk: one JSON file per conversation under
`user_data_dir("edgellm")/conversations` (or `$EDGELLM_DATA_DIR/conversations`), always written
atomically (temp file + rename) so a crash or a closed terminal never leaves a half-written file."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tui.messages import ChatMessage, GenerationSettings


def data_dir() -> Path:
    env = os.environ.get("EDGELLM_DATA_DIR")
    if env:
        return Path(env)
    from platformdirs import user_data_dir

    return Path(user_data_dir("edgellm"))


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class StoredMessage:
    role: str  # "user" | "assistant"
    content: str
    in_context: bool = True  # False once the user agreed to drop it from what the model sees
    partial: bool = False  # a reply that was stopped, or is still streaming
    ttft: float | None = None
    tokens_per_s: float | None = None
    reasoning: str = ""  # a thinking model's reasoning; not sent back to the model with the history

    def as_chat(self) -> ChatMessage:
        return ChatMessage(self.role, self.content)  # type: ignore[arg-type]


@dataclass
class Conversation:
    id: str
    title: str = "New chat"
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    model: str = ""
    messages: list[StoredMessage] = field(default_factory=list)

    @staticmethod
    def new(model: str = "") -> Conversation:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return Conversation(id=f"{stamp}-{secrets.token_hex(3)}", model=model)

    def context_messages(self) -> list[ChatMessage]:
        return [m.as_chat() for m in self.messages if m.in_context]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Conversation:
        msgs = [StoredMessage(**m) for m in data.get("messages", [])]
        return cls(data["id"], data.get("title", "New chat"), data.get("created", 0.0),
                   data.get("updated", 0.0), data.get("model", ""), msgs)


class ConversationStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or data_dir()) / "conversations"

    def path(self, conv_id: str) -> Path:
        return self.root / f"{conv_id}.json"

    def save(self, conv: Conversation) -> None:
        conv.updated = time.time()
        write_json_atomic(self.path(conv.id), conv.to_dict())

    def load(self, conv_id: str) -> Conversation:
        return Conversation.from_dict(json.loads(self.path(conv_id).read_text(encoding="utf-8")))

    def list(self) -> list[Conversation]:
        """Every readable conversation, most recently updated first (unreadable files are skipped,
        never deleted: they may be a newer format)."""
        out = []
        for p in self.root.glob("*.json") if self.root.is_dir() else []:
            try:
                out.append(Conversation.from_dict(json.loads(p.read_text(encoding="utf-8"))))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return sorted(out, key=lambda c: (c.updated, c.id), reverse=True)

    def delete(self, conv_id: str) -> None:
        self.path(conv_id).unlink(missing_ok=True)


class SettingsStore:
    """The generation settings and the last model, kept between runs in settings.json."""

    def __init__(self, root: Path | None = None) -> None:
        self.path = (root or data_dir()) / "settings.json"

    def load(self) -> tuple[GenerationSettings, str | None]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return GenerationSettings.from_dict(data.get("generation", {})), data.get("model")
        except (OSError, ValueError, TypeError):
            return GenerationSettings(), None

    def save(self, settings: GenerationSettings, model: str | None) -> None:
        write_json_atomic(self.path, {"generation": settings.to_dict(), "model": model})
