"""Code infill: `suffix` on /v1/completions (OpenAI's legacy field) and llama.cpp's /infill route, both
building the model's fill-in-the-middle prompt (tokenizer/fim.py) and generating through the one
completion path. A model whose GGUF names no FIM tokens gets a 400 saying so on both.

/infill's body is llama.cpp's: `input_prefix`, `input_suffix`, `input_extra` ([{filename, text}]), `prompt`
(text after the prefix), `n_predict` (or max_tokens; -1 or absent: until the context is full), and the
completion sampling fields, validated as /v1/completions validates them. Its reply is llama.cpp's: one JSON
object with `content`, `stop`, `stop_type`, `stopping_word`, `tokens_predicted`, `tokens_evaluated`,
`tokens_cached`; streamed, `data: {"content": ..., "stop": false}` events and that object last (stop true).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgellm.engine.checks import PromptTooLongError
from edgellm.server.events import End, Event, Frontend, Reply, Text, respond
from edgellm.server.generate import encode_prompts
from edgellm.server.http.errors import ApiError, request_error
from edgellm.server.llama_native import final_object
from edgellm.server.openai_format import sse
from edgellm.server.protocol import GenerationRequest, parse_completion
from edgellm.tokenizer.fim import DEFAULT_CHUNK_FILE_NAME, FimTokens, NoFimError, fim_prompt_ids, fim_tokens

if TYPE_CHECKING:
    from edgellm.server.state import ServerState

# /infill's own fields; every other field goes to parse_completion as it is.
_INFILL_FIELDS = ("input_prefix", "input_suffix", "input_extra", "prompt", "n_predict")


def model_fim(state: ServerState, param: str) -> FimTokens:
    try:
        return fim_tokens(state.llm.metadata, state.llm.tokenizer.vocab_size)
    except NoFimError as e:
        raise ApiError(400, f"'{param}': {e}", param=param, code="infill_unsupported") from None


async def completion_prompts(state: ServerState, req: GenerationRequest) -> list[list[int]]:
    """A /v1/completions request's prompts as token ids: each text prompt with BOS as the model adds it, or,
    with a `suffix`, the FIM prompt of that prompt (the text before the gap) and the suffix."""
    assert req.prompts is not None
    if req.suffix is None:
        return await encode_prompts(state, req.prompts)
    fim = model_fim(state, "suffix")
    return [await fim_ids(state, fim, p, req.suffix) for p in req.prompts if isinstance(p, str)]


async def fim_ids(
    state: ServerState,
    fim: FimTokens,
    prefix: str,
    suffix: str,
    prompt: str = "",
    extra: Sequence[tuple[str, str]] = (),
) -> list[int]:
    """fim_prompt_ids off the event loop; texts that together cannot fit the context are refused by their
    size before they are tokenized (nothing is cut, as the reply's `truncated: false` says)."""
    tok, n_ctx = state.llm.tokenizer, state.llm.n_ctx

    def build() -> list[int]:
        least = sum(tok.min_tokens(t) for t in (prefix, suffix, prompt, *(text for _, text in extra)))
        if least >= n_ctx:
            raise PromptTooLongError(least, n_ctx, at_least=True)
        return fim_prompt_ids(tok, fim, prefix, suffix, prompt, extra)

    try:
        return await state.off_loop(build)
    except PromptTooLongError as e:
        raise request_error(e, n_ctx, chat=False) from None


def _text_field(body: dict, key: str) -> str:
    value = body.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ApiError(400, f"'{key}': expected a string, got {type(value).__name__}", param=key)
    return value


def _extra_chunks(body: dict) -> list[tuple[str, str]]:
    chunks = body.get("input_extra")
    if chunks is None:
        return []
    if not isinstance(chunks, list):
        raise ApiError(400, "'input_extra': expected a list of {filename, text} objects", param="input_extra")
    out = []
    for i, chunk in enumerate(chunks):
        where = f"input_extra[{i}]"
        if not isinstance(chunk, dict):
            raise ApiError(400, f"'{where}': expected an object {{filename, text}}", param=where)
        if not isinstance(chunk.get("text"), str):
            raise ApiError(400, f"'{where}.text': expected a string", param=f"{where}.text")
        filename = chunk.get("filename", DEFAULT_CHUNK_FILE_NAME)
        if not isinstance(filename, str):
            raise ApiError(400, f"'{where}.filename': expected a string", param=f"{where}.filename")
        out.append((filename, chunk["text"]))
    return out


async def parse_infill(state: ServerState, body: dict) -> GenerationRequest:
    """An /infill body as a one-prompt completion request whose prompt is the FIM prompt's token ids."""
    prefix, suffix, prompt = (_text_field(body, k) for k in ("input_prefix", "input_suffix", "prompt"))
    extra = _extra_chunks(body)
    n_predict = body.get("n_predict")
    if n_predict is not None and body.get("max_tokens") is not None:
        raise ApiError(400, "'n_predict': give n_predict or max_tokens, not both", param="n_predict")
    if n_predict is not None and (not isinstance(n_predict, int) or isinstance(n_predict, bool)):
        raise ApiError(
            400, f"'n_predict': expected an integer, got {type(n_predict).__name__}", param="n_predict"
        )
    if n_predict is not None and n_predict != -1 and n_predict < 1:
        raise ApiError(400, f"'n_predict': {n_predict} is neither -1 (no limit) nor >= 1", param="n_predict")
    if body.get("n") not in (None, 1):
        raise ApiError(400, "'n': /infill returns one completion", param="n")
    fim = model_fim(state, "input_prefix")
    ids = await fim_ids(state, fim, prefix, suffix, prompt, extra)
    completion_body: dict[str, Any] = {k: v for k, v in body.items() if k not in _INFILL_FIELDS}
    completion_body["prompt"] = ids
    if body.get("max_tokens") is None:  # llama.cpp's default: until an end token or the context's end
        completion_body["max_tokens"] = state.llm.n_ctx if n_predict in (None, -1) else n_predict
    return parse_completion(completion_body, state.config.sampling_defaults)


def infill_routes(front: Frontend) -> list[Route]:
    state = front.state

    def whole(reply: Reply) -> Response:
        return JSONResponse(final_object(state.model_name, reply.content, reply.end))

    async def stream(events: AsyncIterator[Event]) -> AsyncIterator[str]:
        async for e in events:
            if isinstance(e, Text) and e.text:
                yield sse({"index": 0, "content": e.text, "stop": False})
            elif isinstance(e, End):
                yield sse(final_object(state.model_name, "", e))

    @front.endpoint()
    async def infill(request: Request) -> Response:
        req = await parse_infill(state, await front.read_json(request))
        ids = await front.prompt_ids(req)
        return await respond(
            front, request, req, ids, whole, stream, lambda e: sse(e.body()), "text/event-stream", chat=False
        )

    return [Route("/infill", infill, methods=["POST"])]
