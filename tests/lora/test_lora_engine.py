"""LoRA adapters in the engine: requests with different adapters (or none) batched in one step each get
their solo result; the prefix cache never shares KV across adapter sets; the row-grouped update equals
the dense one; adapters that do not fit the base are refused naming the mismatch."""

from __future__ import annotations

import numpy as np
import pytest

from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.lora.adapter import LoraError, load_adapter
from edgellm.lora.apply import round_input, step_for_batch
from edgellm.testing.lora_cases import run_greedy, tiny_engine, write_lora_files
from edgellm.testing.synthetic.lora import write_tiny_lora
from edgellm.testing.synthetic.models import write_tiny_model


@pytest.fixture(scope="module")
def files(tmp_path_factory):  # noqa: ANN001, ANN201
    return write_lora_files(tmp_path_factory.mktemp("lora"))


CHOICES = {"a1": {0: 1.0}, "a2": {0: 1.0}, "b1": {1: 0.5}, "b2": {1: 0.5}, "n1": {}, "n2": None}


def _prompts() -> dict[str, list[int]]:
    rng = np.random.default_rng(5)
    return {rid: rng.integers(1, 250, 12 + 3 * i).tolist() for i, rid in enumerate(CHOICES)}


def test_six_requests_in_flight_each_match_their_solo_run(files) -> None:  # noqa: ANN001
    base, adapters = files
    prompts = _prompts()
    together = run_greedy(tiny_engine(base, adapters), prompts, CHOICES)
    for rid in prompts:
        solo = run_greedy(tiny_engine(base, adapters), {rid: prompts[rid]}, {rid: CHOICES[rid]})
        assert together[rid] == solo[rid], rid
    # the adapters matter: the same prompt under A, B and none continues differently
    same = {rid: prompts["a1"] for rid in ("a1", "b1", "n1")}
    outs = run_greedy(tiny_engine(base, adapters), same, CHOICES)
    assert len({tuple(v) for v in outs.values()}) == 3, outs


def test_global_scales_apply_when_a_request_names_none(files) -> None:  # noqa: ANN001
    base, adapters = files
    prompt = _prompts()["a1"]
    named = run_greedy(tiny_engine(base, adapters), {"r": prompt}, {"r": {0: 1.0}})
    by_global = run_greedy(tiny_engine(base, adapters, [1.0, 0.0]), {"r": prompt}, {"r": None})
    listed_empty = run_greedy(tiny_engine(base, adapters, [1.0, 0.0]), {"r": prompt}, {"r": {}})
    base_only = run_greedy(tiny_engine(base, adapters), {"r": prompt}, {"r": {}})
    assert by_global == named
    assert listed_empty == base_only != named  # a list that leaves an adapter out has it at 0


def test_unknown_adapter_id_is_refused(files) -> None:  # noqa: ANN001
    from edgellm.sampling.sampler import SamplingParams

    engine = tiny_engine(*files)
    with pytest.raises(ValueError, match="unknown LoRA adapter id 2"):
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, lora=[{"id": 2, "scale": 1.0}]))
    with pytest.raises(ValueError, match="unknown LoRA adapter id 7"):
        engine.set_lora_scales({7: 1.0})


def test_prefix_cache_is_keyed_by_the_adapter_set(files) -> None:  # noqa: ANN001
    base, adapters = files
    engine = tiny_engine(base, adapters)
    prompt = list(range(3, 3 + 40))  # two full blocks and a part
    first = run_greedy(engine, {"x": prompt}, {"x": {0: 1.0}})
    hits = {}

    def run(rid: str, choice: dict | None) -> list[int]:
        from edgellm.sampling.sampler import SamplingParams

        engine.add_request(
            prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, lora=choice), rid
        )
        toks = []
        while engine.has_unfinished():
            for o in engine.step():
                toks += o.new_token_ids
                hits[rid] = o.num_cached_tokens if o.first else hits.get(rid, 0)
        return toks

    assert run("same", {0: 1.0}) == first["x"] and hits["same"] == 32  # the same set: the blocks are reused
    other = run("none", {})
    assert hits["none"] == 0  # another set (here: none) computes its own KV
    assert other == run_greedy(tiny_engine(base, adapters), {"n": prompt}, {"n": {}})["n"]
    run("half", {0: 0.5})
    assert hits["half"] == 0  # another scale is another set


