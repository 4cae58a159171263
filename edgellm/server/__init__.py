"""OpenAI-compatible HTTP server over the engine: `run_server(...)` (what `edgellm serve` calls).

Starlette on uvicorn, one process: the event loop handles HTTP and SSE while the engine runs on its
own thread (AsyncLLMEngine). See app.py for the routes and generate.py for streaming.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
import time

import uvicorn

from edgellm.server.app import DEFAULT_MAX_BODY_BYTES, ServerConfig, ServerState, build_app

__all__ = ["ServerConfig", "build_app", "run_server"]


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


def run_server(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8080,
    api_key: str | None = None,
    max_queue: int = 64,
    ctx: int | None = None,
    backend: str = "cpu",
    threads: int | None = None,
    *,
    max_num_seqs: int = 16,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    log_level: str = "warning",
    metrics_public: bool = False,
    allow_special_in_content: bool = False,
    chat_template_file: str | None = None,
) -> None:
    """Serve `model` until interrupted. The socket opens at once (/health answers 503 while the model
    loads); the URL is printed to stdout once the model is ready."""
    if max_queue < 0 or max_num_seqs < 1:
        raise ValueError("max_queue must be >= 0 and max_num_seqs >= 1")
    if not _is_loopback(host) and not api_key:
        _say(
            f"WARNING: listening on {host}, reachable from other machines, without an API key; "
            "anyone who can reach this port can use the model (pass --api-key)"
        )
    config = ServerConfig(
        model=model,
        backend=backend,
        ctx=ctx,
        threads=threads,
        api_key=api_key,
        max_queue=max_queue,
        max_num_seqs=max_num_seqs,
        max_body_bytes=max_body_bytes,
        metrics_public=metrics_public,
        allow_special_in_content=allow_special_in_content,
        chat_template_file=chat_template_file,
    )
    state = ServerState(config)

    app = build_app(state, on_startup=lambda: None)
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=3, lifespan="on"
        )
    )
    # HTTP on a helper thread, the model and the engine loop on this (main) thread: the Numba/OpenMP
    # kernels run ~3x slower when launched from a thread other than the process's main thread.
    http = threading.Thread(target=server.run, name="edgellm-http", daemon=True)
    http.start()
    try:
        try:
            state.load(progress=_say, own_thread=False)
        except BaseException as e:  # noqa: BLE001 - reported, then the server stops
            _say(f"failed to load {model}: {e!r}")
            raise SystemExit(1) from None
        while not server.started and not server.should_exit and http.is_alive():
            time.sleep(0.02)
        if not server.started:
            _say(f"could not listen on {host}:{port}")
            raise SystemExit(1)
        shown = f"[{host}]" if ":" in host else host
        print(
            f"edgellm: serving {state.model_name} at http://{shown}:{port}/v1 (context {state.llm.n_ctx})",
            flush=True,
        )
        state.engine.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.should_exit = True
        if state.engine is not None:
            state.engine.shutdown()
        http.join(timeout=5)
    if state.load_error is not None:
        raise SystemExit(1)
