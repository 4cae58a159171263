"""The thinking side of a chat request: its ThinkingAsk (thinking_fields.py) turned into template
variables and a reasoning budget for this server's model (edgellm.chat.reasoning.thinking_plan), and the
request's params set to split the reply once its prompt is rendered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgellm.chat.reasoning import configure, split_mode, thinking_plan
from edgellm.server.http.errors import ApiError
from edgellm.server.thinking_fields import EFFORT_VARIABLE

if TYPE_CHECKING:
    from edgellm.server.protocol import GenerationRequest
    from edgellm.server.state import ServerState


def can_switch_thinking(state: ServerState) -> bool:
    """Whether this model's thinking can be turned off (a switch in its template, or a split to close)."""
    c, source = state.config, state.template.source if state.template is not None else ""
    return thinking_plan(c.reasoning_format, c.reasoning_budget, source, False) is not None


def thinking_options(state: ServerState, req: GenerationRequest) -> tuple[dict[str, Any], int | None]:
    """The template variables and reasoning budget of a chat request (edgellm.chat.reasoning.thinking_plan);
    a 400 naming the field when its thinking on/off cannot be honoured by this model."""
    source = state.template.source if state.template is not None else ""
    c, ask = state.config, req.thinking
    budget = c.reasoning_budget if ask.budget is None else ask.budget
    plan = thinking_plan(c.reasoning_format, budget, source, ask.enable)
    if plan is None:
        param = ask.param or "reasoning_effort"
        raise ApiError(
            400,
            f"'{param}': this model's chat template has no thinking to turn on or off"
            f" (--reasoning-format {c.reasoning_format})",
            param=param,
            code="unsupported_value",
        )
    kwargs, plan_budget = plan
    if ask.effort is not None and EFFORT_VARIABLE in source:
        kwargs = {**kwargs, EFFORT_VARIABLE: "low" if ask.effort == "minimal" else ask.effort}
    return kwargs, plan_budget


def reasoning_setup(state: ServerState, req: GenerationRequest, prompt_text: str, budget: int | None) -> None:
    """Set the request's params to split its reply as the rendered chat prompt `prompt_text` and
    --reasoning-format say, with at most `budget` reasoning tokens."""
    source = state.template.source if state.template is not None else ""
    mode = split_mode(state.config.reasoning_format, source, prompt_text)
    if req.params.compiled_grammar is not None:  # the grammar covers the whole reply: it is all answer
        mode = None
    configure(req.params, state.llm.tokenizer, mode, budget)