def test_grouped_update_equals_dense_reference(files) -> None:  # noqa: ANN001
    base, adapters = files
    g = load_gguf(str(base))
    cfg = config_from_gguf(g)
    loaded = [load_adapter(p, g, cfg) for p in adapters]
    rng = np.random.default_rng(0)
    choices, counts = [((0, 1.0),), (), ((1, 0.5),), ((0, 2.0), (1, -1.0))], [3, 2, 4, 1]
    T, n_in = sum(counts), cfg.n_embd
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    step = step_for_batch(loaded, choices, counts, np.array([2, 4, 8, 9], np.int32))
    slot = (1, "wqkv")
    out = np.zeros((T, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim), np.float32)
    step.add(slot, x, out)
    want = np.zeros_like(out)
    row = 0
    for choice, n in zip(choices, counts, strict=True):
        for k, s in choice:
            for p in loaded[k].parts.get(slot, []):
                # llama.cpp rounds each product's input to what the A / B types' dot products take
                ax = round_input(round_input(x[row : row + n], p.a_dot) @ p.a.T, p.b_dot)
                want[row : row + n, p.col0 : p.col0 + p.b.shape[0]] += s * p.factor * (ax @ p.b.T)
        row += n
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert {p.a_dot for p in loaded[0].parts[slot]} == {"f16"} and {
        p.a_dot for p in loaded[1].parts[slot]
    } == {"q8_0"}
    assert np.abs(want[3:5]).max() == 0 and np.abs(want).max() > 0.1  # the rows without an adapter untouched
    assert step_for_batch(loaded, [(), ()], [2, 3], np.array([4], np.int32)) is None  # no LoRA: no work


def test_scale_is_alpha_over_rank_times_the_users(files) -> None:  # noqa: ANN001
    base, adapters = files
    g = load_gguf(str(base))
    cfg = config_from_gguf(g)
    a = load_adapter(adapters[0], g, cfg)  # alpha 8, rank 4
    assert {p.factor for ps in a.parts.values() for p in ps} == {2.0}
    no_alpha = write_tiny_lora(base.parent / "no_alpha.gguf", base, rank=4, alpha=None)
    assert {p.factor for ps in load_adapter(no_alpha, g, cfg).parts.values() for p in ps} == {1.0}


@pytest.mark.parametrize(
    ("writer", "message"),
    [
        (dict(shape_overrides={"blk.0.attn_q.weight.lora_a": (4, 32)}), r"blk.0.attn_q.weight.*do not fit"),
        (
            dict(shape_overrides={"blk.1.ffn_down.weight.lora_b": (32, 4)}),
            r"blk.1.ffn_down.weight.*do not fit",
        ),
        (dict(shape_overrides={"blk.0.attn_v.weight.lora_b": (32, 3)}), r"blk.0.attn_v.weight.*rank"),
        (dict(arch="qwen2"), r"architecture 'qwen2'.*'llama'"),
        (dict(metadata_overrides={"general.type": "model"}), r"general.type is 'model'"),
        (dict(metadata_overrides={"adapter.type": "ia3"}), r"only 'lora'"),
        (dict(extra_tensors={"blk.7.attn_q.weight.lora_a": np.zeros((4, 64))}), r"missing one of"),
        (dict(qtype_a="Q4_0"), r"is Q4_0; LoRA tensors must be one of"),
        (
            dict(
                extra_tensors={
                    "token_embd.weight.lora_a": np.zeros((4, 64)),
                    "token_embd.weight.lora_b": np.zeros((288, 4)),
                }
            ),
            r"LoRA on 'token_embd.weight' is not supported",
        ),
        (dict(metadata_overrides={"adapter.alora.invocation_tokens": "x"}), r"activated LoRA"),
        (dict(extra_tensors={"blk.0.attn_q.weight.lora_c": np.zeros((4, 64))}), r"unexpected suffix"),
    ],
)
def test_adapter_that_does_not_fit_is_refused(files, tmp_path, writer: dict, message: str) -> None:  # noqa: ANN001
    base, _ = files
    bad = write_tiny_lora(tmp_path / "bad.gguf", base, rank=4, **writer)
    g = load_gguf(str(base))
    with pytest.raises(LoraError, match=message):
        load_adapter(bad, g, config_from_gguf(g))


def test_lora_config_parses_both_forms() -> None:
    from edgellm.engine.config import EngineConfig

    assert EngineConfig(lora=["a.gguf", ("b.gguf", "0.5")]).lora == (("a.gguf", 1.0), ("b.gguf", 0.5))
    with pytest.raises(ValueError, match="LoRA scale must be a number"):
        EngineConfig(lora=[("b.gguf", "half")])


def test_adapter_for_a_wider_base_is_refused(files, tmp_path) -> None:  # noqa: ANN001
    base, _ = files
    wide = write_tiny_model(tmp_path / "wide.gguf", "llama", "F32", n_embd=128, n_ff=256)
    bad = write_tiny_lora(tmp_path / "wide_lora.gguf", wide, rank=4)
    g = load_gguf(str(base))
    with pytest.raises(LoraError, match=r"blk.0.attn_k.weight.*\(32, 64\).*wrong base"):
        load_adapter(bad, g, config_from_gguf(g))


