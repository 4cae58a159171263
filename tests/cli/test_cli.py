"""The `edgellm` command line as a user runs it (subprocesses), and the model catalog."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgellm.backends.cpu import tiers
from edgellm.models.catalog import CATALOG, DEFAULT_MODEL, ModelNotFoundError, resolve_model
from edgellm.testing.limits import HANG_S


def edgellm(*args: str, timeout: float = HANG_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgellm", *args], capture_output=True, text=True, timeout=timeout
    )


def test_run_streams_greedy_text_and_prints_stats(smollm2_path) -> None:
    """--raw: the text continued as it is; without it, an instruct model (SmolLM2's GGUF has a chat
    template) gets the prompt as a user message through its template. Both as LLM.generate gives them."""
    from edgellm import LLM, SamplingParams
    from edgellm.chat.template import ChatTemplate

    question = "The capital of France is"
    raw = edgellm("run", "smollm2-135m", question, "--raw", "--max-tokens", "8", "--temperature", "0")
    chat = edgellm("run", "smollm2-135m", question, "--max-tokens", "8", "--temperature", "0")
    assert raw.returncode == 0, raw.stderr
    assert chat.returncode == 0, chat.stderr
    greedy = SamplingParams(temperature=0, max_tokens=8)
    with LLM(smollm2_path, n_ctx=256) as llm:
        template = ChatTemplate.from_metadata(llm.metadata, llm.tokenizer)
        ids = template.render_prompt([{"role": "user", "content": question}], llm.tokenizer).token_ids
        expected_raw, expected_chat = (out.text for out in llm.generate([question, ids], greedy))
    assert raw.stdout == expected_raw + "\n"
    assert "prompt 5 tokens" in raw.stderr and "TTFT" in raw.stderr and "tok/s" in raw.stderr
    assert chat.stdout == expected_chat + "\n"
    assert f"prompt {len(ids)} tokens" in chat.stderr and len(ids) > 5 + 10  # the template's turns around it


def test_run_help_shows_the_sampling_defaults() -> None:
    proc = edgellm("run", "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # argparse wraps the lines
    for flag, value in [("--temperature", "0.8"), ("--top-p", "0.95"), ("--top-k", "40"), ("--min-p", "0.05"),
                        ("--repetition-penalty", "1.0"), ("--max-tokens", "256")]:  # fmt: skip
        assert f"(default: {value}" in text.split(flag, 2)[2][:200], flag
    assert "--raw" in text and "chat template" in text


def test_run_takes_the_models_own_sampling_where_its_gguf_sets_it() -> None:
    """general.sampling.* (llama.cpp's keys) fill the flags not given; a flag given wins; a value out of
    bounds in the file is ignored."""
    from edgellm.cli.commands import build_parser, run_sampling

    metadata = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20, "general.sampling.min_p": -1.0}
    args = build_parser().parse_args(["run", "m", "hi", "--top-k", "5"])
    got = run_sampling(args, metadata)
    assert got == {"temperature": 0.6, "top_p": 0.95, "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.0}
    assert run_sampling(build_parser().parse_args(["run", "m", "hi"]), {})["temperature"] == 0.8


def test_bench_json_has_the_llamacpp_bench_fields(smollm2_path) -> None:
    proc = edgellm(
        "bench", "smollm2-135m", "--prompt-tokens", "16", "--gen-tokens", "8", "--repeat", "1", "--json",
        "--kv-cache-dtype", "q8_0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["prefill_tok_s"] > 0 and result["decode_tok_s"] > 0
    assert result["peak_rss_mb"] > 0 and 0 < result["decode_vs_ceiling"]
    # A tile tier keeps the weights at the file's bit width; the portable int8 rows: about twice the Q4_1.
    tier = tiers.active_tier()
    assert result["cpu_tier"] == tier.name
    assert 1.0 <= result["weight_bytes_vs_gguf"] <= (1.05 if tier.tiles is not None else 2.2)
    # SmolLM2: 30 layers x 3 KV heads x (64 + 64) values at 34 bytes per 32
    assert (result["kv_cache_dtype"], result["kv_bytes_per_token"]) == ("q8_0", 12240)
    assert result["kv_cache_tokens"] >= 2048


def test_without_verbose_only_fetching_and_compiling_are_said(capsys: pytest.CaptureFixture) -> None:
    """LLM's default progress (run, bench and library use without verbose=): the slow steps only."""
    from edgellm.llm import slow_steps

    lines = [
        "loading m.gguf: llama",
        "repacked weights of 3/30 layers",
        "kernels loaded from cache in 0.3 s",
        "compiling Numba kernels (first start only; cached on disk afterwards)...",
        "  still compiling... 5 s (decoder_layer_cpu)",
        "fetching model gemma3-270m (253 MB)",
    ]
    for line in lines:
        slow_steps(line)
    assert capsys.readouterr().err.splitlines() == [
        "edgellm: compiling Numba kernels (first start only; cached on disk afterwards)...",
        "edgellm:   still compiling... 5 s (decoder_layer_cpu)",
        "edgellm: fetching model gemma3-270m (253 MB)",
    ]


def test_version() -> None:
    import tomllib

    from edgellm.testing.paths import ROOT

    proc = edgellm("--version")
    assert proc.returncode == 0, proc.stderr
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert proc.stdout.startswith(f"edgellm {version} (") and "Python 3." in proc.stdout, proc.stdout
    assert "numba " in proc.stdout


def test_models_lists_the_catalog(smollm2_path) -> None:
    proc = edgellm("models")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:6] == ["NAME", "SIZE", "QUANT", "ARCH", "SOURCE", "PATH"]
    for name, entry in CATALOG.items():
        row = next(line for line in lines if line.startswith(name))
        assert entry.quant in row
    assert "(default)" in next(line for line in lines if line.startswith(DEFAULT_MODEL))


