"""LoRA through the Python API and `edgellm run`: LLM(base, lora=[...]) with a per-request choice in
SamplingParams gives the in-process engine's tokens; an adapter for another base is refused at start."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgellm import LLM, SamplingParams
from edgellm.testing.limits import HANG_S
from edgellm.testing.lora_cases import run_greedy, tiny_engine, write_lora_files
from edgellm.testing.paths import ROOT
from edgellm.testing.synthetic.lora import write_tiny_lora
from edgellm.testing.synthetic.models import write_tiny_model

PROMPT = list(range(5, 25))


@pytest.fixture(scope="module")
def files(tmp_path_factory):  # noqa: ANN001, ANN201
    return write_lora_files(tmp_path_factory.mktemp("lora"))


def test_llm_applies_the_adapter_each_request_names(files) -> None:  # noqa: ANN001
    base, adapters = files
    greedy = dict(max_tokens=8, temperature=0.0, ignore_eos=True)
    with LLM(base, lora=[adapters[0], (adapters[1], 0.5)], n_ctx=256, threads=1) as llm:
        assert [(e["id"], e["scale"]) for e in llm.lora_adapters()] == [(0, 1.0), (1, 0.5)]
        only_a = llm.generate([PROMPT], SamplingParams(**greedy, lora={0: 1.0}))[0].token_ids
        none = llm.generate([PROMPT], SamplingParams(**greedy, lora={}))[0].token_ids
        default = llm.generate([PROMPT], SamplingParams(**greedy))[0].token_ids  # A at 1, B at 0.5
        both = llm.generate(
            [PROMPT], SamplingParams(**greedy, lora=[{"id": 0, "scale": 1}, {"id": 1, "scale": 0.5}])
        )
        with pytest.raises(ValueError, match="unknown LoRA adapter id 3"):
            llm.generate([PROMPT], SamplingParams(**greedy, lora={3: 1.0}))
        llm.set_lora_scales({1: 0.5})
        b_global = llm.generate([PROMPT], SamplingParams(**greedy))[0].token_ids
        # one more adapter while running (A's file again, as id 2 at global scale 0)
        assert llm.load_lora(adapters[0], 0.0) == 2 and llm.lora_adapters()[2]["scale"] == 0.0
        as_id2 = llm.generate([PROMPT], SamplingParams(**greedy, lora={2: 1.0}))[0].token_ids
        assert llm.generate([PROMPT], SamplingParams(**greedy))[0].token_ids == b_global  # still B alone
        with pytest.raises(Exception, match="general.type is 'model'"):
            llm.load_lora(base)
    engine = tiny_engine(base, adapters)
    want = run_greedy(engine, {"a": PROMPT, "n": PROMPT, "ab": PROMPT, "b": PROMPT},
                      {"a": {0: 1.0}, "n": {}, "ab": {0: 1.0, 1: 0.5}, "b": {1: 0.5}})  # fmt: skip
    assert only_a == want["a"] and none == want["n"] and default == want["ab"] == both[0].token_ids
    assert b_global == want["b"] and as_id2 == only_a
    assert len({tuple(v) for v in want.values()}) == 4


def test_adapter_for_another_base_is_refused_at_start(files, tmp_path) -> None:  # noqa: ANN001
    base, _ = files
    other = write_tiny_model(tmp_path / "qwen.gguf", "qwen2", "F32")
    wrong = write_tiny_lora(tmp_path / "qwen_lora.gguf", other, rank=4)
    with pytest.raises(Exception, match=r"adapter for architecture 'qwen2', but the base model is 'llama'"):
        LLM(base, lora=[wrong], n_ctx=256, threads=1)


def test_run_command_takes_lora(files) -> None:  # noqa: ANN001
    base, adapters = files
    cmd = [sys.executable, "-m", "edgellm", "run", str(base), "hello", "--max-tokens", "6",
           "--temperature", "0", "--threads", "1", "--ctx", "256"]  # fmt: skip
    plain = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=HANG_S)
    adapted = subprocess.run([*cmd, "--lora", str(adapters[0])], capture_output=True, text=True, cwd=ROOT,
                             timeout=HANG_S)  # fmt: skip
    assert plain.returncode == 0 and adapted.returncode == 0, (plain.stderr, adapted.stderr)
    assert plain.stdout != adapted.stdout  # the adapter changed the greedy continuation
    bad = subprocess.run(
        [*cmd, "--lora", str(base)], capture_output=True, text=True, cwd=ROOT, timeout=HANG_S
    )
    assert bad.returncode != 0 and "general.type is 'model', not 'adapter'" in bad.stderr


def test_serve_flags_take_both_lora_scaled_forms() -> None:
    from edgellm.cli.commands import build_parser
    from edgellm.config import ServerConfig

    p = build_parser()
    args = [
        "serve",
        "base.gguf",
        "--lora",
        "a.gguf",
        "--lora-scaled",
        "b.gguf",
        "0.5",
        "--lora-scaled",
        "c.gguf:0.25",
    ]
    assert ServerConfig.from_cli_args(p.parse_args(args)).engine.lora == (
        ("a.gguf", 1.0),
        ("b.gguf", 0.5),
        ("c.gguf", 0.25),
    )
    with pytest.raises(SystemExit):
        p.parse_args(["serve", "base.gguf", "--lora-scaled", "b.gguf", "lots"])
