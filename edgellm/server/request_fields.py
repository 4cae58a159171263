"""Which top-level fields /v1/chat/completions and /v1/completions take: any other is a 400 naming it.

OpenAI answers a field it does not know with 400 "Unrecognized request argument supplied: NAME"; so do
we, so that an option a client relies on is never silently dropped (a sampling knob spelled as another
server spells it, an output modality, a web search). Besides the fields protocol.py and tools.py parse:
- the sampling extensions of vLLM's and llama.cpp's servers that SamplingParams has (min_p, top_k,
  repetition_penalty: in PARAM_BOUNDS; min_tokens; llama-server's repeat_penalty and n_probs) and
  their output constraints (constraints.py: json_schema, grammar, guided_*, structured_outputs);
- fields that change nothing in the output and so are accepted as they come: OpenAI's identifiers and
  routing hints (user, safety_identifier, prompt_cache_key, metadata, service_tier) and llama-server's
  cache_prompt (the prefix cache is always on here);
- OpenAI fields accepted only at the value that asks for nothing we lack (store false, modalities
  ["text"]); any other value is a 400 saying what is not supported. `null` is "not given" everywhere;
- llama-server's and vLLM's fields likewise (OFF_VALUES): its slot hints change nothing here (one prefix
  cache, no context shift), its progress/debug outputs are taken when off.
"""

from __future__ import annotations

from typing import Any

from edgellm.sampling.sampler import PARAM_BOUNDS
from edgellm.server.constraints import CONSTRAINT_FIELDS
from edgellm.server.http.errors import bad_value
from edgellm.server.thinking_fields import BUDGET_FIELDS

_COMMON = {  # both routes: protocol._common's fields, and the no-effect user and cache_prompt
    "model", "max_tokens", "max_completion_tokens", "stop", "logit_bias", "stream", "stream_options",
    "seed", "n", "top_k", *PARAM_BOUNDS, "user", "cache_prompt",
    # llama-server's and vLLM's spellings of what SamplingParams has (protocol.py maps them)
    "repeat_penalty", "repeat_last_n", "n_probs", "min_tokens", *CONSTRAINT_FIELDS,
    "lora",  # llama-server's per-request LoRA adapters ([{"id", "scale"}])
}  # fmt: skip
_NO_EFFECT_CHAT = {"safety_identifier", "prompt_cache_key", "metadata", "service_tier"}
CHAT_FIELDS = _COMMON | _NO_EFFECT_CHAT | {
    "messages", "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
    "max_parallel_calls", "functions", "function_call", "reasoning_effort",
    "chat_template_kwargs", "store", "modalities", *BUDGET_FIELDS,
    "context_overflow",
}  # fmt: skip
COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs", "echo", "suffix", "tools", "tool_choice",
                               "best_of", "context_overflow"}  # fmt: skip

NO_EFFECT_ANY_VALUE = {"id_slot", "n_keep", "n_cache_reuse"}  # llama-server's slot and context-shift hints
# llama-server's (and vLLM's) fields, accepted at the value that asks for nothing: value, and why not others
OFF_VALUES: dict[str, tuple[object, str]] = {
    "return_progress": (False, "prompt progress events are not sent"),
    "timings_per_token": (False, "timings come once, with the finished reply"),
    "verbose": (False, "there is no __verbose debug object"),
    "continue_final_message": (False, "a trailing assistant message is not continued (prefill)"),
    "add_generation_prompt": (True, "the assistant turn is always opened"),
}
CHAT_ONLY = {"continue_final_message", "add_generation_prompt"}

# OpenAI fields that ask for what this server does not do, whatever their value (null aside)
NOT_SUPPORTED = {
    "audio": "audio output is not supported (text only)",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "verbosity": "verbosity is not supported: the model's output length follows max_tokens and the prompt",
}


def _check_values(body: dict[str, Any]) -> None:
    if body.get("store") not in (None, False):
        raise bad_value("store", "stored completions are not supported (store must be false)")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad_value("modalities", 'only ["text"] is supported')
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise bad_value("best_of", "only 1 is supported (use n for several completions)")


def check_fields(body: dict[str, Any], known: set[str]) -> None:
    """400 naming the first field (sorted) of `body` the endpoint does not take, or whose value asks for
    what this server does not do."""
    for key in sorted(body):
        if body[key] is None:
            continue
        if key in NOT_SUPPORTED:
            raise bad_value(key, NOT_SUPPORTED[key])
        if key in OFF_VALUES and (key not in CHAT_ONLY or "messages" in known):
            off, why = OFF_VALUES[key]
            if body[key] is not off:
                raise bad_value(key, f"only {str(off).lower()} is supported: {why}")
            continue
        if key not in known and key not in NO_EFFECT_ANY_VALUE:
            raise bad_value(key, "unrecognized request argument supplied (not an option of this endpoint)")
    _check_values(body)