def test_unknown_model_is_a_clear_error_not_a_traceback() -> None:
    proc = edgellm("run", "no-such-model", "hi")
    assert proc.returncode == 1
    assert "no model named 'no-such-model'" in proc.stderr and "Traceback" not in proc.stderr
    with pytest.raises(ModelNotFoundError, match="smollm2-135m"):
        resolve_model("no-such-model")


def test_a_path_works_wherever_a_name_does(smollm2_path) -> None:
    assert resolve_model(str(smollm2_path)) == smollm2_path
    assert resolve_model("smollm2-135m") == smollm2_path


@pytest.mark.parametrize(
    "text,value",
    [("0", 0), ("1073741824", 2**30), ("512M", 512 * 2**20), ("2GiB", 2 * 2**30), ("0.25", 0.25)],
)
def test_kv_cache_memory_takes_bytes_or_a_fraction_of_ram(text: str, value: int | float) -> None:
    from edgellm.engine.config import kv_memory

    assert kv_memory(text) == value and type(kv_memory(text)) is type(value)


@pytest.mark.parametrize("text", ["", "lots", "1.5", "-0.5", "12X"])
def test_kv_cache_memory_refuses_what_is_neither(text: str) -> None:
    import argparse

    from edgellm.engine.config import kv_memory

    with pytest.raises(argparse.ArgumentTypeError, match="neither bytes"):
        kv_memory(text)



class _Captured(Exception):
    """Raised by the stand-ins below with the keyword arguments the command passed."""


def _capture(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    """A config passed (EngineConfig, or a ServerConfig holding one) counts as its fields' keywords."""
    import dataclasses

    configs = [v for v in (*args, *kwargs.values()) if dataclasses.is_dataclass(v)]
    while configs:
        config = configs.pop()
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            configs += [value] if dataclasses.is_dataclass(value) else []
            kwargs.setdefault(f.name, value)
    raise _Captured(kwargs)


@pytest.mark.parametrize("command", ["run", "serve", "bench", "chat", "python -m edgellm.server"])
@pytest.mark.parametrize("flags,want", [([], "f16"), (["--kv-cache-dtype", "q8_0"], "q8_0")])
def test_kv_cache_dtype_reaches_the_model(command: str, flags: list[str], want: str, monkeypatch) -> None:
    """--kv-cache-dtype of every command that loads a model arrives where the LLM is built (stand-ins for
    LLM / run_server / run_chat record the keyword arguments); chat passes only what was given."""
    import edgellm
    import edgellm.server
    import edgellm.server.__main__ as server_main
    import tui.app
    from edgellm.cli import commands as cli

    for mod, name in ((edgellm, "LLM"), (edgellm.server, "run_server")):  # server_main runs serve's
        monkeypatch.setattr(mod, name, _capture)
    monkeypatch.setattr(tui.app, "run_chat", _capture)
    argv = {"run": ["run", "m.gguf", "hi"], "serve": ["serve", "m.gguf"], "bench": ["bench", "m.gguf"]}
    with pytest.raises(_Captured) as got:
        if command.startswith("python"):
            server_main.main(["m.gguf", *flags])
        else:
            cli.main(argv.get(command, [command, "m.gguf"]) + flags)
    kwargs = got.value.args[0]
    if command == "chat" and not flags:
        assert "kv_cache_dtype" not in kwargs  # the LLM's default
    else:
        assert kwargs["kv_cache_dtype"] == want


def test_kv_cache_dtype_flag_refuses_unknown_types_and_url_chat(capsys) -> None:
    from edgellm.cli import commands as cli

    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "m.gguf", "hi", "--kv-cache-dtype", "q4_0"])
    err = capsys.readouterr().err
    assert "--kv-cache-dtype: invalid choice: 'q4_0'" in err and "f16" in err and "q8_0" in err
    assert cli.main(["chat", "--url", "http://127.0.0.1:1", "--kv-cache-dtype", "q8_0"]) == 2
    assert "apply to an in-process model" in capsys.readouterr().err
