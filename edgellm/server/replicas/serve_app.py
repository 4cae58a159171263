"""`edgellm serve MODEL --replicas N`: the server as a Ray Serve application.

Each engine replica (EngineReplica) is today's server minus the socket: a ServerState with its own LLM
(engine core process) and the app that build_app makes. The ingress (Ingress) receives HTTP from Ray
Serve's proxy and forwards each request, scope and body, to one replica, which runs that app on it and
streams the ASGI messages back (asgi_relay.py); so routes, errors, auth, SSE and limits are the one
server's. The ingress only reads a generation request's prompt to route it: its KV-block hashes go to
the request router (server/replicas/request_router.py), which prefers the replica that last saw that prefix.
/health and /metrics are the ingress's own, from what every replica posts each second on a small board actor.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import ray
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.types import Receive, Scope, Send

from edgellm.config import ServerConfig
from edgellm.gguf.load import load_gguf
from edgellm.gguf.validation import tokenizer_from_gguf
from edgellm.models.catalog import resolve_model
from edgellm.server.app import build_app
from edgellm.server.http.auth import check_api_key, has_api_key
from edgellm.server.http.compat import ModelNames
from edgellm.server.http.endpoint import error_response
from edgellm.server.http.errors import ApiError
from edgellm.server.protocol import parse_chat, parse_completion
from edgellm.server.replicas.asgi_relay import Relay, app_messages, portable_scope, read_body
from edgellm.server.replicas.prefix_router import DECISIONS, prefix_block_hashes
from edgellm.server.replicas.replica_metrics import label_replicas
from edgellm.server.state import ServerState, load_template

log = logging.getLogger("edgellm.server.ray")
REPLICA_HEADER = b"x-edgellm-replica"
POST_EVERY_S = 1.0  # how often a replica posts its health and metrics to the board
STALE_AFTER_S = 10.0  # a replica silent this long is gone (dead, or its process stuck)
QUIET_LOGS = {"log_level": "WARNING", "enable_access_log": False}


@ray.remote(num_cpus=0)
class ReplicaBoard:
    """The latest health and metrics page of each engine replica, for the ingress's /health and /metrics."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}

    def post(self, replica: str, entry: dict[str, Any]) -> None:
        self.entries[replica] = {**entry, "posted": time.monotonic()}

    def snapshot(self, max_age_s: float = STALE_AFTER_S) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        self.entries = {r: e for r, e in self.entries.items() if now - e["posted"] <= max_age_s}
        return self.entries


async def _get(app: Any, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    """GET `path` from an ASGI app in-process: (status, body)."""
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "root_path": ""}
    scope |= {"query_string": b"", "headers": headers, "http_version": "1.1", "scheme": "http"}
    status, body = 500, b""
    async for msg in app_messages(app, scope, b"", []):
        if msg["type"] == "http.response.start":
            status = msg["status"]
        else:
            body += msg.get("body", b"")
    return status, body


class EngineReplica:
    """One engine: the whole single-process server's state and app, served over Ray instead of a socket."""

    async def __init__(self, config: ServerConfig, board: Any) -> None:
        self.id = serve.get_replica_context().replica_id.unique_id
        self.state = ServerState(config)
        self.state.request_exit = lambda: None  # a core that cannot restart fails check_health instead
        await asyncio.to_thread(self.state.load, log.info)
        self.app = build_app(self.state)
        self.header = [(REPLICA_HEADER, self.id.encode())]
        self.board = board
        key = config.api_key
        self.auth = [(b"authorization", f"Bearer {key}".encode())] if key else []
        self.poster = asyncio.get_running_loop().create_task(self._post_forever())

    async def http(self, scope: dict[str, Any], body: bytes, prefix_hashes: list[int] | None = None):
        """Stream the app's ASGI messages for one request (prefix_hashes is for the router only)."""
        async for msg in app_messages(self.app, scope, body, self.header):
            yield msg

    async def _post_forever(self) -> None:
        while True:
            try:
                status, health = await _get(self.app, "/health", self.auth)  # with its details
                _, page = await _get(self.app, "/metrics", self.auth)
                entry = {"status": status, "health": json.loads(health), "metrics": page.decode()}
                llm = self.state.llm
                entry |= {"pid": os.getpid(), "block_size": llm.block_size, "n_ctx": llm.n_ctx}
                await self.board.post.remote(self.id, entry)
            except Exception as e:  # noqa: BLE001 - the board is best effort; requests go on
                log.warning("could not post to the replica board: %r", e)
            await asyncio.sleep(POST_EVERY_S)

    def check_health(self) -> None:
        """Ray replaces a replica whose engine core died and could not be restarted."""
        if self.state.load_error is not None:
            raise RuntimeError(f"the engine is gone: {self.state.load_error!r}")

    def __del__(self) -> None:
        if getattr(self, "state", None) is not None and self.state.llm is not None:
            self.state.llm.shutdown()


