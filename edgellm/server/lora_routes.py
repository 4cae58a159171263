"""llama-server's LoRA routes: GET /lora-adapters lists the loaded adapters ([{id, path, scale}], the global
scales); POST /lora-adapters sets the global scales ([{id, scale}]; an adapter it leaves out is at 0) for
requests that arrive from then on (a request already running keeps the adapters it was admitted with). A
request's own `"lora": [{"id", "scale"}]` field (protocol.py) overrides them for that request."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgellm.lora.choice import request_lora, resolve_lora
from edgellm.server.http.endpoint import read_body
from edgellm.server.http.errors import ApiError, bad_value

if TYPE_CHECKING:
    from edgellm.server.events import Frontend


def lora_routes(front: Frontend) -> list[Route]:
    state = front.state

    @front.endpoint()
    async def get_adapters(request: Request) -> Response:
        return JSONResponse(state.llm.lora_adapters())

    @front.endpoint()
    async def set_adapters(request: Request) -> Response:
        raw = await read_body(request, state.config.max_body_bytes)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise ApiError(400, f"malformed JSON body: {e}", code="invalid_json") from None
        if not isinstance(body, list):
            raise ApiError(400, "Request body must be an array", code="invalid_json")
        try:
            scales = request_lora(body) or {}
            resolve_lora(scales, [0.0] * state.llm.n_lora)  # an unknown id: 400 before anything changes
        except ValueError as e:
            raise bad_value("lora", str(e)) from None
        state.llm.set_lora_scales(scales)
        return JSONResponse({"success": True})

    return [
        Route("/lora-adapters", get_adapters, methods=["GET"]),
        Route("/lora-adapters", set_adapters, methods=["POST"]),
    ]
