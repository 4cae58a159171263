"""Chat messages -> prompt token ids for an in-process model: the GGUF chat template (through
edgellm.chat_template, compiled once per model) and llama.cpp-style prompt tokenization."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from weakref import WeakKeyDictionary

from tui.messages import BackendError, ChatMessage

_templates: WeakKeyDictionary[Any, Any] = WeakKeyDictionary()


def _template_for(llm: Any) -> Any:
    from edgellm.chat_template import ChatTemplate

    tmpl = _templates.get(llm)
    if tmpl is None:
        tmpl = _templates[llm] = ChatTemplate.from_metadata(llm.metadata, llm.tokenizer)
    return tmpl


def render_prompt_ids(llm: Any, messages: Sequence[ChatMessage]) -> list[int]:
    from edgellm.chat_template import ChatTemplateError, prompt_token_ids

    try:
        text = _template_for(llm).render([{"role": m.role, "content": m.content} for m in messages])
    except ChatTemplateError as e:
        raise BackendError(f"The model's chat template rejected the conversation: {e}") from e
    return prompt_token_ids(llm.tokenizer, text)
