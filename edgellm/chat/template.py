"""Chat templates: turn a list of chat messages into the prompt text a model was trained on.

The GGUF's ``tokenizer.chat_template`` (a Hugging Face Jinja template) is rendered in Jinja's
``ImmutableSandboxedEnvironment`` (a template is data from a downloaded file: it may not touch Python
objects or mutate anything), bounded in time, size and depth (edgellm.chat.sandbox), with the
globals Hugging Face templates expect: ``raise_exception``, ``strftime_now``, ``bos_token``,
``eos_token``, ``add_generation_prompt`` and a ``tojson`` filter that keeps non-ASCII text as is.

A model without a template gets a built-in fallback, chosen by architecture and announced once with a
warning: Gemma's turn format for gemma/gemma2/gemma3 (Google's Gemma 3 template), ChatML otherwise
(llama.cpp's own default when a model has no template).

API
---
``ChatTemplate.from_metadata(metadata, tokenizer=None)`` / ``ChatTemplate(source, bos_token, eos_token)``
    compile once; ``.render(messages, add_generation_prompt=True) -> str``; ``.name`` says where the
    template came from ("gguf", "gemma (built-in fallback)", "chatml (built-in fallback)");
    ``time_limit``/``max_chars`` bound each render; ``.check()`` probes a template at load.
``ChatTemplate.render_prompt(messages, tokenizer, add_generation_prompt=True,
allow_special_in_content=False) -> ChatPrompt(text, token_ids)``
    the prompt for generation: user and tool content is data (typed control-token text stays text;
    only the template's own text produces control tokens).
``render_chat(metadata_or_template, messages, add_generation_prompt=True, tokenizer=None) -> str``
    one-shot form. ``metadata_or_template`` is a GGUF metadata mapping (``llm.metadata``), a template
    source string, or a ``ChatTemplate``; ``tokenizer`` (an ``edgellm.tokenizer.Tokenizer``) supplies
    the BOS/EOS token texts when the metadata's token list is not at hand.
``prompt_token_ids(tokenizer, text, literal=None, max_tokens=None) -> list[int]``
    tokenizes rendered text the way llama.cpp's server does: special tokens are parsed (everywhere:
    use render_prompt for conversations), and BOS is added only when the text does not already start
    with it (templates such as Gemma's emit it).

Messages are dicts with ``role`` and ``content``; content may be a string or OpenAI content parts
(``[{"type": "text", "text": ...}]``), whose texts are joined with newlines before rendering because
text-only templates concatenate ``message['content']`` as a string.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import jinja2
import jinja2.ext

from edgellm.chat.harmony import with_past_reasoning
from edgellm.chat.reasoning_harmony import CHANNEL
from edgellm.chat.sandbox import (
    DEFAULT_MAX_CHARS,
    DEFAULT_TIME_LIMIT_S,
    LimitedSandboxEnvironment,
    TemplateLimitError,
    render_limited,
)
from edgellm.chat.tools import fallback_messages, has_tool_content, native_messages

log = logging.getLogger("edgellm.chat.template")


class ChatTemplateError(ValueError):
    """The template could not be compiled, broke a limit or rejected the messages (raise_exception,
    which sets `from_template_text`)."""

    def __init__(self, message: str, from_template_text: bool = False) -> None:
        super().__init__(message)
        self.from_template_text = from_template_text


# llama.cpp's default for a model without a template (LLM_CHAT_TEMPLATE_CHATML).
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# Google's Gemma 3 chat template (google/gemma-3-*-it tokenizer_config.json), text parts only.
GEMMA_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {{- message['content'] | trim }}\n"
    "    {{- '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)

_GEMMA_ARCHS = {"gemma", "gemma2", "gemma3", "gemma3n"}


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template error: {message}", from_template_text=True)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False
) -> str:
    # Hugging Face's tojson keeps non-ASCII characters and does not HTML-escape (Jinja's built-in does).
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _environment() -> LimitedSandboxEnvironment:
    env = LimitedSandboxEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.finalize_filters()
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _content_text(content: Any) -> Any:
    """OpenAI content parts -> one string; anything else is left to the template. Text parts are joined
    with newlines, but none before or after an image's media marker (llama.cpp's concat_content_parts)."""
    if isinstance(content, list) and all(isinstance(p, Mapping) for p in content):
        text, after_marker = "", False
        for p in content:
            kind = p.get("type", "text")
            if kind == "text":
                text += ("\n" if text and not after_marker else "") + str(p.get("text", ""))
                after_marker = False
            elif kind == "media_marker":
                text += str(p.get("text", ""))
                after_marker = True
        return text
    return "" if content is None else content


def _token_text(metadata: Mapping[str, Any] | None, tokenizer: Any, key: str, attr: str) -> str:
    tid = None
    if metadata is not None:
        tid = metadata.get(f"tokenizer.ggml.{key}_token_id")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if tid is not None and tokens is not None and 0 <= int(tid) < len(tokens):
            return str(tokens[int(tid)])
    if tokenizer is not None:
        tid = getattr(tokenizer, attr, None) if tid is None else int(tid)
        if tid is not None:
            return tokenizer.token_bytes(tid).decode("utf-8", errors="replace")
    return ""


# The conversation ChatTemplate.supports_tools renders: each marker must come out of a template with tools.
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "edgellm_probe_tool",
        "description": "probe",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}
_PROBE_CALL = {
    "id": "call_probe",
    "type": "function",
    "function": {"name": "edgellm_probe_call", "arguments": '{"x": "y"}'},
}
_PROBE_RESULT = "edgellm_probe_result"


class ChatPrompt(NamedTuple):
    text: str  # the rendered conversation
    token_ids: list[int]


# Placeholders for control-token text typed inside message content: Supplementary Private Use Area
# characters, which templates' string operations (trim, split on ASCII, case changes) leave alone.
_PLACEHOLDER_OPEN, _PLACEHOLDER_CLOSE, _PLACEHOLDER_DIGIT0 = "\U000f0000", "\U000f0001", 0xF0010
# Roles whose content is data from the conversation's participants, not the operator's instructions.
DATA_ROLES = frozenset({"user", "tool"})


def _placeholder(nonce: int, index: int) -> str:
    digits = f"{nonce:016x}{index:x}"
    inner = "".join(chr(_PLACEHOLDER_DIGIT0 + int(d, 16)) for d in digits)
    return _PLACEHOLDER_OPEN + inner + _PLACEHOLDER_CLOSE


class ChatTemplate:
    def __init__(
        self,
        source: str,
        bos_token: str = "",
        eos_token: str = "",
        name: str = "custom",
        time_limit: float = DEFAULT_TIME_LIMIT_S,
        max_chars: int = DEFAULT_MAX_CHARS,
    ) -> None:
        self.source, self.bos_token, self.eos_token, self.name = source, bos_token, eos_token, name
        self.time_limit, self.max_chars = time_limit, max_chars
        self._supports_tools: bool | None = None
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"cannot compile the chat template: {e}") from e
        except RecursionError:
            raise ChatTemplateError("cannot compile the chat template: it is nested too deeply") from None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], tokenizer: Any = None) -> ChatTemplate:
        bos = _token_text(metadata, tokenizer, "bos", "bos_id")
        eos = _token_text(metadata, tokenizer, "eos", "eos_id")
        source = metadata.get("tokenizer.chat_template")
        if source:
            return cls(str(source), bos, eos, name="gguf")
        arch = str(metadata.get("general.architecture", ""))
        kind, source = ("gemma", GEMMA_TEMPLATE) if arch in _GEMMA_ARCHS else ("chatml", CHATML_TEMPLATE)
        log.warning(
            "the model has no tokenizer.chat_template; using the built-in %s template (architecture %r)",
            kind,
            arch,
        )
        return cls(source, bos, eos, name=f"{kind} (built-in fallback)")

    def check(self) -> None:
        """Render a one-message conversation: a template that breaks its limits (or cannot render plain
        messages) raises ChatTemplateError now, at load, rather than on every request."""
        try:
            self.render([{"role": "user", "content": "Hello"}])
        except ChatTemplateError as e:
            if e.from_template_text:  # the template's own raise_exception may just want other roles
                return
            raise ChatTemplateError(f"the {self.name} chat template is broken: {e}") from None

    @property
    def supports_tools(self) -> bool:
        """Whether the template renders tools, assistant tool calls and tool results itself (probed once
        with a conversation holding one of each); if not, edgellm.chat.tools' fallback writes them into
        plain messages."""
        if self._supports_tools is None:
            probe = [
                {"role": "user", "content": "u"},
                {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]},
                {"role": "tool", "tool_call_id": "call_probe", "content": _PROBE_RESULT},
            ]
            try:
                text = self._render(native_messages(probe), True, [_PROBE_TOOL])
                markers = (_PROBE_TOOL["function"]["name"], _PROBE_CALL["function"]["name"], _PROBE_RESULT)
                self._supports_tools = all(marker in text for marker in markers)
            except ChatTemplateError:
                self._supports_tools = False
        return self._supports_tools

    def _with_tools(
        self, msgs: list[dict[str, Any]], tools: Sequence[Any] | None
    ) -> tuple[list[dict[str, Any]], list[Any] | None]:
        """Messages and `tools` as this template takes them (see edgellm.chat.tools), earlier turns'
        reasoning under the keys templates read (edgellm.chat.harmony)."""
        msgs = with_past_reasoning(msgs, CHANNEL in self.source)
        if not has_tool_content(msgs, tools):
            return msgs, None
        if self.supports_tools:
            return native_messages(msgs), list(tools) if tools else None
        return fallback_messages(msgs, tools), None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Any] | None = None,
    ) -> str:
        if not messages:
            raise ChatTemplateError("messages must not be empty")
        msgs = [{**m, "content": _content_text(m.get("content"))} for m in messages]
        msgs, tools = self._with_tools(msgs, tools)
        return self._render(msgs, add_generation_prompt, tools)

    def render_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        tokenizer: Any,
        add_generation_prompt: bool = True,
        allow_special_in_content: bool = False,
        tools: Sequence[Any] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
    ) -> ChatPrompt:
        """Rendered text and prompt ids. User and tool content is data: control-token text typed there
        (e.g. "<|im_start|>system") is tokenized as plain text, while the template's own text still
        produces control tokens. `allow_special_in_content` parses it in content too (the old way).
        `tools` (OpenAI tool objects) go to the template, or through the fallback (see supports_tools).
        `template_kwargs` are extra template variables (Qwen3's `enable_thinking`). `max_tokens`: a
        rendered text surely longer raises TextTooLongError before it is tokenized (Tokenizer.encode)."""
        if not messages:
            raise ChatTemplateError("messages must not be empty")
        msgs = [{**m, "content": _content_text(m.get("content"))} for m in messages]
        msgs, tools = self._with_tools(msgs, tools)
        if allow_special_in_content:
            text = self._render(msgs, add_generation_prompt, tools, template_kwargs)
            return ChatPrompt(text, prompt_token_ids(tokenizer, text, max_tokens=max_tokens))
        nonce = secrets.randbits(64)
        literal: dict[str, str] = {}  # placeholder -> the control-token text it stands for
        by_text: dict[str, str] = {}
        for m in msgs:
            content = m["content"]
            if m.get("role") not in DATA_ROLES or not isinstance(content, str):
                continue
            for special in tokenizer.control_texts_in(content):
                ph = by_text.get(special)
                if ph is None:
                    ph = by_text[special] = _placeholder(nonce, len(by_text))
                    literal[ph] = special
                content = content.replace(special, ph)
            m["content"] = content
        rendered = self._render(msgs, add_generation_prompt, tools, template_kwargs)
        text = rendered
        for ph, special in literal.items():
            text = text.replace(ph, special)
        return ChatPrompt(text, prompt_token_ids(tokenizer, rendered, literal, max_tokens))

    def _render(
        self,
        msgs: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[Any] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        context = {
            **(template_kwargs or {}),
            "messages": msgs,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        if tools:  # templates test `tools is defined` / `if tools`
            context["tools"] = tools
        try:
            return render_limited(
                self._template,
                context,
                self.time_limit,
                self.max_chars,
            )
        except ChatTemplateError:
            raise
        except TemplateLimitError as e:
            raise ChatTemplateError(str(e)) from None
        except jinja2.TemplateError as e:  # includes sandbox violations
            raise ChatTemplateError(f"chat template failed: {e}") from e
        except (TypeError, KeyError, IndexError, AttributeError, ValueError, ArithmeticError) as e:
            raise ChatTemplateError(f"chat template failed on these messages: {e!r}") from e


def render_chat(
    metadata_or_template: Mapping[str, Any] | str | ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    tokenizer: Any = None,
) -> str:
    if isinstance(metadata_or_template, ChatTemplate):
        tmpl = metadata_or_template
    elif isinstance(metadata_or_template, str):
        tmpl = ChatTemplate(
            metadata_or_template,
            _token_text(None, tokenizer, "bos", "bos_id"),
            _token_text(None, tokenizer, "eos", "eos_id"),
        )
    else:
        tmpl = ChatTemplate.from_metadata(metadata_or_template, tokenizer)
    return tmpl.render(messages, add_generation_prompt)


def prompt_token_ids(
    tokenizer: Any, text: str, literal: Mapping[str, str] | None = None, max_tokens: int | None = None
) -> list[int]:
    """Rendered chat text -> prompt ids with exactly one BOS where the model wants one. `literal` maps
    placeholders in `text` to text that is tokenized as plain text (see ChatTemplate.render_prompt);
    `max_tokens` as Tokenizer.encode's."""
    extra: dict[str, Any] = {"literal": literal} if literal else {}
    if max_tokens is not None:
        extra["max_tokens"] = max_tokens
    bos_id = getattr(tokenizer, "bos_id", None)
    if bos_id is not None and getattr(tokenizer, "add_bos", False):
        bos_text = tokenizer.token_bytes(bos_id).decode("utf-8", errors="replace")
        if bos_text and text.startswith(bos_text):
            return tokenizer.encode(text, add_special=False, parse_special=True, **extra)
    return tokenizer.encode(text, add_special=True, parse_special=True, **extra)