def _replica_gone(e: BaseException) -> bool:
    return isinstance(e, RayActorError | ActorUnavailableError)


def _relay_error(e: BaseException) -> ApiError | None:
    if isinstance(e, BackPressureError):
        return ApiError(
            429,
            "every replica is at capacity and the queue is full; retry later",
            type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    return None


class IngressApp:
    """The ASGI app of the ingress: /health and /metrics here, everything else forwarded to a replica."""

    def __init__(self, config: ServerConfig, engine: Any, board: Any) -> None:
        self.config, self.board = config, board
        self.model_name = ModelNames(config.engine.model, config.served_model_names).primary
        self.engine = engine.options(method_name="http", stream=True)
        self.relay = Relay(_replica_gone, error_for=_relay_error)
        self.failed = 0  # responses the ingress ended because their replica failed
        self.geometry: dict[str, int] | None = None  # the replicas' block_size and n_ctx, once posted
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgellm-route")
        gguf = load_gguf(resolve_model(config.engine.model))  # header and tokenizer only: no weights are read
        self.prompts = SimpleNamespace(metadata=gguf.metadata, tokenizer=tokenizer_from_gguf(gguf))
        self.template, _ = load_template(config, self.prompts)  # type: ignore[arg-type]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":  # a websocket: the server has none
            await send({"type": "websocket.close", "code": 1003})
            return
        own = {"/health": self.health, "/metrics": self.metrics}.get(scope["path"])
        if own is not None and scope["method"] in ("GET", "HEAD"):
            try:
                response = await own(Request(scope))
            except ApiError as e:
                response = error_response(e)
            await response(scope, receive, send)
            return
        body = await read_body(receive, self.config.max_body_bytes)
        if body is None:
            return  # the client went away
        hashes = await self.route_hashes(scope, body)
        portable = portable_scope(scope)

        def open_stream() -> tuple[Any, Any]:
            gen = self.engine.remote(portable, body, prefix_hashes=hashes)
            return gen, gen.cancel

        if await self.relay(scope, receive, send, open_stream) is not None:
            self.failed += 1

    # ---- routing -------------------------------------------------------------------------------
    async def route_hashes(self, scope: Scope, body: bytes) -> list[int]:
        """The prompt's KV-block hashes, or [] when there is nothing to route on (not a generation
        request, not authorized, not readable: the replica gives the answer that deserves)."""
        path = scope["path"]
        if scope["method"] != "POST" or not path.endswith("completions"):
            return []
        if len(body) > self.config.max_body_bytes or not await self._authorized(scope):
            return []
        if self.geometry is None:
            entries = await self.board.snapshot.remote()
            self.geometry = next(({k: e[k] for k in ("block_size", "n_ctx")} for e in entries.values()), None)
            if self.geometry is None:
                return []
        chat = path.endswith("chat/completions")
        loop = asyncio.get_running_loop()
        try:
            ids = await loop.run_in_executor(self.pool, self._prompt_ids, body, chat)
        except Exception:  # noqa: BLE001 - malformed requests are the replica's to answer
            return []
        return prefix_block_hashes(ids, self.geometry["block_size"])

    def _prompt_ids(self, body: bytes, chat: bool) -> list[int]:
        """The prompt as the replica will see it: parsed and rendered by the server's own functions."""
        tok = self.prompts.tokenizer
        data = json.loads(body)
        if chat:
            if self.template is None:
                return []
            assert self.geometry is not None
            req = parse_chat(data, self.geometry["n_ctx"])
            assert req.messages is not None
            allow, tools = self.config.allow_special_in_content, req.tools and req.tools.tools
            return self.template.render_prompt(req.messages, tok, True, allow, tools).token_ids
        prompt = parse_completion(data).prompts[0]  # a batch: its first prompt stands for it
        return tok.encode(prompt, add_special=True) if isinstance(prompt, str) else list(prompt)

    async def _authorized(self, scope: Scope) -> bool:
        if self.config.api_key is None:
            return True
        try:
            check_api_key(Request(scope), self.config.api_key)
            return True
        except ApiError:
            return False

    # ---- the ingress's own routes ----------------------------------------------------------------
    async def health(self, request: Request) -> JSONResponse:
        entries = await self.board.snapshot.remote()
        replicas = {r: {**e["health"], "pid": e["pid"]} for r, e in entries.items()}
        ready = sum(e["status"] == 200 for e in entries.values())
        status = "ok" if ready else ("error" if entries else "loading")
        body = {"status": status, "model": self.model_name, "replicas_ready": ready, "replicas": replicas}
        if self.config.api_key is not None and not has_api_key(request, self.config.api_key):
            body = {"status": status}  # the single server's rule: details only with the key
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics(self, request: Request) -> PlainTextResponse:
        if self.config.api_key is not None and not self.config.metrics_public:
            check_api_key(request, self.config.api_key)
        entries = await self.board.snapshot.remote()
        text = label_replicas({r: e["metrics"] for r, e in entries.items()})
        name, lb = "edgellm_replicas_ready", f'model_name="{self.model_name}"'
        text += f"# HELP {name} Engine replicas answering /health.\n# TYPE {name} gauge\n"
        text += f"{name}{{{lb}}} {sum(e['status'] == 200 for e in entries.values())}\n"
        name = "edgellm_replica_failed_responses_total"
        text += f"# HELP {name} Responses ended by the ingress because their replica failed.\n"
        text += f"# TYPE {name} counter\n{name}{{{lb}}} {self.failed}\n"
        name = "edgellm_replica_retried_requests_total"
        text += f"# HELP {name} Requests sent to another replica because theirs was lost before any output.\n"
        text += f"# TYPE {name} counter\n{name}{{{lb}}} {self.relay.retries}\n"
        name = "edgellm_routing_decisions_total"
        text += f"# HELP {name} Replica choices by reason.\n# TYPE {name} counter\n"
        text += "".join(f'{name}{{{lb},reason="{r}"}} {c}\n' for r, c in sorted(DECISIONS.items()))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


class Ingress:
    def __init__(self, engine: Any, config: ServerConfig, board: Any) -> None:
        self._args = (config, engine, board)

    def __serve_build_asgi_app__(self) -> IngressApp:
        return IngressApp(*self._args)


def build_ray_app(
    config: ServerConfig,
    replicas: int | str,
    threads_per_replica: int,
    board: Any,
    runtime_env: dict[str, Any] | None = None,
    max_replicas: int | None = None,
) -> Any:
    """The Serve application: `replicas` engines (or "auto": 1..max_replicas, scaled on queue length)
    of `threads_per_replica` CPU threads each, behind one ingress."""
    scale: dict[str, Any]
    if replicas == "auto":
        scale = {
            "autoscaling_config": {
                "min_replicas": 1,
                "initial_replicas": 1,
                "max_replicas": max(1, max_replicas or 1),
                "target_ongoing_requests": config.engine.max_num_seqs,  # more in flight than a batch: a queue
            }
        }
    else:
        scale = {"num_replicas": int(replicas)}
    actor = {"num_cpus": threads_per_replica} | ({"runtime_env": runtime_env} if runtime_env else {})
    engine_config = config.with_engine(threads=threads_per_replica)
    engine = serve.deployment(
        EngineReplica,
        name="EngineReplica",
        ray_actor_options=actor,
        max_ongoing_requests=config.engine.max_num_seqs,  # beyond a batch, requests wait at the ingress...
        max_queued_requests=config.max_queue,  # ...up to --max-queue of them, then 429
        request_router_config=RequestRouterConfig(
            request_router_class="edgellm.server.replicas.request_router.PrefixAwareRequestRouter",
            request_router_kwargs={"max_margin": max(1, config.engine.max_num_seqs // 4)},
        ),
        health_check_period_s=5,
        logging_config=QUIET_LOGS,
        **scale,
    ).bind(engine_config, board)
    ingress_actor = {"num_cpus": 0} | ({"runtime_env": runtime_env} if runtime_env else {})
    ingress = serve.deployment(
        serve.ingress()(Ingress),
        name="Ingress",
        ray_actor_options=ingress_actor,
        max_ongoing_requests=100_000,  # admission is the engines' queue limit, not the proxy's
        logging_config=QUIET_LOGS,
    )
    return ingress.bind(engine, config, board)
