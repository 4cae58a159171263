"""OpenAI-compatible HTTP server over the engine: `run_server(config)` (what `edgellm serve` calls).

Starlette on uvicorn: the event loop handles HTTP and SSE while the engine core runs in its own process
(engine/core_process.py), started by LLM. See app.py for the routes, state.py for what the server holds,
endpoint.py and errors.py for the route wrapper and its errors, generate.py for streaming, and replicas/
for `serve --replicas` on Ray Serve.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading

import uvicorn

from edgellm.server.app import build_app
from edgellm.server.http.strict import uvicorn_config
from edgellm.server.state import ServerConfig, ServerState

__all__ = ["ServerConfig", "build_app", "run_server", "warn_if_exposed"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except (OSError, ValueError):
            return False


def _say(msg: str) -> None:
    print(f"edgellm: {msg}", file=sys.stderr, flush=True)


def warn_if_exposed(host: str, api_key: str | None) -> None:
    if not _is_loopback(host) and not api_key:
        _say(
            f"WARNING: listening on {host}, reachable from other machines, without an API key; "
            "anyone who can reach this port can use the model (pass --api-key or set EDGELLM_API_KEY)"
        )


def run_server(config: ServerConfig) -> None:
    """Serve `config.engine.model` until interrupted. The socket opens at once (/health answers 503 while
    the model loads); the URL is printed to stdout once the model is ready."""
    host, port, model = config.host, config.port, config.engine.model
    warn_if_exposed(host, config.api_key)
    state = ServerState(config)  # a bad --served-model-name or --cors-origin is a ValueError from here on
    server: uvicorn.Server

    def load() -> None:
        try:
            state.load(progress=_say)
        except BaseException as e:  # noqa: BLE001 - reported, then the server stops
            _say(f"failed to load {model}: {e!r}")
            server.should_exit = True
            return
        shown = f"[{host}]" if ":" in host else host
        print(
            f"edgellm: serving {state.model_name} at http://{shown}:{port}/v1 (context {state.llm.n_ctx})",
            flush=True,
        )

    def start_loading() -> None:
        threading.Thread(target=load, name="edgellm-load", daemon=True).start()

    app = build_app(state, on_startup=start_loading)  # before the socket opens: checks --cors-origin
    server = uvicorn.Server(uvicorn_config(app, host, port, config.log_level))

    def request_exit() -> None:
        server.should_exit = True

    state.request_exit = request_exit
    # HTTP on this thread; the engine core in its own process (started by the load thread), where its
    # loop runs on that process's main thread.
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        if state.llm is not None:
            state.llm.shutdown()
    if state.load_error is not None or not server.started:
        if not server.started:
            _say(f"could not listen on {host}:{port}")
        raise SystemExit(1)
