"""The server's settings: `ServerConfig`, which holds the engine's `EngineConfig` (engine/config.py), in
the same table form: each field with its flag, help, default and bounds. `edgellm serve` and
`python -m edgellm.server` are one parser (add_cli_args); run_server, the Ray replicas and the server's
app take the config it builds. It lives outside edgellm/server/ so that the command line can read the
table without starting the web stack that package imports."""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from edgellm.chat.reasoning import REASONING_FORMATS
from edgellm.cli.args import replicas_arg
from edgellm.engine.config import CliConfig, EngineConfig, option
from edgellm.models.catalog import DEFAULT_MODEL
from edgellm.sampling.defaults import add_sampling_default_args, check_sampling_defaults, sampling_defaults

DEFAULT_MAX_BODY_BYTES = 4 * 2**20
API_KEY_ENV = "EDGELLM_API_KEY"  # --api-key's form that no `ps` shows
MODEL_HELP = "catalog name, path to a .gguf file, or Hugging Face model (hf://ORG/REPO[:QUANT])"
ALLOW_SPECIAL_HELP = (
    "tokenize control-token text typed in user and tool messages (e.g. '<|im_start|>') as control tokens; "
    "by default it stays plain text so a message cannot open a turn of another role"
)


_KEY_CHARS = re.compile(r"[\x21-\x7e]+")  # what an Authorization header carries without encoding


def check_api_key_option(key: str | None) -> None:
    """A key no client can send is an error at start-up, not a server that refuses everyone (or, for an
    empty key, one that lets everyone in)."""
    if key is not None and not _KEY_CHARS.fullmatch(key):
        raise ValueError(
            "--api-key: expected a non-empty key of printable ASCII characters without spaces "
            f"(what an Authorization header carries), got {len(key)} characters"
        )


@dataclass
class ServerConfig(CliConfig):
    engine: EngineConfig = field(default_factory=EngineConfig)  # the model and how it runs
    host: str = option("127.0.0.1", "--host", "address to listen on (default 127.0.0.1: this machine only)")
    port: int = option(8080, "--port", "port to listen on (default 8080)", lo=0, hi=65535, type=int)
    api_key: str | None = option(
        None,
        "--api-key",
        f"every route but /health needs 'Authorization: Bearer KEY' (or set {API_KEY_ENV}=KEY, which "
        "keeps the key off the command line that any local user can read)",
    )
    max_queue: int = option(  # beyond the running requests
        64, "--max-queue", "requests that may wait beyond the running ones (default 64)", lo=0, type=int
    )
    max_body_bytes: int = option(
        DEFAULT_MAX_BODY_BYTES, "--max-body-bytes", "largest request body (default 4 MiB)", lo=1, type=int
    )
    metrics_public: bool = option(
        False, "--metrics-public", "serve /metrics without the --api-key (for scrapers)", action="store_true"
    )
    allow_special_in_content: bool = option(
        False, "--allow-special-in-content", ALLOW_SPECIAL_HELP, action="store_true"
    )
    chat_template_file: str | None = option(  # instead of the GGUF's template
        None, "--chat-template-file", "a Jinja chat template to use instead of the model's"
    )
    served_model_names: tuple[str, ...] = option(  # the first is reported; none: any name is accepted
        (),
        "--served-model-name",
        "a model name clients may use (repeatable; the first is reported); with it other names are "
        "404, without it any name is accepted",
        action="append",
        metavar="NAME",
    )
    cors_origins: tuple[str, ...] = option(  # "*": any; none: CORS off
        (),
        "--cors-origin",
        "let browser pages from ORIGIN (e.g. http://localhost:3000, or '*' for any) call the server "
        "(repeatable; default: no CORS)",
        action="append",
        metavar="ORIGIN",
    )
    reasoning_format: str = option(
        "auto",
        "--reasoning-format",
        "split <think>...</think> out of chat replies into reasoning_content/reasoning: auto (default) "
        "when the chat template thinks, deepseek always, none never",
        choices=list(REASONING_FORMATS),
    )
    reasoning_budget: int = option(
        -1,
        "--reasoning-budget",
        "reasoning tokens per chat reply before the think block is closed (-1: unlimited, the "
        "default; 0: no thinking)",
        lo=-1,
        type=int,
        metavar="N",
    )
    context_overflow: str = option(
        "error",
        "--context-overflow",
        "a chat prompt longer than the context: error (the default, a 400), truncate-middle (drop whole "
        "messages from the middle, keeping the system prompt, the first user turn and the latest turns) "
        "or rolling-window (shift out the oldest tokens after the system prompt as the context fills; "
        "the reply may run past the context); a request's context_overflow field overrides it",
        choices=["error", "truncate-middle", "rolling-window"],
    )
    # SamplingParams fields for requests that omit them: the flags of sampling/defaults.py's table
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    # several engines behind one endpoint (Ray Serve: server/replicas/launch.py)
    replicas: int | str | None = option(
        None,
        "--replicas",
        "N engine replicas (or 'auto') behind one endpoint, on Ray Serve (pip install 'edgellm[ray]')",
        type=replicas_arg,
    )
    ray_address: str | None = option(None, "--ray-address", "with --replicas: join this Ray cluster")
    threads_per_replica: int | None = option(
        None, "--threads-per-replica", "with --replicas: CPU threads per engine", lo=1, type=int
    )
    # several models behind one port (server/multi/router.py, started by server/multi/run.py)
    models: str | None = option(
        None,
        "--models",
        "serve several models, each request routed by its 'model' field; each model loads on first use "
        "(its own engine process) and unloads after --keep-alive idle seconds",
        metavar="NAME[,NAME...]",
    )
    keep_alive: float = option(300.0, "--keep-alive", "with --models: idle seconds before unload", type=float)
    models_max: int = option(2, "--models-max", "with --models: models loaded at once at most", type=int)
    presets: str | None = option(None, "--presets", "with --models: a TOML file of per-model settings")
    log_level: str = "warning"  # uvicorn's

    def __post_init__(self) -> None:
        self.check_bounds()
        check_api_key_option(self.api_key)
        check_sampling_defaults(self.sampling_defaults)
        if self.reasoning_format not in REASONING_FORMATS:
            choices = ", ".join(REASONING_FORMATS)
            raise ValueError(f"reasoning_format must be one of {choices}, got {self.reasoning_format!r}")
        if self.replicas is not None:
            try:
                self.replicas = replicas_arg(str(self.replicas))
            except argparse.ArgumentTypeError as e:
                raise ValueError(f"replicas (--replicas): {e}") from None
        self.served_model_names, self.cors_origins = tuple(self.served_model_names), tuple(self.cors_origins)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, unset_defaults: bool = False) -> None:
        """The whole `serve` command line: the model, the engine's flags, the server's, the sampling
        defaults."""
        parser.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=MODEL_HELP)
        EngineConfig.add_cli_args(parser, unset_defaults)
        super().add_cli_args(parser, unset_defaults)
        add_sampling_default_args(parser)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace, **overrides: Any) -> ServerConfig:
        engine = EngineConfig.from_cli_args(args)
        return super().from_cli_args(
            args, engine=engine, sampling_defaults=sampling_defaults(args), **overrides
        )

    def with_engine(self, **changes: Any) -> ServerConfig:
        """This config with some of the engine's fields changed (a replica's threads)."""
        return dataclasses.replace(self, engine=dataclasses.replace(self.engine, **changes))
