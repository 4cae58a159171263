"""llama-server's own API (its tools/server/README.md), on the shared front-end: `POST /completion` (not
`/completions`: that one is OpenAI's here, as every /v1-less route), `GET /props`, `GET /slots`,
`POST /apply-template`, and the reply object that /completion and /infill both end with (`final_object`,
with llama-server's `timings`).

/completion's body is llama-server's: `prompt` (a string, token ids, ids and strings mixed, or a list of
those: one reply each), `n_predict` (-1: until the context's end), its sampling fields, `grammar` and
`json_schema`, `ignore_eos`, `return_tokens`, and the fields that change nothing here (`cache_prompt`,
`n_keep`, `id_slot`, `n_cache_reuse`). Its samplers edgellm does not have are taken at the value that turns
them off (OFF_VALUES, and their knobs while they are off); on, they are a 400 naming them, as is any
field llama-server does not define.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgellm.chat.template import ChatPrompt
from edgellm.engine.checks import PromptTooLongError
from edgellm.engine.protocol import TokenLogprob
from edgellm.server.events import End, Event, Frontend, Probs, Reply, Text, respond
from edgellm.server.http.errors import ApiError, bad_value, request_error
from edgellm.server.openai_format import llama_probs, sse, timings_of
from edgellm.server.protocol import (
    GenerationRequest,
    _is_int,
    _is_number,
    constrain,
    parse_chat,
    parse_completion,
)
from edgellm.server.request_fields import CHAT_FIELDS, check_fields
from edgellm.server.state import render_chat_prompt
from edgellm.server.thinking import thinking_options
from edgellm.tokenizer import TextTooLongError

if TYPE_CHECKING:
    from edgellm.server.state import ServerState

STOP_TYPES = {"length": "limit", "abort": "none"}  # llama-server's stop_type for our finish reasons
# Passed on to the OpenAI completion body as they are (the same names and meaning there).
SAME_FIELDS = (
    "temperature", "top_k", "top_p", "min_p", "stop", "presence_penalty", "frequency_penalty",
    "repeat_penalty", "repeat_last_n", "grammar", "json_schema", "stream", "min_tokens", "n_probs", "lora",
)  # fmt: skip
NO_EFFECT = ("cache_prompt", "n_keep", "n_cache_reuse", "id_slot")  # no context shift; one prefix cache
# llama-server's samplers edgellm lacks, at their "off" value; their knobs count only while they are on.
OFF_VALUES: dict[str, Any] = {
    "typical_p": 1.0, "mirostat": 0, "dynatemp_range": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
    "n_indent": 0, "t_max_predict_ms": 0, "min_keep": 0, "post_sampling_probs": False,
    "return_progress": False, "timings_per_token": False, "n_cmpl": 1,
}  # fmt: skip
KNOBS = {
    "mirostat_tau": "mirostat", "mirostat_eta": "mirostat", "dynatemp_exponent": "dynatemp_range",
    "dry_base": "dry_multiplier", "dry_allowed_length": "dry_multiplier",
    "dry_penalty_last_n": "dry_multiplier", "dry_sequence_breakers": "dry_multiplier",
    "xtc_threshold": "xtc_probability",
}  # fmt: skip
OWN = {"prompt", "n_predict", "seed", "logit_bias", "ignore_eos", "return_tokens", "samplers", "model",
       "response_fields"}  # fmt: skip
OUR_SAMPLER_ORDER = ("top_k", "top_p", "min_p", "temperature")  # after the penalties (sampling.py)


def timings(end: End | None) -> dict[str, Any]:
    """llama-server's `timings` of a finished request."""
    if end is None or end.metrics is None:
        return {}
    return timings_of(end.metrics, end.prompt_tokens, end.cached_tokens, end.completion_tokens)


def final_object(model: str, content: str, end: End | None, **extra: Any) -> dict[str, Any]:
    """The object a /completion or /infill reply ends with (the whole reply, or the stream's last event)."""
    reason = end.reason if end is not None else "stop"
    stop_word = end.stop_sequence if end is not None else None
    return {
        "index": 0,
        "content": content,
        "id_slot": -1,
        "stop": True,
        "model": model,
        "stop_type": STOP_TYPES.get(reason, "word" if stop_word else "eos"),
        "stopping_word": stop_word or "",
        "tokens_predicted": end.completion_tokens if end is not None else 0,
        "tokens_evaluated": end.prompt_tokens if end is not None else 0,
        "tokens_cached": end.cached_tokens if end is not None else 0,
        "truncated": False,  # nothing is cut: a prompt past the context is a 400
        "has_new_line": "\n" in content,
        "timings": timings(end),
        **extra,
    }


