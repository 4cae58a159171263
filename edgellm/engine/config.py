"""The engine's settings: one dataclass whose fields carry their command-line flag, help, default and
bounds (one table, as vLLM's EngineArgs and mini-sglang's ServerArgs keep them). `LLM(config=...)` and
LLM's keyword arguments, every command that loads a model, the server and its Ray replicas build an
EngineConfig; LLM sends it, with the model path resolved, to the engine core process (plain values only:
it is pickled across)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from edgellm.engine.spec.config import SpeculativeConfig, parse_speculative
from edgellm.lora.choice import LoraFlag, lora_files
from edgellm.models.catalog import DEFAULT_MODEL
from edgellm.quants.kv_cache import DEFAULT_KV_CACHE_DTYPE, KV_CACHE_TYPES


def option(
    default: Any,
    flag: str | None = None,
    help: str = "",
    *,
    lo: Any = None,
    hi: Any = None,
    **argparse_kw: Any,
) -> Any:
    """A config field: its default; `flag`, the command-line option that sets it (argparse_kw: how it
    parses; None: Python only); lo/hi, the bounds check_bounds enforces, naming the flag."""
    meta = {"flag": flag, "help": help, "lo": lo, "hi": hi, "argparse": argparse_kw}
    return field(default=default, metadata=meta)


class CliConfig:
    """add_cli_args / from_cli_args / check_bounds for a dataclass of option() fields."""

    @classmethod
    def cli_fields(cls) -> list[dataclasses.Field]:
        return [f for f in fields(cls) if f.metadata.get("flag")]  # type: ignore[arg-type]

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, unset_defaults: bool = False) -> None:
        """Every flag of the table, each stored under its field's name. unset_defaults: every default is
        None, so a caller can tell what was given (from_cli_args still fills in the fields' defaults)."""
        for f in cls.cli_fields():
            kw = dict(f.metadata["argparse"])
            if kw.get("action") != "store_true" and "choices" not in kw:  # the flag's name, not the field's
                kw.setdefault("metavar", f.metadata["flag"].removeprefix("--").replace("-", "_").upper())
            default = [] if kw.get("action") == "append" else f.default
            parser.add_argument(
                f.metadata["flag"],
                dest=f.name,
                default=None if unset_defaults else default,
                help=f.metadata["help"],
                **kw,
            )

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace, **overrides: Any) -> Any:
        """The config of parsed flags (those absent from `args`, or None, keep their defaults);
        `overrides` set fields directly."""
        values = {}
        for f in fields(cls):  # type: ignore[arg-type]
            value = getattr(args, f.name, None)
            if value is not None and f.init:
                values[f.name] = tuple(value) if isinstance(value, list) else value
        return cls(**{**values, **overrides})

    def check_bounds(self) -> None:
        """Every field with bounds in the table inside them, or a ValueError naming its flag."""
        for f in fields(self):  # type: ignore[arg-type]
            lo, hi, value = f.metadata.get("lo"), f.metadata.get("hi"), getattr(self, f.name)
            if value is None or (lo is None and hi is None):
                continue
            flag = f.metadata.get("flag")
            name = f"{f.name} ({flag})" if flag else f.name
            bounds = " and ".join(
                b for b in (lo is not None and f">= {lo}", hi is not None and f"<= {hi}") if b
            )
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number {bounds}, got {value!r}")
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                raise ValueError(f"{name} must be {bounds}, got {value}")


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


DEFAULT_CTX = 4096
DEFAULT_KV_MEMORY = 512 * 2**20  # bytes of KV cache when not given (at least one full context is kept)


def kv_budget_bytes(kv_cache_memory: int | float | None) -> int:
    """KV cache budget: bytes (an int), or a fraction of physical RAM (a float in (0, 1))."""
    if kv_cache_memory is None:
        return DEFAULT_KV_MEMORY
    if isinstance(kv_cache_memory, float) and 0 < kv_cache_memory < 1:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * kv_cache_memory)
    if kv_cache_memory < 0:
        raise ValueError(f"kv_cache_memory must be bytes >= 0 or a fraction in (0, 1), got {kv_cache_memory}")
    return int(kv_cache_memory)


BACKENDS = ["cpu", "cuda"]  # the command line's choices; the core refuses an unknown one when it loads


