"""Malformed bodies for the Ollama (/api/*), Anthropic (/v1/messages), Responses (/v1/responses) and infill
(/infill, `suffix`) routes: each must be a 400 in that API's error shape naming the field, never a 500,
and the server keeps serving. Shared by tests/server/test_api_untrusted.py and tests/server/test_infill.py.
"""

from __future__ import annotations

from typing import Any

_USER = [{"role": "user", "content": "hi"}]
_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
_BAD_REF = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}

# (path, body, what the error message names)
OLLAMA = [
    ("/api/chat", {"messages": "x"}, "'messages'"),
    ("/api/chat", {"messages": [{"role": "robot"}]}, "'messages[0].role'"),
    ("/api/chat", {"messages": [{"role": "user", "content": 5}]}, "'messages[0].content'"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": 5}]}, "'messages[0].images'"),
    # images to a model started without an mmproj file (the servers these attacks run against)
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["AA=="]}]}, "takes no images"),
    ("/api/chat", {"messages": _USER, "options": []}, "'options'"),
    ("/api/chat", {"messages": _USER, "options": {"num_predict": "x"}}, "'options.num_predict'"),
    ("/api/chat", {"messages": _USER, "options": {"temperature": True}}, "'options.temperature'"),
    ("/api/chat", {"messages": _USER, "options": {"stop": [1]}}, "'options.stop'"),
    ("/api/chat", {"messages": _USER, "options": {"seed": -1}}, "'options.seed'"),
    ("/api/chat", {"messages": _USER, "options": {"mirostat_eta": 0.1, "mirostat": 1}}, "'options.mirostat'"),
    ("/api/chat", {"messages": _USER, "options": {"num_ctx": "big"}}, "'options.num_ctx'"),
    ("/api/chat", {"messages": _USER, "format": 5}, "'format'"),
    ("/api/chat", {"messages": _USER, "format": _BAD_REF}, "'format'"),
    ("/api/chat", {"messages": _USER, "keep_alive": []}, "'keep_alive'"),
    ("/api/chat", {"messages": _USER, "think": True}, "'think'"),  # a model that does not think
    ("/api/chat", {"messages": _USER, "think": [1]}, "'think'"),
    ("/api/generate", {"prompt": "x", "raw": True, "think": True}, "'think'"),
    ("/api/chat", {"messages": _USER, "stream": "yes"}, "'stream'"),
    ("/api/chat", {"messages": _USER, "tools": "x"}, "'tools'"),
    ("/api/chat", {"messages": _USER, "logprobs": True}, "'logprobs'"),
    ("/api/chat", {"messages": [*_USER, {"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}}]}]},
     "'messages[1].tool_calls[0].function.arguments'"),
    ("/api/chat", {"messages": [{"role": "tool", "content": "x", "tool_name": 3}]},
     "'messages[0].tool_name'"),
    ("/api/generate", {"prompt": 5}, "'prompt'"),
    ("/api/generate", {"prompt": "x", "raw": True, "system": "s"}, "'system'"),
    ("/api/generate", {"prompt": "x", "raw": "yes"}, "'raw'"),
    ("/api/generate", {"prompt": "x", "suffix": "y"}, "'suffix'"),
    ("/api/generate", {"prompt": "x", "context": [1, 2]}, "'context'"),
    ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, "'template'"),
    ("/api/generate", {"prompt": "x", "options": {"typical_p": 0.5}}, "'options.typical_p'"),
    ("/api/embed", {"input": []}, "'input'"),
    ("/api/embed", {"input": [1, 2]}, "'input'"),
    ("/api/embed", {"input": "x", "dimensions": 3}, "'dimensions'"),
    ("/api/embed", {"input": "x", "truncate": "no"}, "'truncate'"),
    ("/api/embed", {"input": "x", "options": {"bogus": 1}}, "'options.bogus'"),
    ("/api/embed", {"input": "x " * 2000}, "maximum context length"),
    ("/api/embeddings", {"prompt": 3}, "'prompt'"),
    ("/api/show", {}, "'model'"),
    ("/api/pull", {"model": 5}, "'model'"),
    ("/api/pull", {"model": "x", "stream": 1}, "'stream'"),
]  # fmt: skip

ANTHROPIC = [
    ("/v1/messages", {"messages": _USER}, "'max_tokens'"),
    ("/v1/messages", {"max_tokens": "x", "messages": _USER}, "'max_tokens'"),
    ("/v1/messages", {"max_tokens": 0, "messages": _USER}, "'max_tokens'"),
    ("/v1/messages", {"max_tokens": 8, "messages": []}, "'messages'"),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]},
     "'messages[0].role'"),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": 5}]},
     "'messages[0].content'"),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
     "'messages[0].content[0].source'"),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
     "'messages[0].content[0].tool_use_id'"),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": 5}]}]}, "'messages[0].content[0].content'"),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}]}, "'messages[0].content[0].input'"),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [5]}]},
     "'messages[0].content[0]'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "system": 5}, "'system'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "system": [{"type": "image"}]}, "'system[0]'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "stop_sequences": [1]}, "'stop_sequences'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "tools": [{"name": "f"}]}, "'tools[0]'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "tools": [{"type": "web_search_20250305",
                                                                     "name": "web_search"}]}, "'tools[0]'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "tool_choice": {"type": "bogus"}}, "'tool_choice'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "tools": [{"name": "f", "input_schema": {}}],
                      "tool_choice": {"type": "tool", "name": "g"}}, "'tool_choice'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "tools": [{"name": "f", "input_schema": {}}],
                      "tool_choice": {"type": "any", "disable_parallel_tool_use": "yes"}},
     "'tool_choice.disable_parallel_tool_use'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "tools": [{"name": "f", "input_schema": _BAD_REF}],
                      "tool_choice": {"type": "any"}}, "'tools'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "thinking": {"type": "enabled",
                                                                       "budget_tokens": 1024}},
     "'thinking.budget_tokens'"),  # not below max_tokens
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "thinking": {"type": "enabled"}},
     "'thinking.budget_tokens'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "thinking": {"type": "adaptive"}}, "'thinking'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "foo": 1}, "'foo'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "temperature": -1}, "'temperature'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "metadata": 5}, "'metadata'"),
    ("/v1/messages", {"max_tokens": 8, "messages": _USER, "stream": "yes"}, "'stream'"),
    ("/v1/messages/count_tokens", {"messages": "x"}, "'messages'"),
    ("/v1/messages/count_tokens", {"messages": _USER, "max_tokens": 5}, "'max_tokens'"),
]  # fmt: skip