def _check_fields(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if value is None or key in OWN or key in SAME_FIELDS or key in NO_EFFECT:
            continue
        if key in OFF_VALUES:
            if value != OFF_VALUES[key]:
                raise bad_value(key, f"not supported here (only {OFF_VALUES[key]!r}: off)")
        elif key in KNOBS:
            if body.get(KNOBS[key]) not in (None, OFF_VALUES[KNOBS[key]]):
                raise bad_value(KNOBS[key], "not supported here (only its off value)")
        else:
            raise bad_value(key, "unrecognized request argument supplied (not an option of /completion)")
    samplers = body.get("samplers")
    if samplers is not None:
        if not isinstance(samplers, list) or not all(isinstance(s, str) for s in samplers):
            raise bad_value("samplers", "expected a list of sampler names")
        ours = [s for s in samplers if s in OUR_SAMPLER_ORDER]
        if ours != [s for s in OUR_SAMPLER_ORDER if s in ours]:
            raise bad_value("samplers", f"only the order {', '.join(OUR_SAMPLER_ORDER)} is supported")


def _logit_bias(value: Any, tokenizer: Any) -> dict[str, float] | None:
    """llama-server's [[id or text, bias or false], ...] (or {id or text: bias}) as OpenAI's object: a
    text's bias goes to each of its tokens, as llama-server does; false bans."""
    if value is None:
        return None
    pairs = list(value.items()) if isinstance(value, dict) else value
    if not isinstance(pairs, list):
        raise bad_value("logit_bias", "expected [[token id or text, bias], ...] or {token id or text: bias}")
    out: dict[str, float] = {}
    for pair in pairs:
        if not (isinstance(pair, list | tuple) and len(pair) == 2):
            raise bad_value("logit_bias", "expected [token id or text, bias] pairs")
        key, bias = pair
        if bias is False:
            bias = -100  # never these tokens
        elif not _is_number(bias):
            raise bad_value("logit_bias", "a bias is a number or false")
        if isinstance(key, str) and not key.lstrip("-").isdigit():
            ids = tokenizer.encode(key, add_special=False, parse_special=False, max_tokens=4096)
        elif _is_int(key) or isinstance(key, str):
            ids = [int(key)]
        else:
            raise bad_value("logit_bias", "a key is a token id or a text")
        for tid in ids:
            out[str(tid)] = bias
    return out


JSON_PROMPT_KEY = "prompt_string"  # llama-server's JSON prompt object: {"prompt_string", "multimodal_data"}


def _json_prompt(p: dict[str, Any]) -> str:
    text = p.get(JSON_PROMPT_KEY)
    if not isinstance(text, str) or set(p) - {JSON_PROMPT_KEY, "multimodal_data"}:
        raise bad_value("prompt", f"a JSON prompt is {{'{JSON_PROMPT_KEY}': text}} (and multimodal_data)")
    if p.get("multimodal_data"):
        raise bad_value("prompt", "multimodal_data is not supported: the model reads text only")
    return text


def _is_prompt(p: Any) -> bool:
    """One prompt: text, a JSON prompt object, or token ids mixed with text."""
    if isinstance(p, str | dict):
        return True
    return isinstance(p, list) and bool(p) and all(isinstance(t, str) or _is_int(t) for t in p)


async def _prompts(state: ServerState, prompt: Any) -> list[list[int]]:
    """llama-server's prompt shapes as token ids: text with BOS as the model adds it (a mixed list: when it
    starts with text), token ids as they are, a JSON prompt object's text; a list of such prompts, one
    each. Tokenized off the event loop; what cannot fit the context is refused by its size first."""
    one = _is_prompt(prompt) and not (isinstance(prompt, list) and all(isinstance(t, str) for t in prompt))
    prompts = [prompt] if one else prompt
    if not isinstance(prompts, list) or not prompts or not all(_is_prompt(p) for p in prompts):
        raise bad_value("prompt", "expected a string, token ids (mixed with strings), or a list of those")
    llm, n_ctx = state.llm, state.llm.n_ctx

    def build() -> list[list[int]]:
        out = []
        for p in prompts:
            p = _json_prompt(p) if isinstance(p, dict) else p
            if isinstance(p, str):
                out.append(llm.encode_prompt(p))
                continue
            ids: list[int] = []
            for i, piece in enumerate(p):  # text pieces as they are, BOS only before a leading one
                if isinstance(piece, str):
                    ids += llm.tokenizer.encode(piece, add_special=i == 0, max_tokens=n_ctx - 1)
                else:
                    ids.append(piece)
            out.append(ids)
        return out

    try:
        return await state.off_loop(build)
    except TextTooLongError as e:
        raise request_error(PromptTooLongError(e.num_tokens, n_ctx, at_least=True), n_ctx, False) from None
    except PromptTooLongError as e:
        raise request_error(e, n_ctx, False) from None


def _settings_bias(params: Any, eog_ids: Iterable[int]) -> list[dict[str, Any]]:
    """llama-server's `logit_bias` setting: [{token, bias}], a banned token's bias null (-inf), and
    ignore_eos shown as it is there, as the end-of-generation tokens banned."""
    bias = dict(params.logit_bias or {})
    if params.ignore_eos:
        bias.update({t: -math.inf for t in eog_ids if t not in bias})
    return [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in sorted(bias.items())]


def generation_settings(req: GenerationRequest, n_ctx: int, eog_ids: Iterable[int] = ()) -> dict[str, Any]:
    """llama-server's `generation_settings`: the sampling the request runs with, defaults filled in."""
    p = req.params
    return {
        "logit_bias": _settings_bias(p, eog_ids),
        "n_ctx": n_ctx, "n_predict": p.max_tokens, "seed": p.seed if p.seed is not None else -1,
        "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
        "repeat_penalty": p.repetition_penalty, "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty, "stop": list(p.stop), "ignore_eos": p.ignore_eos,
        "min_tokens": p.min_tokens, "stream": req.stream, "n_probs": p.logprobs or 0,
    }  # fmt: skip


def _response_fields(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(f, str) and f for f in value):
        raise bad_value("response_fields", "expected a list of field names")
    return value or None  # empty: every field


def _pick(out: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """response_fields as llama-server reads them: only those fields, "a/b" taken from inside "a" and kept
    under its whole name; a field the reply lacks is left out."""
    picked: dict[str, Any] = {}
    for name in fields:
        node: Any = out
        for part in name.split("/"):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING:
            picked[name] = node
    return picked


_MISSING = object()


def parse_request(state: ServerState, body: dict[str, Any]) -> GenerationRequest:
    """The body (but its prompt) as a completion request (parse_completion's checks and defaults)."""
    _check_fields(body)
    n_predict = body.get("n_predict", -1)
    if not _is_int(n_predict) or (n_predict != -1 and n_predict < 1):
        raise bad_value("n_predict", "expected -1 (until the context's end) or a positive integer")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad_value("seed", "expected an integer (-1: random)")
    openai: dict[str, Any] = {k: body[k] for k in SAME_FIELDS if body.get(k) is not None}
    openai["prompt"] = "x"  # the real prompt's ids are built apart (_prompts)
    openai["max_tokens"] = state.llm.n_ctx if n_predict == -1 else n_predict
    openai["logit_bias"] = _logit_bias(body.get("logit_bias"), state.llm.tokenizer)
    if seed not in (None, -1):
        openai["seed"] = seed
    req = parse_completion(openai, state.config.sampling_defaults)
    if body.get("ignore_eos") is True:
        if req.constraint is not None:
            raise bad_value("ignore_eos", "cannot be combined with a grammar: a grammar ends with EOS")
        req.params.ignore_eos = True
    elif body.get("ignore_eos") not in (None, False):
        raise bad_value("ignore_eos", "expected a boolean")
    return req


def native_routes(front: Frontend) -> list[Route]:
    state = front.state

    @front.endpoint()
    async def completion(request: Request) -> Response:
        body = await front.read_json(request)
        req = await state.off_loop(parse_request, state, body)  # logit_bias texts are tokenized
        await constrain(req, (state.llm.tokenizer, state.llm.config.n_vocab))
        prompts = await _prompts(state, body.get("prompt"))
        return_tokens = body.get("return_tokens") is True
        if len(prompts) > 1 and req.stream:
            raise bad_value("prompt", "one prompt when streaming (send each as its own request)")

        settings = generation_settings(req, state.llm.n_ctx, state.llm.tokenizer.eog_ids)
        tok = state.llm.tokenizer
        fields = _response_fields(body.get("response_fields"))

        def whole(reply: Reply, ids: list[int], index: int) -> dict[str, Any]:
            tokens = reply.end.token_ids if return_tokens and reply.end is not None else []
            prompt_text = state.llm.detokenize(ids)
            out = final_object(state.model_name, reply.content, reply.end, tokens=tokens, prompt=prompt_text,
                               generation_settings=settings, index=index,
                               **probs(reply.logprobs))  # fmt: skip
            return out if fields is None else _pick(out, fields)

        def probs(lps: list[TokenLogprob]) -> dict[str, Any]:
            return {"completion_probabilities": llama_probs(tok, lps)} if req.params.logprobs else {}

        async def stream(events: AsyncIterator[Event]) -> AsyncIterator[str]:
            pending: list[TokenLogprob] = []  # tokens whose text is still held back (a stop string's start)
            async for e in events:
                if isinstance(e, Probs):
                    pending += e.tokens
                elif isinstance(e, Text) and e.text:
                    chunk = {"index": 0, "content": e.text, "tokens": [], "stop": False, "id_slot": -1}
                    yield sse({**chunk, **probs(pending)})
                    pending = []
                elif isinstance(e, End):
                    tokens = e.token_ids if return_tokens else []
                    last = final_object(state.model_name, "", e, tokens=tokens, generation_settings=settings,
                                        **(probs(pending) if pending else {}))  # fmt: skip
                    yield sse(last)

        replies = []
        for i, ids in enumerate(prompts):  # several prompts: one after another, an array of replies
            response = await respond(
                front, request, req, ids, lambda r, ids=ids, i=i: JSONResponse(whole(r, ids, i)),
                stream, lambda e: sse(e.body()), "text/event-stream", chat=False,
            )  # fmt: skip
            if req.stream or len(prompts) == 1:
                return response
            replies.append(json.loads(bytes(response.body)))
        return JSONResponse(replies)

    @front.endpoint()
    async def props(request: Request) -> Response:
        template = state.template
        settings = {"n_ctx": state.llm.n_ctx, "params": state.config.sampling_defaults}
        return JSONResponse({
            "default_generation_settings": settings,
            "total_slots": state.config.engine.max_num_seqs,
            "model_alias": state.model_name,
            "model_path": str(state.llm.path),
            "chat_template": template.source if template is not None else "",
            "modalities": {"vision": False, "audio": False},
            "build_info": "edgellm",
        })  # fmt: skip

    @front.endpoint()
    async def set_props(request: Request) -> Response:
        msg = "the server's properties are read-only here (its flags set them)"
        raise ApiError(501, msg, "not_supported_error")

    @front.endpoint()
    async def slots(request: Request) -> Response:
        """A view of the request slots: as many as requests run at once, the first busy ones processing
        (no prompts or outputs: those are the clients')."""
        busy = state.llm.stats().num_running
        n = state.config.engine.max_num_seqs
        n_ctx = state.llm.n_ctx
        return JSONResponse([{"id": i, "n_ctx": n_ctx, "is_processing": i < busy} for i in range(n)])

    async def chat_prompt(request: Request) -> ChatPrompt:
        """The prompt a chat request with this body would get: its tools and thinking switches included,
        as llama-server takes the whole chat body on /apply-template and /chat/completions/input_tokens."""
        body = await front.read_json(request)
        opener = body.pop("add_generation_prompt", None)  # taken here, unlike on chat (always opened)
        if opener is not None and not isinstance(opener, bool):
            raise bad_value("add_generation_prompt", "expected a boolean")
        check_fields(body, CHAT_FIELDS)
        req = parse_chat(body, state.llm.n_ctx)
        assert req.messages is not None
        template_kwargs, _ = thinking_options(state, req)
        tools = req.tools and req.tools.tools
        return await render_chat_prompt(
            state, req.messages, opener is not False, tools, template_kwargs, for_generation=False
        )

    @front.endpoint()
    async def apply_template(request: Request) -> Response:
        return JSONResponse({"prompt": (await chat_prompt(request)).text})

    @front.endpoint()
    async def chat_input_tokens(request: Request) -> Response:
        return JSONResponse({"input_tokens": len((await chat_prompt(request)).token_ids)})

    return [
        Route("/completion", completion, methods=["POST"]),
        Route("/props", props, methods=["GET"]),
        Route("/props", set_props, methods=["POST"]),
        Route("/slots", slots, methods=["GET"]),
        Route("/apply-template", apply_template, methods=["POST"]),
        Route("/v1/chat/completions/input_tokens", chat_input_tokens, methods=["POST"]),
    ]

