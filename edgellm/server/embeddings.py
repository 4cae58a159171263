"""/v1/embeddings: OpenAI's request body -> token ids -> the engine's embedding requests -> OpenAI's
response (vectors as JSON floats, or base64 of little-endian float32 as the openai client asks by default).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgellm.engine.checks import PromptTooLongError
from edgellm.engine.core_client import EngineDeadError
from edgellm.llm_inputs import check_embedding_model
from edgellm.server.generate import _until_disconnect
from edgellm.server.http.errors import ApiError, bad_value

if TYPE_CHECKING:
    from edgellm.server.state import ServerState

MAX_INPUTS = 2048  # OpenAI's limit of inputs per request
ENCODINGS = ("float", "base64")


@dataclass
class EmbeddingRequest:
    model: str | None
    inputs: list[str | list[int]]
    encoding_format: str
    dimensions: int | None


def _is_ids(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def parse_embedding(body: dict[str, Any]) -> EmbeddingRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_value("model", f"expected a string, got {type(model).__name__}")
    x = body.get("input")
    if isinstance(x, str):
        inputs: list = [x]
    elif _is_ids(x) and x:
        inputs = [x]  # one input given as token ids
    elif isinstance(x, list) and x and all(isinstance(s, str) for s in x):
        inputs = list(x)
    elif isinstance(x, list) and x and all(_is_ids(s) for s in x):
        inputs = list(x)
    else:
        raise bad_value("input", "expected a string, a list of strings, token ids or lists of token ids")
    if len(inputs) > MAX_INPUTS:
        raise bad_value("input", f"{len(inputs)} inputs; at most {MAX_INPUTS} per request")
    for i, s in enumerate(inputs):
        if not s:
            raise bad_value("input", f"input {i} is empty")
    fmt = body.get("encoding_format")
    fmt = "float" if fmt is None else fmt
    if fmt not in ENCODINGS:
        raise bad_value("encoding_format", f"expected one of {', '.join(ENCODINGS)}, got {fmt!r}")
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool)):
        raise bad_value("dimensions", f"expected an integer, got {type(dims).__name__}")
    return EmbeddingRequest(model, inputs, fmt, dims)


def _encode(v: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    return v.tolist()


async def embed(
    state: ServerState, request: Request, inputs: list[str | list[int]], param: str = "input"
) -> tuple[list[np.ndarray], int]:
    """Every API's way to the engine's embeddings: the inputs (none truncated) -> their vectors and the
    number of tokens they were."""
    llm = state.llm
    try:
        check_embedding_model(llm.config)  # a reranker, or pooling none: no vector per input
    except ValueError as e:
        raise ApiError(400, str(e), param="model", code="model_not_embedding") from None

    def checked_ids() -> list[list[int]]:  # on a work thread: tokenizing is proportional to the input
        ids = []
        for i, x in enumerate(inputs):
            try:
                ids.append(llm.embedding_ids(x))
            except PromptTooLongError as e:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {llm.n_ctx} tokens. However, input {i} "
                    f"resulted in {e.count} tokens (inputs are not truncated).",
                    param=param,
                    code="context_length_exceeded",
                ) from None
            except ValueError as e:
                raise ApiError(400, f"input {i}: {e}", param=param) from None
        return ids

    ids = await state.off_loop(checked_ids)
    return await pooled(state, request, ids), sum(len(x) for x in ids)


async def pooled(state: ServerState, request: Request, ids: list[list[int]]) -> list[np.ndarray]:
    """The engine's pooled output of checked token-id inputs (embeddings, or a reranker's scores), as one
    admitted request that a client's disconnect aborts."""
    release = state.admit(1)
    try:
        return await _until_disconnect(request, state.llm.aembed(ids))
    except EngineDeadError as e:
        raise ApiError(503, str(e), type="server_error", code="engine_dead") from e
    finally:
        release()


async def embeddings(state: ServerState, request: Request, body: dict[str, Any]) -> Response:
    req = parse_embedding(body)
    state.names.check(req.model)
    n_embd = state.llm.config.n_embd
    if req.dimensions is not None and req.dimensions != n_embd:
        raise bad_value(
            "dimensions",
            f"{req.dimensions} is not supported: this model's embeddings have {n_embd} dimensions (no "
            "shortening); leave it out or send that",
        )
    vectors, n_tokens = await embed(state, request, req.inputs)
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(v, req.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    return JSONResponse({"object": "list", "data": data, "model": state.model_name, "usage": usage})
