"""`edgellm serve --models A,B`: the router of server/multi/router.py behind server/multi/routes.py's app, on
one uvicorn server; the engine flags given are passed on to every model's child server."""

from __future__ import annotations

import sys
import threading
import time

import uvicorn

from edgellm.config import ServerConfig
from edgellm.engine.config import EngineConfig
from edgellm.sampling.defaults import sampling_default_flags
from edgellm.server import warn_if_exposed
from edgellm.server.http.strict import uvicorn_config
from edgellm.server.multi.router import ModelRouter, read_presets
from edgellm.server.multi.routes import build_router_app


def run_multi_server(config: ServerConfig, models: list[str], child_args: list[str],
                     presets: dict[str, list[str]] | None = None) -> None:  # fmt: skip
    router = ModelRouter(models, config.keep_alive, config.models_max, child_args, presets, config.api_key)
    host, port = config.host, config.port
    app = build_router_app(router, config.api_key, host, config.cors_origins, config.max_body_bytes)
    warn_if_exposed(host, config.api_key)
    server = uvicorn.Server(uvicorn_config(app, host, port, config.log_level))

    def say_when_listening() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            print(f"edgellm: serving {', '.join(models)} at http://{host}:{port}/v1", flush=True)

    threading.Thread(target=say_when_listening, daemon=True).start()
    server.run()


# The router's own settings: every other flag of `serve` that was given goes to each model's server.
ROUTER_ONLY = {
    "host", "port", "api_key", "models", "keep_alive", "models_max", "presets", "cors_origins",
    "log_level", "replicas", "ray_address", "threads_per_replica", "served_model_names",
    "chat_template_file", "sampling_defaults", "engine",
}  # fmt: skip


def child_flags(config: ServerConfig) -> list[str]:
    """The flags of `config` that differ from their defaults, as a model's `edgellm serve` takes them
    (the engine's and the server's tables, so a flag added to either is passed on without a change
    here); not the router's own (ROUTER_ONLY) nor the key (the environment carries it:
    server/multi/router.py)."""
    out = []
    tables = [(config.engine, EngineConfig.cli_fields()), (config, ServerConfig.cli_fields())]
    for obj, fields in tables:
        for f in fields:
            value, flag = getattr(obj, f.name), f.metadata["flag"]
            if f.name in ROUTER_ONLY or value == f.default:
                continue
            if f.metadata["argparse"].get("action") == "store_true":
                out.append(flag)
            elif isinstance(value, tuple):
                out += [f"{flag}={v}" for v in value]
            else:
                out.append(f"{flag}={value}")
    return out


def serve_models(args) -> int:
    """`edgellm serve --models A,B`: the router, with the engine flags passed on to every model's server."""
    from edgellm.models.catalog import DEFAULT_MODEL

    others = {
        "MODEL": args.model != DEFAULT_MODEL,
        "--replicas": args.replicas is not None,
        "--speculative": args.speculative is not None,
        "--served-model-name": bool(args.served_model_names),
        "--chat-template-file": args.chat_template_file is not None,
    }
    if any(others.values()):
        given = ", ".join(k for k, v in others.items() if v)
        print(f"edgellm: error: --models serves each model as named; not with {given}", file=sys.stderr)
        return 2
    config = ServerConfig.from_cli_args(args)
    child = child_flags(config) + sampling_default_flags(args)
    models = [m for m in config.models.split(",") if m]
    presets = read_presets(config.presets, models) if config.presets else None
    run_multi_server(config, models, child, presets)
    return 0
