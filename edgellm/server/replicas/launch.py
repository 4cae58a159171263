"""`edgellm serve MODEL --replicas N|auto [--ray-address ADDR] [--threads-per-replica T]`: start (or join)
Ray, deploy the Serve application of server/replicas/serve_app.py, and hold it until interrupted."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from edgellm.config import ServerConfig
from edgellm.models.catalog import resolve_model
from edgellm.server import _is_loopback, _say
from edgellm.server.http.compat import ModelNames

APP_NAME = "edgellm"
OBJECT_STORE_BYTES = 128 * 2**20  # requests and token streams are small; Ray's default is 30% of RAM


def default_threads(replicas: int | str) -> int:
    """This machine's cores shared out among the replicas (one thread each under autoscaling)."""
    return max(1, (os.cpu_count() or 1) // replicas) if isinstance(replicas, int) else 1


def _local_runtime_env() -> dict[str, Any]:
    """Ray's workers import edgellm from this process's copy of it (a source checkout included)."""
    root = str(Path(__file__).resolve().parents[3])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {"env_vars": {"PYTHONPATH": path}}


def run_ray_server(config: ServerConfig, num_cpus: int | None = None) -> None:
    """Serve `config.engine.model` on `config.replicas` engine replicas behind one OpenAI-compatible
    endpoint until interrupted. Without `config.ray_address` a local Ray instance is started with
    `num_cpus` (default: enough for the replicas, at least this machine's cores) and stopped at the end."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise RuntimeError("--replicas needs Ray Serve: pip install 'edgellm[ray]'") from None
    from edgellm.server.replicas.serve_app import ReplicaBoard, build_ray_app

    host, port, replicas, ray_address = config.host, config.port, config.replicas, config.ray_address
    if replicas is None:
        raise ValueError("run_ray_server needs a replica count (--replicas N or auto)")
    model = config.engine.model
    threads = config.threads_per_replica or default_threads(replicas)
    resolve_model(model)  # a missing model fails here, not in every replica
    cfg = config.with_engine(threads=threads)
    name = ModelNames(model, cfg.served_model_names).primary  # a bad --served-model-name fails here
    if not _is_loopback(host) and not cfg.api_key:
        _say(f"WARNING: listening on {host} without an API key; anyone who can reach it can use the model")
    local = ray_address is None
    runtime_env = _local_runtime_env() if local else None
    if local:
        need = (replicas if isinstance(replicas, int) else 1) * threads
        cores = os.cpu_count() or 1
        cpus = num_cpus or max(cores, need)
        if need > cpus:
            raise ValueError(f"{replicas} replicas x {threads} threads need {need} CPUs; Ray has {cpus}")
        if need > cores:
            _say(f"WARNING: {need} engine threads on {cores} cores: they will slow each other down")
        ray.init(
            num_cpus=cpus,
            include_dashboard=False,
            object_store_memory=OBJECT_STORE_BYTES,
            namespace=APP_NAME,
            logging_level=logging.WARNING,
            runtime_env=runtime_env,
        )
    else:
        ray.init(address=ray_address, namespace=APP_NAME, logging_level=logging.WARNING)
    max_replicas = int(ray.cluster_resources().get("CPU", threads)) // threads
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        board = ReplicaBoard.remote()  # owned by this process: it goes when the server does
        serve.start(http_options={"host": host, "port": port})
        app = build_ray_app(cfg, replicas, threads, board, runtime_env, max_replicas=max_replicas)
        _say(f"deploying {replicas} replica(s) x {threads} thread(s) on Ray Serve")
        serve.run(app, name=APP_NAME, route_prefix="/")
        shown = f"[{host}]" if ":" in host else host
        print(
            f"edgellm: serving {name} at http://{shown}:{port}/v1 "
            f"({replicas} replica(s) x {threads} thread(s), Ray Serve)",
            flush=True,
        )
        while not stop.wait(1.0):
            pass
    finally:
        try:
            serve.delete(APP_NAME)
            if local:
                serve.shutdown()
        finally:
            ray.shutdown()