def test_new_global_scales_never_change_a_running_request(files) -> None:  # noqa: ANN001
    from edgellm.sampling.sampler import SamplingParams

    base, adapters = files
    prompt = _prompts()["b1"]
    engine = tiny_engine(base, adapters, [1.0, 0.0])
    greedy = dict(max_tokens=8, temperature=0.0, ignore_eos=True)
    engine.add_request(prompt, SamplingParams(**greedy), "before")  # admitted under A at 1
    out: dict[str, list[int]] = {"before": [], "after": []}
    for _ in range(3):
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
    engine.set_lora_scales({})  # every adapter at 0 from now on
    engine.add_request(prompt, SamplingParams(**greedy), "after")
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
    solo = run_greedy(tiny_engine(base, adapters), {"a": prompt, "n": prompt}, {"a": {0: 1.0}, "n": {}})
    assert out["before"] == solo["a"] and out["after"] == solo["n"] and solo["a"] != solo["n"]


def test_layers_no_adapter_touches_keep_the_fused_layer(files, tmp_path) -> None:  # noqa: ANN001
    base, adapters = files
    one_layer = write_tiny_lora(tmp_path / "layer1.gguf", base, rank=4, layers=[1], seed=7)
    g = load_gguf(str(base))
    cfg = config_from_gguf(g)
    loaded = [load_adapter(p, g, cfg) for p in (*adapters, one_layer)]
    step = step_for_batch(loaded, [((2, 1.0),), ()], [2, 1], np.array([1, 2], np.int32))
    assert step.layers == {1} and not step.touches(0)
    both = step_for_batch(loaded, [((2, 1.0),), ((0, 1.0),)], [2, 1], np.array([1, 2], np.int32))
    assert both.layers == {0, 1}
    # and the tokens of a request on the one-layer adapter are its solo ones beside others
    engine = tiny_engine(base, [*adapters, one_layer])
    prompts = {"l1": _prompts()["a1"], "n": _prompts()["n1"], "a": _prompts()["a2"]}
    choices = {"l1": {2: 1.0}, "n": {}, "a": {0: 1.0}}
    together = run_greedy(engine, prompts, choices)
    for rid in prompts:
        assert (
            together[rid]
            == run_greedy(
                tiny_engine(base, [*adapters, one_layer]), {rid: prompts[rid]}, {rid: choices[rid]}
            )[rid]
        )


def test_parallel_completions_keep_the_parents_adapter(files) -> None:  # noqa: ANN001
    from edgellm.sampling.sampler import SamplingParams

    base, adapters = files
    prompt = _prompts()["b2"]
    engine = tiny_engine(base, adapters)
    engine.add_request(
        prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, n=3, lora={1: 0.5}), "r"
    )
    out: dict[int, list[int]] = {0: [], 1: [], 2: []}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.index] += o.new_token_ids
    solo = run_greedy(tiny_engine(base, adapters), {"b": prompt, "n": prompt}, {"b": {1: 0.5}, "n": {}})
    assert out[0] == out[1] == out[2] == solo["b"] != solo["n"]


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_base_rows_in_a_lora_step_are_bit_identical_to_a_step_without(tmp_path, arch: str) -> None:  # noqa: ANN001
    """A Q8_0 base, whose layers the CPU runs as one call: a step with an adapter runs them kernel by kernel,
    and the rows without one come out bit for bit as without LoRA."""
    from edgellm.engine.model_runner import RunItem

    base = write_tiny_model(tmp_path / "q8.gguf", arch, "Q8_0", n_layers=3)
    adapter = write_tiny_lora(tmp_path / "q8_lora.gguf", base, rank=4, seed=3)
    runner = tiny_engine(base, [adapter]).runner
    assert all(f is not None for f in runner.model.fused)  # the one-call layers exist for this file
    toks = list(range(5, 25))
    solo = runner.run([RunItem([0, 1], toks, 0)])[0]
    base_row, adapted = runner.run([RunItem([2, 3], toks, 0), RunItem([4, 5], toks, 0, lora=((0, 1.0),))])
    assert np.array_equal(solo, base_row) and np.abs(adapted - solo).max() > 0.1


def test_architecture_with_its_own_layer_loop_is_refused(tmp_path) -> None:  # noqa: ANN001
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend

    base = write_tiny_model(tmp_path / "lfm2.gguf", "lfm2", "F32")
    adapter = write_tiny_lora(tmp_path / "lfm2_lora.gguf", base, rank=4, roles=("ffn_up", "ffn_down"))
    g = load_gguf(str(base))
    cfg = config_from_gguf(g)
    model = ARCHITECTURES[cfg.arch](cfg, g, CpuBackend())
    with pytest.raises(LoraError, match="not supported for lfm2 models"):
        load_adapter(adapter, g, cfg, model)
