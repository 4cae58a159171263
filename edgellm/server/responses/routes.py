"""OpenAI's Responses API on the shared front-end: /v1/responses, whole or streamed with its events
(response.created ... response.output_text.delta ... response.completed), as the openai SDK parses them.

The request becomes the OpenAI chat body the chat route parses (server/responses/input.py), so it is
validated, constrained and generated the same way (server/events.py). `previous_response_id` names one of the
last responses kept in memory (responses_input.ResponseStore, bounded); errors are OpenAI's error body.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgellm.server.events import (
    Call,
    CallArgs,
    CallStart,
    End,
    Event,
    Frontend,
    Reasoning,
    Reply,
    Text,
    renamed,
    respond,
)
from edgellm.server.http.errors import ApiError
from edgellm.server.openai_format import sse
from edgellm.server.protocol import GenerationRequest, parse_chat
from edgellm.server.responses.input import OPENAI_NAMES, ResponseStore, openai_body


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _reasoning_item(item_id: str, text: str, status: str, summarised: bool = False) -> dict[str, Any]:
    """`summarised` (reasoning.summary asked): the summary is the reasoning itself, never shortened."""
    done = status == "completed"
    content = [{"type": "reasoning_text", "text": text}] if done else []
    summary = [{"type": "summary_text", "text": text}] if done and summarised else []
    return {"type": "reasoning", "id": item_id, "summary": summary, "content": content, "status": status}


def reasoning_items(reasoning: str | None, summarised: bool = False) -> list[dict[str, Any]]:
    """The reply's reasoning as a Responses reasoning output item (its text as `reasoning_text`)."""
    return [_reasoning_item(_id("rs"), reasoning, "completed", summarised)] if reasoning else []


