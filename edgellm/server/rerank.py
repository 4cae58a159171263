"""/v1/rerank, /rerank, /v1/reranking, /reranking: llama-server's rerank API (Jina / Cohere shape; TEI's when
the body has "texts") on a reranker model (pooling_type rank: LLM.rerank).

    {model, query, documents: [str], top_n?, return_documents?}
 -> {model, object: "list", usage: {prompt_tokens, total_tokens},
     results: [{index, relevance_score, document?: {text}}]}     best first, at most top_n
TEI: {query, texts, return_text?} -> [{index, score, text?}]

Each document is one engine input, the prompt built as llama-server's format_prompt_rerank builds it
(LLM.rerank_ids); its score is the classification head's first output, unnormalised, as llama-server's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgellm.engine.checks import PromptTooLongError
from edgellm.llm_inputs import check_reranker
from edgellm.server.embeddings import pooled
from edgellm.server.http.errors import ApiError, bad_value

if TYPE_CHECKING:
    from edgellm.server.state import ServerState

MAX_DOCUMENTS = 2048
# llama-server's paths; app.py's with_unprefixed adds /rerank and /reranking
PATHS = ("/v1/rerank", "/v1/reranking")


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise bad_value(name, f"expected true or false, got {type(value).__name__}")
    return value


def parse_rerank(body: Any) -> tuple[str, list[str], int, bool, bool]:
    """(query, documents, top_n, return the documents, TEI's format) of a request body; 400s as
    llama-server words them."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    query = body.get("query")
    if query is None:
        raise ApiError(400, '"query" must be provided', param="query")
    if not isinstance(query, str):
        raise bad_value("query", "must be a string")
    tei = "texts" in body
    field = "texts" if tei else "documents"
    docs = body.get(field)
    if isinstance(docs, list):  # Cohere's and Jina's documents may be {"text": ...} objects
        docs = [d.get("text") if isinstance(d, dict) else d for d in docs]
    if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
        raise bad_value(field, "must be a non-empty string array")
    if len(docs) > MAX_DOCUMENTS:
        raise bad_value(field, f"{len(docs)} documents; at most {MAX_DOCUMENTS} per request")
    top_n = body.get("top_n", len(docs))
    if top_n is None:
        top_n = len(docs)
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
        raise bad_value("top_n", "expected a non-negative integer")
    returned = _flag(body, "return_text" if tei else "return_documents")
    return query, docs, top_n, returned, tei


async def rerank(state: ServerState, request: Request, body: Any) -> Response:
    query, docs, top_n, returned, tei = parse_rerank(body)
    model = body.get("model")
    state.names.check(model if isinstance(model, str) else None)
    llm = state.llm
    try:
        check_reranker(llm.config)
    except ValueError as e:
        raise ApiError(400, str(e), param="model", code="model_not_reranker") from None

    def checked_ids() -> list[list[int]]:  # on a work thread: tokenizing is proportional to the input
        out = []
        for i, d in enumerate(docs):
            try:
                out.append(llm.rerank_ids(query, d))
            except PromptTooLongError as e:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {llm.n_ctx} tokens. However, the query with "
                    f"document {i} resulted in {e.count} tokens (inputs are not truncated).",
                    param="documents",
                    code="context_length_exceeded",
                ) from None
            except ValueError as e:
                raise ApiError(400, f"document {i}: {e}", param="documents") from None
        return out

    ids = await state.off_loop(checked_ids)
    vectors = await pooled(state, request, ids)
    label = "score" if tei else "relevance_score"
    results: list[dict[str, Any]] = [{"index": i, label: float(v[0])} for i, v in enumerate(vectors)]
    results.sort(key=lambda r: r[label], reverse=True)  # stable: ties keep the documents' order
    results = results[:top_n]
    for r in results:
        if returned:
            if tei:
                r["text"] = docs[r["index"]]
            else:
                r["document"] = {"text": docs[r["index"]]}
    if tei:
        return JSONResponse(results)
    n_tokens = sum(len(x) for x in ids)
    return JSONResponse(
        {
            "model": model if isinstance(model, str) else state.model_name,
            "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "results": results,
        }
    )


def rerank_routes(state: ServerState, endpoint: Any, read_json: Any) -> list[Route]:
    """The rerank paths, each through the server's endpoint wrapper (key check, errors as JSON)."""

    @endpoint(state)
    async def handle(request: Request) -> Response:
        return await rerank(state, request, await read_json(request))

    return [Route(path, handle, methods=["POST"]) for path in PATHS]
