"""A chat request's thinking fields (protocol.parse_chat reads them with parse_thinking): its
`reasoning_effort`, `chat_template_kwargs` and reasoning budget fields, into a ThinkingAsk that
thinking.py turns into template variables and a budget for the server's model.

The per-request budget (docs/reasoning.md): `reasoning_effort` `minimal`/`low`/`medium`/`high` asks for
EFFORT_BUDGETS[level] reasoning tokens, and at most half the request's max_tokens, so that the answer has
room; `thinking_budget_tokens` (llama-server's field; `reasoning_budget_tokens` too; Anthropic's
`thinking.budget_tokens` and Ollama's `think` levels arrive as these) asks for exactly N. A request's
budget replaces the server's `--reasoning-budget` (as llama-server's does); a request that sets none
gets the server's."""

from __future__ import annotations

import reprlib
from dataclasses import dataclass

from edgellm.server.http.errors import bad_value

# reasoning_effort -> the reasoning budget in tokens it asks for (then capped at max_tokens // 2)
EFFORT_BUDGETS = {"minimal": 256, "low": 1024, "medium": 4096, "high": 16384}
REASONING_EFFORTS = ("none", *EFFORT_BUDGETS)  # "none": thinking off
BUDGET_FIELDS = ("thinking_budget_tokens", "reasoning_budget_tokens")  # llama-server's spellings
TEMPLATE_KWARGS = {"enable_thinking": bool}  # chat_template_kwargs a request may set, and their types
EFFORT_VARIABLE = "reasoning_effort"  # gpt-oss's template reads the level itself ("Reasoning: low")


@dataclass(frozen=True)
class ThinkingAsk:
    """What a chat request asked of the model's thinking."""

    enable: bool | None = None  # thinking on or off; None: the template's default
    param: str | None = None  # the field that asked it, for errors
    budget: int | None = None  # reasoning tokens (-1: unlimited); None: the server's --reasoning-budget
    effort: str | None = None  # the reasoning_effort level asked, for a template that reads it


def effort_budget(effort: str, max_tokens: int) -> int:
    """The reasoning budget of a `reasoning_effort` level other than "none" for a reply of at most
    `max_tokens` tokens: the level's, and at most half of max_tokens (at least 1)."""
    return min(EFFORT_BUDGETS[effort], max(1, max_tokens // 2))


def _explicit_budget(body: dict) -> tuple[int | None, str | None]:
    for key in BUDGET_FIELDS:
        v = body.get(key)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < -1:
            raise bad_value(
                key, f"expected an integer >= -1 (-1: the server's --reasoning-budget), got {v!r}"
            )
        return (None if v == -1 else v), key
    return None, None


def _template_switch(body: dict) -> bool | None:
    """`chat_template_kwargs.enable_thinking`, its keys and types checked."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        raise bad_value("chat_template_kwargs", "expected an object")
    for key, value in kwargs.items():
        if key not in TEMPLATE_KWARGS:
            supported = ", ".join(TEMPLATE_KWARGS)
            raise bad_value(
                "chat_template_kwargs", f"{reprlib.repr(key)} is not supported (supported: {supported})"
            )
        if not isinstance(value, TEMPLATE_KWARGS[key]):
            raise bad_value(f"chat_template_kwargs.{key}", f"expected a {TEMPLATE_KWARGS[key].__name__}")
    return kwargs.get("enable_thinking")


def parse_thinking(body: dict, max_tokens: int) -> ThinkingAsk:
    """The ThinkingAsk of an OpenAI chat body: `reasoning_effort`, `chat_template_kwargs` (vLLM's and
    llama.cpp's extension field) and a budget field; a 400 naming the field for a bad or contradictory
    value."""
    effort = body.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise bad_value("reasoning_effort", f"expected a string, got {type(effort).__name__}")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise bad_value("reasoning_effort", f"expected one of {', '.join(REASONING_EFFORTS)}, got {effort!r}")
    think = None if effort is None else effort != "none"
    param = None if effort is None else "reasoning_effort"
    budget = effort_budget(effort, max_tokens) if think else None
    explicit, budget_key = _explicit_budget(body)
    enable = _template_switch(body)
    if enable is not None:
        if think is not None and think != enable:
            where = "chat_template_kwargs.enable_thinking"
            raise bad_value(where, f"contradicts reasoning_effort {effort!r}")
        think, param = enable, "chat_template_kwargs.enable_thinking"
    if explicit is not None:  # (-1 is not given)
        if think is False and explicit:
            raise bad_value(budget_key, "a reasoning budget contradicts thinking off")
        budget, param = explicit, param or budget_key
    level = effort if think and effort in EFFORT_BUDGETS else None
    return ThinkingAsk(think, param, budget, level)