RESPONSES = [
    ("/v1/responses", {"model": "m"}, "'input'"),
    ("/v1/responses", {"input": 5}, "'input'"),
    ("/v1/responses", {"input": [{"role": "bot", "content": "x"}]}, "'input[0].role'"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "'input[0].content[0].image_url'"),
    ("/v1/responses", {"input": [{"type": "function_call", "call_id": 1}]}, "'input[0]'"),
    ("/v1/responses", {"input": [{"type": "function_call_output"}]}, "'input[0].call_id'"),
    ("/v1/responses", {"input": [{"type": "item_reference", "id": "x"}]}, "'input[0].type'"),
    ("/v1/responses", {"input": "x", "tools": [{"type": "web_search"}]}, "'tools[0]'"),
    ("/v1/responses", {"input": "x", "tools": [{"type": "function", "name": "a b"}]},
     "'tools[0].function.name'"),
    ("/v1/responses", {"input": "x", "tool_choice": {"type": "file_search"}}, "'tool_choice'"),
    ("/v1/responses", {"input": "x", "text": 5}, "'text'"),
    ("/v1/responses", {"input": "x", "text": {"format": {"type": "xml"}}}, "'text.format'"),
    ("/v1/responses", {"input": "x", "text": {"format": {"type": "json_schema", "schema": 5}}},
     "'text.format.schema'"),
    ("/v1/responses", {"input": "x", "text": {"format": {"type": "json_schema", "name": "a b",
                                                          "schema": {}}}},
     "'text.format.name'"),
    ("/v1/responses", {"input": "x", "text": {"format": {"type": "json_schema", "name": "a",
                                                          "schema": _BAD_REF}}}, "'text.format'"),
    ("/v1/responses", {"input": "x", "max_output_tokens": 0}, "'max_output_tokens'"),
    ("/v1/responses", {"input": "x", "previous_response_id": 5}, "'previous_response_id'"),
    ("/v1/responses", {"input": "x", "previous_response_id": "resp_gone"}, "'previous_response_id'"),
    ("/v1/responses", {"input": "x", "reasoning": {"effort": "high"}}, "'reasoning.effort'"),  # no thinking
    ("/v1/responses", {"input": "x", "reasoning": {"effort": "extreme"}}, "'reasoning.effort'"),
    ("/v1/responses", {"input": "x", "reasoning": {"summary": "verbose"}}, "'reasoning.summary'"),
    ("/v1/responses", {"input": "x", "reasoning": 5}, "'reasoning'"),
    ("/v1/responses", {"input": "x", "truncation": "middle"}, "'truncation'"),
    ("/v1/responses", {"input": "x", "include": ["message.output_text.logprobs"]}, "'include'"),
    ("/v1/responses", {"input": "x", "include": "reasoning.encrypted_content"}, "'include'"),
    ("/v1/responses", {"input": "x", "instructions": 5}, "'instructions'"),
    ("/v1/responses", {"input": "x", "store": "yes"}, "'store'"),
    ("/v1/responses", {"input": "x", "frobnicate": True}, "'frobnicate'"),
    ("/v1/responses", {"input": "x", "temperature": "hot"}, "'temperature'"),
]  # fmt: skip

