"""`edgellm serve --models A,B`: the router of multi.py behind multi_routes.py's app, on one uvicorn
server; the engine flags given are passed on to every model's child server."""

from __future__ import annotations

import sys
import threading
import time

from edgellm.sampling_defaults import sampling_default_flags
from edgellm.server.multi import ModelRouter, read_presets
from edgellm.server.multi_routes import build_router_app


def run_multi_server(
    models: list[str],
    host: str,
    port: int,
    keep_alive: float,
    models_max: int,
    child_args: list[str],
    presets: dict[str, list[str]] | None = None,
    api_key: str | None = None,
) -> None:
    import uvicorn

    router = ModelRouter(models, keep_alive, models_max, child_args, presets)
    app = build_router_app(router, api_key)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))

    def say_when_listening() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            print(f"edgellm: serving {', '.join(models)} at http://{host}:{port}/v1", flush=True)

    threading.Thread(target=say_when_listening, daemon=True).start()
    server.run()


def serve_models(args) -> int:
    """`edgellm serve --models A,B`: the router, with the engine flags passed on to every model's server."""
    from edgellm.catalog import DEFAULT_MODEL

    others = {
        "MODEL": args.model != DEFAULT_MODEL,
        "--replicas": args.replicas is not None,
        "--speculative": args.speculative is not None,
        "--served-model-name": bool(args.served_model_names),
        "--chat-template-file": args.chat_template_file is not None,
        "--cors-origin": bool(args.cors_origins),
    }
    if any(others.values()):
        given = ", ".join(k for k, v in others.items() if v)
        print(f"edgellm: error: --models serves each model as named; not with {given}", file=sys.stderr)
        return 2
    child = [
        f"--kv-cache-dtype={args.kv_cache_dtype}",
        f"--backend={args.backend}",
        f"--max-queue={args.max_queue}",
        f"--max-num-seqs={args.max_num_seqs}",
    ]
    flags = (("--ctx", args.n_ctx), ("--threads", args.threads), ("--api-key", args.api_key))
    for flag, value in (*flags, ("--kv-cache-memory", args.kv_cache_memory)):
        if value is not None:
            child.append(f"{flag}={value}")
    child += sampling_default_flags(args)
    models = [m for m in args.models.split(",") if m]
    presets = read_presets(args.presets, models) if args.presets else None
    run_multi_server(
        models, args.host, args.port, args.keep_alive, args.models_max, child, presets, args.api_key
    )
    return 0