@dataclass
class EngineConfig(CliConfig):
    # catalog name, .gguf path or hf://ORG/REPO[:QUANT] (each command's argument; the core gets the path)
    model: str | Path = DEFAULT_MODEL
    backend: str = option("cpu", "--backend", "compute backend", choices=BACKENDS)
    # llama.cpp's multimodal projector file: images in prompts (edgellm/vision/); read by the front-end
    mmproj: str | None = option(
        None,
        "--mmproj",
        "mmproj GGUF: take images (default: the one mmproj*.gguf beside the model; none: off)",
    )
    n_ctx: int | None = option(
        None, "--ctx", "context window in tokens (default 4096, capped by the model)", lo=1, type=int
    )
    threads: int | None = option(
        None, "--threads", "CPU threads (default: EDGELLM_THREADS or physical cores)", lo=1, type=int
    )
    max_num_seqs: int = option(
        16, "--max-num-seqs", "requests generated together (default 16)", lo=1, type=int
    )
    max_num_batched_tokens: int = 512  # tokens per step at most (prefill chunks share it)
    block_size: int = option(16, lo=1)  # tokens per KV cache block
    kv_cache_memory: int | float | None = option(
        None,
        "--kv-cache-memory",
        "KV cache: bytes (512M, 2G) or a fraction of RAM (0.25); default 512M, at least one context",
        lo=0,
        type=kv_memory,
    )
    kv_cache_dtype: str = option(  # a row of quants/kv_cache.py's table
        DEFAULT_KV_CACHE_DTYPE,
        "--kv-cache-dtype",
        "KV cache element type: f16 (default) or q8_0 (as llama.cpp's --cache-type-k/-v q8_0: "
        "~1.9x the tokens in the same --kv-cache-memory, head sizes a multiple of 32)",
        choices=list(KV_CACHE_TYPES),
    )
    enable_prefix_caching: bool = True
    # KV blocks of finished prompts kept beyond the pool, in RAM and in this directory, across restarts
    # (engine/prompt_cache.py); None: the prefix cache lives and dies with the KV pool
    prompt_cache: str | Path | None = option(
        None,
        "--prompt-cache",
        "keep finished prompts' KV blocks in RAM and in DIR (checked, LRU), so a prompt sharing a prefix "
        "with one computed before a restart or a reload starts from it",
        metavar="DIR",
    )
    prompt_cache_size: int | float = option(
        4 * 2**30,
        "--prompt-cache-size",
        "with --prompt-cache: bytes of KV blocks kept, in RAM and on disk each (default 4G; 512M, 2G, or a "
        "fraction of RAM)",
        lo=0,
        type=kv_memory,
    )
    lazy_experts: bool = option(
        False,
        "--lazy-experts",
        "mixture-of-experts models: prepare each expert's weights when a token first selects it (a faster "
        "start, slower first prompts) instead of all of them at load",
        action="store_true",
    )
    huge_pages: str = option(
        "auto",
        "--huge-pages",
        "prepared weights on transparent huge pages: on (faster decode), off (faster load on a VM that "
        "reports free memory to its host), auto (default: off only there, for weights of 2 GiB or more, "
        "where a timed first write finds huge pages over 3 times as slow to get as 4 KiB ones)",
        choices=["auto", "on", "off"],
    )
    # speculative decoding: "ngram", "draft:PATH", a dict of SpeculativeConfig's fields, or one (None: off)
    speculative: str | dict | SpeculativeConfig | None = option(
        None,
        "--speculative",
        "speculative decoding: 'ngram' (prompt lookup), or 'draft:PATH' (a GGUF with the same vocab)",
        metavar="ngram|draft:PATH",
    )
    num_speculative_tokens: int | None = option(  # k: overrides the speculative config's num_tokens
        None, "--num-speculative-tokens", "draft tokens per step at most (default 8)", type=int
    )
    # Seconds between the core's output messages while requests are under way (0: one per step). A
    # request's first and last outputs are never held back; only the tokens in between are batched.
    stream_interval: float = option(0.0, lo=0, hi=1)
    core_log: str | Path | None = None  # file for the core process's stdout/stderr (None: inherited)
    # LoRA adapters (edgellm/lora/): paths (global scale 1) or (path, global scale); ids in this order
    lora: tuple = option(
        (), "--lora", "LoRA adapter GGUF, applied at scale 1 (repeatable; ids in the order given)",
        action=LoraFlag, metavar="FILE",
    )  # fmt: skip
    # --lora-scaled appends to `lora` (LoraFlag); this field stays empty from the command line
    lora_scaled: tuple = option(
        (), "--lora-scaled", "LoRA adapter with its global scale: FILE SCALE, or FILE:SCALE (repeatable)",
        action=LoraFlag, nargs="+", metavar="FILE",
    )  # fmt: skip

    def __post_init__(self) -> None:
        self.lora = tuple(lora_files([*self.lora, *self.lora_scaled]))  # a bad entry fails here
        self.lora_scaled = ()
        self.check_bounds()
        self.speculative_config()  # a bad --speculative fails here, before anything loads

    def speculative_config(self) -> SpeculativeConfig | None:
        return parse_speculative(self.speculative, self.num_speculative_tokens)
