"""`python -m edgellm.server MODEL [--host] [--port] [--api-key] [--max-queue] [--ctx] ...`"""

from __future__ import annotations

import argparse

from edgellm.cli import (
    add_kv_dtype_arg,
    add_kv_memory_arg,
    add_server_security_args,
    add_speculative_args,
    server_options,
)
from edgellm.sampling_defaults import add_sampling_default_args
from edgellm.server import run_server


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m edgellm.server", description="OpenAI-compatible server")
    p.add_argument("model", nargs="?", default="smollm2-135m", help="catalog name or .gguf path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-queue", type=int, default=64, help="requests that may wait beyond the running ones")
    p.add_argument("--ctx", type=int, default=None, help="context window (tokens)")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=16, help="requests generated together")
    p.add_argument("--max-body-bytes", type=int, default=None)
    add_kv_memory_arg(p)
    add_kv_dtype_arg(p)
    add_server_security_args(p)
    add_sampling_default_args(p)
    add_speculative_args(p)
    a = p.parse_args(argv)
    extra = {} if a.max_body_bytes is None else {"max_body_bytes": a.max_body_bytes}
    run_server(
        a.model,
        a.host,
        a.port,
        threads=a.threads,
        max_num_seqs=a.max_num_seqs,
        **server_options(a),
        **extra,
    )


if __name__ == "__main__":
    main()
