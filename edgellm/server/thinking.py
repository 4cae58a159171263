"""The thinking side of a chat request: `reasoning_effort` and `chat_template_kwargs` parsed, turned into
template variables and a reasoning budget for this server's model (edgellm.reasoning.thinking_plan),
and the request's params set to split the reply once its prompt is rendered."""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING, Any

from edgellm.reasoning import configure, split_mode, thinking_plan

if TYPE_CHECKING:
    from edgellm.server.app import ServerState
    from edgellm.server.protocol import GenerationRequest


def _bad(param: str, message: str) -> Exception:
    from edgellm.server.protocol import _bad as bad  # protocol imports this module

    return bad(param, message)


def _api_error(*args: Any, **kw: Any) -> Exception:
    from edgellm.server.protocol import ApiError

    return ApiError(*args, **kw)


# OpenAI's reasoning_effort values -> thinking on or off (a template's switch has no levels).
REASONING_EFFORTS = {"none": False, "minimal": True, "low": True, "medium": True, "high": True}
TEMPLATE_KWARGS = {"enable_thinking": bool}  # chat_template_kwargs a request may set, and their types


def parse_thinking(body: dict) -> tuple[bool | None, str | None]:
    """(thinking on/off or None, the field that said so) from `reasoning_effort` and
    `chat_template_kwargs` (vLLM's and llama.cpp's extension field)."""
    effort, kwargs = body.get("reasoning_effort"), body.get("chat_template_kwargs")
    if effort is not None and not isinstance(effort, str):
        raise _bad("reasoning_effort", f"expected a string, got {type(effort).__name__}")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise _bad("reasoning_effort", f"expected one of {', '.join(REASONING_EFFORTS)}, got {effort!r}")
    think = None if effort is None else REASONING_EFFORTS[effort]
    if kwargs is None:
        return think, None if effort is None else "reasoning_effort"
    if not isinstance(kwargs, dict):
        raise _bad("chat_template_kwargs", "expected an object")
    for key, value in kwargs.items():
        if key not in TEMPLATE_KWARGS:
            supported = ", ".join(TEMPLATE_KWARGS)
            raise _bad(
                "chat_template_kwargs", f"{reprlib.repr(key)} is not supported (supported: {supported})"
            )
        if not isinstance(value, TEMPLATE_KWARGS[key]):
            raise _bad(f"chat_template_kwargs.{key}", f"expected a {TEMPLATE_KWARGS[key].__name__}")
    enable = kwargs.get("enable_thinking")
    if enable is None:
        return think, None if effort is None else "reasoning_effort"
    if think is not None and think != enable:
        raise _bad("chat_template_kwargs.enable_thinking", f"contradicts reasoning_effort {effort!r}")
    return enable, "chat_template_kwargs.enable_thinking"


def thinking_options(state: ServerState, req: GenerationRequest) -> tuple[dict[str, Any], int | None]:
    """The template variables and reasoning budget of a chat request (edgellm.reasoning.thinking_plan);
    a 400 naming the field when its thinking on/off cannot be honoured by this model."""
    source = state.template.source if state.template is not None else ""
    c = state.config
    plan = thinking_plan(c.reasoning_format, c.reasoning_budget, source, req.enable_thinking)
    if plan is None:
        param = req.thinking_param or "reasoning_effort"
        raise _api_error(
            400,
            f"'{param}': this model's chat template has no thinking to turn on or off"
            f" (--reasoning-format {c.reasoning_format})",
            param=param,
            code="unsupported_value",
        )
    return plan


def reasoning_setup(state: ServerState, req: GenerationRequest, prompt_text: str, budget: int | None) -> None:
    """Set the request's params to split its reply as the rendered chat prompt `prompt_text` and
    --reasoning-format say, with at most `budget` reasoning tokens."""
    source = state.template.source if state.template is not None else ""
    mode = split_mode(state.config.reasoning_format, source, prompt_text)
    if req.params.compiled_grammar is not None:  # the grammar covers the whole reply: it is all answer
        mode = None
    configure(req.params, state.llm.tokenizer, mode, budget)