def input_items(value: Any) -> list[dict[str, Any]]:
    """The request's `input` as the items /v1/responses/{id}/input_items lists, each with an id."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    items = []
    for item in value:
        kind = item.get("type", "message")
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}.get(kind, "item")
        item = {"id": _id(prefix), "type": kind, **item}
        if kind == "message" and isinstance(item.get("content"), str):  # as OpenAI lists it: parts
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        items.append(item)
    return items


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [part] if status == "completed" else []}  # fmt: skip


def _call_item(item_id: str, call: Call, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}  # fmt: skip


class _Response:
    """One response's object, as it grows; `conversation` is stored with the reply once it is done."""

    def __init__(self, state: Any, body: dict, req: GenerationRequest, n_prompt: int, store: ResponseStore,
                 conversation: list[dict[str, Any]]) -> None:  # fmt: skip
        self.id, self.created = _id("resp"), int(time.time())
        self.model, self.body, self.req, self.n_prompt = state.model_name, body, req, n_prompt
        self.store, self.conversation = store, conversation
        self.seq = 0
        summary = (body.get("reasoning") or {}).get("summary") or (body.get("reasoning") or {}).get(
            "generate_summary"
        )
        self.summary = summary  # reasoning.summary as asked: the reasoning comes back as its summary

    def obj(self, status: str, output: list[dict[str, Any]], end: End | None) -> dict[str, Any]:
        b = self.body
        usage = None
        if end is not None:
            usage = {"input_tokens": end.prompt_tokens, "output_tokens": end.completion_tokens,
                     "total_tokens": end.prompt_tokens + end.completion_tokens,
                     "input_tokens_details": {"cached_tokens": end.cached_tokens},
                     "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
            "incomplete_details": incomplete, "instructions": b.get("instructions"),
            "max_output_tokens": b.get("max_output_tokens"), "model": self.model, "output": output,
            "parallel_tool_calls": b.get("parallel_tool_calls", True),
            "previous_response_id": b.get("previous_response_id"),
            "reasoning": {"effort": (b.get("reasoning") or {}).get("effort"), "summary": self.summary},
            "store": b.get("store", True), "temperature": b.get("temperature", 1.0),
            "text": b.get("text") or {"format": {"type": "text"}},
            "tool_choice": b.get("tool_choice", "auto"),
            "tools": b.get("tools") or [], "top_p": b.get("top_p", 1.0),
            "truncation": b.get("truncation") or "disabled",
            "usage": usage, "metadata": b.get("metadata") or {}, "user": b.get("user"),
        }  # fmt: skip

    def finished(self, reply: Reply, output: list[dict[str, Any]]) -> dict[str, Any]:
        """The whole reply's response object; it is stored with its conversation and input items (unless
        `store` is false)."""
        assert reply.end is not None
        status = "incomplete" if reply.end.reason == "length" else "completed"
        obj = self.obj(status, output, reply.end)
        if self.body.get("store", True):
            calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                     for c in reply.calls]  # fmt: skip
            turn = {"role": "assistant", "content": reply.content, **({"tool_calls": calls} if calls else {})}
            if reply.reasoning:  # kept as a reasoning input item would be: the template decides
                turn["reasoning_content"] = reply.reasoning
            self.store.put(self.id, [*self.conversation, turn], obj, input_items(self.body["input"]))
        return obj

    def whole(self, reply: Reply) -> Response:
        output = reasoning_items(reply.reasoning, self.summary is not None)
        if reply.content or not (reply.calls or reply.reasoning):  # as streamed: no empty block
            output.append(_message_item(_id("msg"), reply.content, "completed"))
        output += [_call_item(_id("fc"), c, "completed") for c in reply.calls]
        return JSONResponse(self.finished(reply, output))

    def event(self, kind: str, **data: Any) -> str:
        self.seq += 1
        return f"event: {kind}\n" + sse({"type": kind, "sequence_number": self.seq - 1, **data})

    async def stream(self, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        yield self.event("response.created", response=self.obj("in_progress", [], None))
        yield self.event("response.in_progress", response=self.obj("in_progress", [], None))
        reply, out_index, item_id = Reply(), -1, ""
        open_kind: str | None = None  # "reasoning", "message", "function_call": the item being streamed
        done: list[dict[str, Any]] = []  # the output items streamed whole

        def close() -> list[str]:
            """The events that end the output item being streamed, which joins `done`."""
            if open_kind == "reasoning":
                item = _reasoning_item(item_id, reply.reasoning or "", "completed", self.summary is not None)
                at = {"item_id": item_id, "output_index": out_index, "content_index": 0}
                lines = [self.event("response.reasoning_text.done", **at, text=reply.reasoning or "")]
            elif open_kind == "message":
                item = _message_item(item_id, reply.content, "completed")
                at = {"item_id": item_id, "output_index": out_index, "content_index": 0}
                lines = [self.event("response.output_text.done", **at, text=reply.content, logprobs=[]),
                         self.event("response.content_part.done", **at, part=item["content"][0])]  # fmt: skip
            elif open_kind == "function_call":
                call = reply.calls[-1]
                item = _call_item(item_id, call, "completed")
                at = {"item_id": item_id, "output_index": out_index}
                args = {"name": call.name, "arguments": call.arguments}
                lines = [self.event("response.function_call_arguments.done", **at, **args)]
            else:
                return []
            done.append(item)
            return [*lines, self.event("response.output_item.done", output_index=out_index, item=item)]

        def open_item(kind: str, prefix: str, make: Callable[[str], dict[str, Any]]) -> list[str]:
            """The events that end the item being streamed and start the next, `make(its id)`."""
            nonlocal open_kind, out_index, item_id
            lines = close()
            open_kind, out_index, item_id = kind, out_index + 1, _id(prefix)
            return [
                *lines,
                self.event("response.output_item.added", output_index=out_index, item=make(item_id)),
            ]

        async for e in events:
            if isinstance(e, Reasoning):
                if open_kind != "reasoning":
                    for line in open_item("reasoning", "rs", lambda i: _reasoning_item(i, "", "in_progress")):
                        yield line
                reply.reasoning = (reply.reasoning or "") + e.text
                yield self.event("response.reasoning_text.delta", item_id=item_id, output_index=out_index,
                                 content_index=0, delta=e.text)  # fmt: skip
            elif isinstance(e, Text):
                if open_kind != "message":
                    for line in open_item("message", "msg", lambda i: _message_item(i, "", "in_progress")):
                        yield line
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    yield self.event("response.content_part.added", item_id=item_id, output_index=out_index,
                                     content_index=0, part=part)  # fmt: skip
                reply.content += e.text
                yield self.event("response.output_text.delta", item_id=item_id, output_index=out_index,
                                 content_index=0, delta=e.text, logprobs=[])  # fmt: skip
            elif isinstance(e, CallStart):
                call = Call(e.id, e.name)  # joins reply.calls once the item before it is closed
                started = lambda i, c=call: _call_item(i, c, "in_progress")  # noqa: E731
                for line in open_item("function_call", "fc", started):
                    yield line
                reply.calls.append(call)
            elif isinstance(e, CallArgs):
                reply.calls[-1].arguments += e.arguments
                yield self.event("response.function_call_arguments.delta", item_id=item_id,
                                 output_index=out_index, delta=e.arguments)  # fmt: skip
            elif isinstance(e, End):
                for line in close():
                    yield line
                reply.end = e
                obj = self.finished(reply, done)
                kind = "response.completed" if obj["status"] == "completed" else "response.incomplete"
                yield self.event(kind, response=obj)

    def error_line(self, e: ApiError) -> str:
        return self.event("error", code=e.code, message=e.message, param=e.param)


def responses_routes(front: Frontend) -> list[Route]:
    state = front.state
    store = ResponseStore()
    endpoint = front.endpoint()

    @endpoint
    async def create_response(request: Request) -> Response:
        body = await front.read_json(request)
        with renamed(OPENAI_NAMES):
            chat_body, conversation = openai_body(body, store)
            n_ctx = state.llm.n_ctx
            while True:
                # truncation "auto", as OpenAI does it: the oldest input items go until the prompt fits
                msgs = chat_body["messages"]
                first = 1 if msgs[0]["role"] == "system" else 0
                may_cut = body.get("truncation") == "auto" and len(msgs) - first > 1
                req = parse_chat(chat_body, n_ctx, state.config.sampling_defaults)
                try:
                    ids = await front.prompt_ids(req)
                except ApiError as e:  # refused by its size before tokenizing
                    if not (may_cut and e.code == "context_length_exceeded"):
                        raise
                    ids = None
                if ids is not None and (len(ids) < n_ctx or not may_cut):
                    break
                del msgs[first]
                conversation = conversation[1:]
        resp = _Response(state, body, req, len(ids), store, conversation)
        return await respond(
            front, request, req, ids, resp.whole, resp.stream, resp.error_line, "text/event-stream"
        )

    @endpoint
    async def get_response(request: Request) -> Response:
        return JSONResponse(store.find(request.path_params["response_id"]).response)

    @endpoint
    async def delete_response(request: Request) -> Response:
        rid = request.path_params["response_id"]
        store.delete(rid)
        return JSONResponse({"id": rid, "object": "response", "deleted": True})

    @endpoint
    async def list_input_items(request: Request) -> Response:
        """OpenAI's list: `order` desc (the default: newest first) or asc, `limit` 1-100 (20), `after` an
        item id."""
        items = list(store.find(request.path_params["response_id"]).input_items)
        q = request.query_params
        order, after, limit = q.get("order", "desc"), q.get("after"), q.get("limit", "20")
        if order not in ("asc", "desc"):
            raise ApiError(400, "'order': expected 'asc' or 'desc'", param="order")
        if not limit.isdigit() or not 1 <= int(limit) <= 100:
            raise ApiError(400, "'limit': expected an integer in [1, 100]", param="limit")
        if order == "desc":
            items.reverse()
        if after is not None:
            at = next((i for i, item in enumerate(items) if item["id"] == after), None)
            if at is None:
                raise ApiError(400, f"'after': no input item {after!r} in this response", param="after")
            items = items[at + 1 :]
        page = items[: int(limit)]
        first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
        more = len(items) > len(page)
        return JSONResponse({"object": "list", "data": page, "first_id": first, "last_id": last,
                             "has_more": more})  # fmt: skip

    return [
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
    ]
