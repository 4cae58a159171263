"""Chat messages -> prompt token ids for an in-process model: the GGUF chat template (through
edgellm.chat.template, compiled once per model) and llama.cpp-style prompt tokenization."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from weakref import WeakKeyDictionary

from tui.messages import BackendError, ChatMessage

_templates: WeakKeyDictionary[Any, Any] = WeakKeyDictionary()
# `edgellm chat --allow-special-in-content`: control-token text typed in a message becomes control tokens.
allow_special_in_content = False


def _template_for(llm: Any) -> Any:
    from edgellm.chat.template import ChatTemplate

    tmpl = _templates.get(llm)
    if tmpl is None:
        tmpl = _templates[llm] = ChatTemplate.from_metadata(llm.metadata, llm.tokenizer)
    return tmpl


def render_prompt_ids(llm: Any, messages: Sequence[ChatMessage], params: Any = None) -> list[int]:
    """The conversation's prompt ids; with SamplingParams `params`, they are also set to split the reply's
    reasoning when the template thinks (edgellm.chat.reasoning, as `--reasoning-format auto`)."""
    from edgellm.chat.reasoning import configure, split_mode
    from edgellm.chat.template import ChatTemplateError

    try:
        template = _template_for(llm)
        prompt = template.render_prompt(
            [{"role": m.role, "content": m.content} for m in messages],
            llm.tokenizer,
            allow_special_in_content=allow_special_in_content,
        )
        if params is not None:
            configure(params, llm.tokenizer, split_mode("auto", template.source, prompt.text), None)
        return prompt.token_ids
    except ChatTemplateError as e:
        raise BackendError(f"The model's chat template rejected the conversation: {e}") from e