# llama.cpp's /infill and `suffix` on /v1/completions (OpenAI's error shape), on a model with FIM tokens.
INFILL = [
    ("/infill", {"input_prefix": 5}, "'input_prefix'"),
    ("/infill", {"input_suffix": ["x"]}, "'input_suffix'"),
    ("/infill", {"prompt": [1, 2]}, "'prompt'"),
    ("/infill", {"input_extra": "x"}, "'input_extra'"),
    ("/infill", {"input_extra": [5]}, "'input_extra[0]'"),
    ("/infill", {"input_extra": [{"filename": "a"}]}, "'input_extra[0].text'"),
    ("/infill", {"input_extra": [{"text": "a", "filename": 3}]}, "'input_extra[0].filename'"),
    ("/infill", {"n_predict": "x"}, "'n_predict'"),
    ("/infill", {"n_predict": 0}, "'n_predict'"),
    ("/infill", {"n_predict": True}, "'n_predict'"),
    ("/infill", {"n_predict": 4, "max_tokens": 4}, "'n_predict'"),
    ("/infill", {"n": 2}, "'n'"),
    ("/infill", {"temperature": "hot"}, "'temperature'"),
    ("/infill", {"stop": [1]}, "'stop'"),
    ("/infill", {"logit_bias": {"999999": 1}}, "'logit_bias'"),
    ("/v1/completions", {"prompt": "a", "suffix": 5}, "'suffix'"),
    ("/v1/completions", {"prompt": [1, 2], "suffix": "b"}, "'suffix'"),
]

# Bodies that are not a request at all, sent raw to every new route: (raw body, what the message says).
RAW = [
    (b"[1, 2]", "must be a JSON object"),
    (b"{", "malformed JSON"),
    (b'{"messages": ' + b"[" * 10000 + b"]" * 10000 + b"}", "nested too deeply"),
    (
        b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "input": "\\udfff", "prompt": "\\ud800"}',
        "lone surrogate",
    ),
]
NEW_POST_ROUTES = ["/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/show", "/api/pull",
                   "/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/infill"]  # fmt: skip


def error_message(path: str, body: Any) -> str | None:
    """The message of an error body in the shape of the API `path` belongs to, or None if it is not."""
    if path.startswith("/api/"):
        ok = isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str)
        return body["error"] if ok else None
    if path.startswith("/v1/messages"):
        err = body.get("error") if isinstance(body, dict) and body.get("type") == "error" else None
        return (
            err["message"] if isinstance(err, dict) and err.get("type") == "invalid_request_error" else None
        )
    err = body.get("error") if isinstance(body, dict) else None
    return (
        err["message"] if isinstance(err, dict) and {"message", "type", "param", "code"} <= set(err) else None
    )
