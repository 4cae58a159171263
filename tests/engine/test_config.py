"""One configuration: EngineConfig / ServerConfig (edgellm/engine/config.py, edgellm/config.py) are the
flags of every command, `python -m edgellm.server` is `edgellm serve`'s parser, the bounds are checked in
one place naming the flag, and LLM's keywords build the same config as `LLM(config=...)`."""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import re
import subprocess
import sys

import pytest

from edgellm.cli import commands as cli
from edgellm.config import ServerConfig
from edgellm.engine.config import EngineConfig
from edgellm.engine.spec.config import SpeculativeConfig
from edgellm.server import __main__ as server_main
from edgellm.testing.limits import HANG_S


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _options(parser: argparse.ArgumentParser) -> dict[str, tuple]:
    return {
        s: (a.dest, a.default, a.nargs, a.choices, a.type, a.const)
        for a in parser._actions
        for s in a.option_strings
    }


def _help_flags(*command: str) -> set[str]:
    cmd = [sys.executable, "-m", *command, "--help"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", out.stdout))


def test_serve_and_python_m_edgellm_server_take_the_same_flags() -> None:
    serve, module = _help_flags("edgellm", "serve"), _help_flags("edgellm.server")
    assert serve == module
    # the flags that had drifted apart, and those of every mode of serve
    for flag in ("--max-num-seqs", "--max-body-bytes", "--models-dir", "--replicas", "--models", "--ctx"):
        assert flag in serve
    # the same parser: every option parses to the same field, default, arity, choices and type
    assert _options(_subparser("serve")) == _options(server_main.build_parser())
    argv = ["m.gguf", "--port", "9", "--max-num-seqs", "3", "--served-model-name", "a", "--seed", "5"]
    assert vars(_subparser("serve").parse_args(argv)) == vars(server_main.build_parser().parse_args(argv))


def test_every_command_that_loads_a_model_takes_every_engine_flag() -> None:
    engine = {f.metadata["flag"] for f in EngineConfig.cli_fields()}
    want = {"--ctx", "--threads", "--backend", "--max-num-seqs", "--kv-cache-dtype", "--speculative"}
    assert want <= engine
    for command in ("run", "chat", "serve", "bench"):
        assert engine <= set(_options(_subparser(command))), command


ENGINE_ARGV = [
    "--backend", "cuda", "--ctx", "2048", "--threads", "3", "--max-num-seqs", "4",
    "--kv-cache-memory", "2G", "--kv-cache-dtype", "q8_0", "--speculative", "ngram",
    "--num-speculative-tokens", "5",
]  # fmt: skip
ENGINE_WANT = EngineConfig(
    model="m.gguf",
    backend="cuda",
    n_ctx=2048,
    threads=3,
    max_num_seqs=4,
    kv_cache_memory=2 * 2**30,
    kv_cache_dtype="q8_0",
    speculative="ngram",
    num_speculative_tokens=5,
)


@pytest.mark.parametrize("command", ["run", "chat", "serve", "bench"])
def test_engine_config_round_trips_through_each_commands_flags(command: str) -> None:
    p = _subparser(command)
    head = ["m.gguf", "hi"] if command == "run" else ["m.gguf"]
    assert EngineConfig.from_cli_args(p.parse_args(head + ENGINE_ARGV)) == ENGINE_WANT
    # no flags: the dataclass's defaults (chat parses them as None, to tell what was given)
    assert EngineConfig.from_cli_args(p.parse_args(head)) == EngineConfig(model="m.gguf")


def test_server_config_round_trips_through_serve_flags() -> None:
    argv = ENGINE_ARGV + [
        "--host", "0.0.0.0", "--port", "9000", "--api-key", "k", "--max-queue", "7", "--max-body-bytes", "99",
        "--metrics-public", "--served-model-name", "a", "--served-model-name", "b", "--cors-origin", "*",
        "--reasoning-format", "none", "--reasoning-budget", "12", "--replicas", "auto",
        "--threads-per-replica", "2", "--temperature", "0.5", "--top-k", "-1",
    ]  # fmt: skip
    config = ServerConfig.from_cli_args(_subparser("serve").parse_args(["m.gguf", *argv]))
    want = ServerConfig(
        ENGINE_WANT,
        host="0.0.0.0",
        port=9000,
        api_key="k",
        max_queue=7,
        max_body_bytes=99,
        metrics_public=True,
        served_model_names=("a", "b"),
        cors_origins=("*",),
        reasoning_format="none",
        reasoning_budget=12,
        replicas="auto",
        threads_per_replica=2,
        sampling_defaults={"temperature": 0.5, "top_k": 0},
    )
    assert config == want
    assert ServerConfig.from_cli_args(_subparser("serve").parse_args([])) == ServerConfig()
    assert config.with_engine(threads=1).engine.threads == 1 and config.engine.threads == 3
    # what crosses to the engine core process, and to the Ray replicas
    assert pickle.loads(pickle.dumps(config)) == config


def _bounded() -> list[tuple[type, str, str | None, object]]:
    """(config class, field, flag, a value outside its bounds) for every bounded field of the tables."""
    out = []
    for cls in (EngineConfig, ServerConfig):
        for f in dataclasses.fields(cls):
            lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
            if lo is not None:
                out.append((cls, f.name, f.metadata.get("flag"), lo - 1))
            if hi is not None:
                out.append((cls, f.name, f.metadata.get("flag"), hi + 1))
    return out


@pytest.mark.parametrize(("cls", "name", "flag", "value"), _bounded())
def test_a_value_out_of_bounds_is_an_error_naming_its_flag(cls, name, flag, value, capsys) -> None:
    with pytest.raises(ValueError, match=re.escape(flag or name)) as e:
        cls(**{name: value})
    assert str(value) in str(e.value)
    if flag is not None:
        assert cli.main(["serve", "m.gguf", f"{flag}={value}"]) == 1  # before any model loads
        assert flag in capsys.readouterr().err


def test_bounds_cover_the_settings_that_had_their_own_checks() -> None:
    bounded = {(cls.__name__, name) for cls, name, _, _ in _bounded()}
    for name in ("max_num_seqs", "stream_interval", "kv_cache_memory", "n_ctx", "threads"):
        assert ("EngineConfig", name) in bounded
    for name in ("max_queue", "reasoning_budget", "port", "threads_per_replica"):
        assert ("ServerConfig", name) in bounded
    with pytest.raises(ValueError, match="--num-speculative-tokens needs --speculative"):
        EngineConfig(num_speculative_tokens=3)
    with pytest.raises(ValueError, match="neither a replica count"):
        ServerConfig(replicas=0)


def test_chat_with_url_refuses_every_engine_flag(capsys) -> None:
    for flag, value in (("--ctx", "64"), ("--threads", "1"), ("--max-num-seqs", "2"), ("--backend", "cpu")):
        assert cli.main(["chat", "--url", "http://127.0.0.1:1", flag, value]) == 2
        err = capsys.readouterr().err
        assert flag in err and "apply to an in-process model" in err


class _Started(Exception):
    pass


def test_llm_config_and_keywords_give_the_engine_the_same_settings(smollm2_path, monkeypatch) -> None:
    import edgellm.llm

    def no_core(spec, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - stands in for the process
        raise _Started(spec)

    monkeypatch.setattr(edgellm.llm, "CoreClient", no_core)
    kw = dict(n_ctx=256, threads=2, max_num_seqs=4, kv_cache_dtype="q8_0", kv_cache_memory=1 << 20)
    kw |= dict(speculative="ngram", num_speculative_tokens=3, stream_interval=0.25)
    specs = []
    for make in (
        lambda: edgellm.llm.LLM(smollm2_path, **kw),
        lambda: edgellm.llm.LLM(config=EngineConfig(model=smollm2_path, **kw)),
        lambda: edgellm.llm.LLM(smollm2_path, config=EngineConfig("no-such-model", **kw)),
        lambda: edgellm.llm.LLM(config=EngineConfig(smollm2_path, **{**kw, "n_ctx": 64}), n_ctx=256),
    ):
        with pytest.raises(_Started) as got:
            make()
        specs.append(got.value.args[0])
    assert all(s == specs[0] for s in specs)
    spec = specs[0]
    assert spec.model == str(smollm2_path) and (spec.n_ctx, spec.threads, spec.max_num_seqs) == (256, 2, 4)
    assert spec.speculative == SpeculativeConfig("ngram", num_tokens=3)
    assert pickle.loads(pickle.dumps(spec)) == spec  # it crosses to the core process
    with pytest.raises(TypeError, match="no_such_setting"):
        edgellm.llm.LLM(smollm2_path, no_such_setting=1)


def test_the_server_runs_its_engine_config(monkeypatch) -> None:
    """ServerState hands its EngineConfig to LLM as it is, and admits max_num_seqs + max_queue requests."""
    import edgellm.server.state as state_module
    from edgellm.server.http.errors import ApiError

    def no_llm(**kwargs):  # noqa: ANN003, ANN202 - stands in for loading the model
        raise _Started(kwargs)

    monkeypatch.setattr(state_module, "LLM", no_llm)
    config = ServerConfig(EngineConfig("m.gguf", n_ctx=64, max_num_seqs=3), max_queue=2)
    state = state_module.ServerState(config)
    with pytest.raises(_Started) as got:
        state.load()
    assert got.value.args[0]["config"] is config.engine
    release = state.admit(5)
    with pytest.raises(ApiError) as full:
        state.admit(1)
    assert full.value.status == 429 and "3 running + 2 queued" in full.value.message
    release()
    state.admit(5)


def test_serve_models_passes_the_engine_flags_to_each_models_server(monkeypatch) -> None:
    """`serve --models` hands its flags on to every model's `edgellm serve`, whose parser takes them."""
    import edgellm.server.multi.run as multi_run

    def no_router(config, models, child, presets):  # noqa: ANN001, ANN202
        raise _Started(models, child)

    monkeypatch.setattr(multi_run, "run_multi_server", no_router)
    argv = ["serve", "--models", "a,b", "--ctx", "64", "--threads", "1", "--max-num-seqs", "3"]
    argv += ["--top-k", "5", "--max-body-bytes", "1000", "--metrics-public", "--reasoning-budget", "7"]
    argv += ["--api-key", "secret", "--port", "9", "--keep-alive", "60", "--cors-origin", "http://x.example"]
    with pytest.raises(_Started) as got:
        cli.main(argv)
    models, child = got.value.args
    assert models == ["a", "b"]
    for flag in ("--ctx=64", "--threads=1", "--max-num-seqs=3", "--top-k=5", "--max-body-bytes=1000"):
        assert flag in child
    # the router's own flags stay with it; the key goes through the environment (server/multi/router.py)
    assert not [f for f in child if f.startswith(("--api-key", "--port", "--keep-alive", "--cors"))]
    config = ServerConfig.from_cli_args(_subparser("serve").parse_args(["a", *child]))
    assert (config.engine.n_ctx, config.engine.threads, config.engine.max_num_seqs) == (64, 1, 3)
    assert config.sampling_defaults == {"top_k": 5}
    assert (config.max_body_bytes, config.metrics_public, config.reasoning_budget) == (1000, True, 7)
