"""The chat TUI's RemoteBackend (`edgellm chat --url`) against a small OpenAI-style server run in a thread:
streaming through the official openai client, the context size from /v1/models, the count from /tokenize,
and an unreachable server shown as a sentence in the app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tui.pilot import SIZE, ready, send, status_text
from tui.app import ChatApp
from tui.storage import ConversationStore
from tui.widgets import LoadingPanel


@pytest.fixture
def openai_style_server():
    import socket
    import threading

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    seen: list[dict] = []

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": "tiny", "object": "model", "created": 0, "owned_by": "test", "max_model_len": 2048}]})

    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        seen.append(body)

        async def events():
            for i, piece in enumerate(["Hel", "lo", " there"]):
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "tiny",
                         "choices": [{"index": 0, "delta": {"content": piece},
                                      "finish_reason": "stop" if i == 2 else None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            usage = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "tiny",
                     "choices": [],
                     "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}
            yield f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def tokenize(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"count": 5 * len(body["messages"]), "max_model_len": 2048})

    app = Starlette(routes=[
        Route("/v1/models", models),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
    ])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.01)
    yield f"http://127.0.0.1:{port}/v1", seen
    server.should_exit = True
    thread.join(5)


@pytest.mark.asyncio
async def test_remote_backend_streams_from_a_server(tmp_path: Path, openai_style_server) -> None:
    from tui.remote_backend import RemoteBackend

    url, seen = openai_style_server
    app = ChatApp(lambda m: RemoteBackend(url, m or None), "", store=ConversationStore(tmp_path),
                  model_options=[])
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.state == "ready" and app.model == "tiny" and app.info.n_ctx == 2048
        await send(pilot, "hi")
        assert app.conversation.messages[-1].content == "Hello there"
        assert seen[-1]["model"] == "tiny" and seen[-1]["stream"] is True
        assert seen[-1]["messages"] == [{"role": "user", "content": "hi"}]
        assert "ctx 10/2048" in status_text(app)  # the server's /tokenize count of the 2 messages


@pytest.mark.asyncio
async def test_remote_backend_unreachable_server_is_a_readable_error(tmp_path: Path) -> None:
    import socket

    from tui.remote_backend import RemoteBackend

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    app = ChatApp(lambda m: RemoteBackend(url), "", store=ConversationStore(tmp_path), model_options=[])
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.state == "error"
        assert f"Server unreachable at {url}" in " ".join(app.query_one(LoadingPanel).lines)
