"""The serving engine on the real default model: batching, chunked prefill, prefix caching, preemption,
abort, parallel sampling — every output compared with the same request run alone."""

from __future__ import annotations

import pytest

from edgellm import LLM, SamplingParams
from edgellm.engine.engine_core import PromptTooLongError
from edgellm.testing.engine_fakes import PROMPTS, wait_idle
from edgellm.testing.limits import HANG_S

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("smollm2-135m", n_ctx=512)


@pytest.fixture(scope="module")
def alone(llm) -> list[list[int]]:
    """Each prompt's greedy tokens when it runs by itself."""
    return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


def test_batched_greedy_equals_one_at_a_time(llm, alone) -> None:
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == alone
    assert all(o.finish_reason == "length" and len(o.token_ids) == 12 for o in outs)


def test_output_independent_of_prefill_chunk_size(alone) -> None:
    small = LLM("smollm2-135m", n_ctx=512, max_num_batched_tokens=4, max_num_seqs=4)
    outs = small.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == alone


def test_prefix_cache_hit_is_identical_and_computes_only_the_suffix(llm) -> None:
    shared = "You are a careful assistant. Answer briefly and precisely. " * 6
    first, second = shared + "What is the capital of Italy?", shared + "Name a large ocean."
    no_cache = LLM("smollm2-135m", n_ctx=512, enable_prefix_caching=False)
    ref = no_cache.generate([second], GREEDY)[0].token_ids
    llm.generate([first], GREEDY)
    before = llm.stats()
    [out] = llm.generate([second], GREEDY)
    after = llm.stats()
    assert out.token_ids == ref
    n_prompt = out.metrics.num_prompt_tokens
    cached = out.metrics.num_cached_tokens
    block = llm.block_size
    shared_tokens = len(llm.tokenize(shared))
    assert cached >= (shared_tokens // block - 1) * block and cached < n_prompt
    assert after.cached_tokens_total - before.cached_tokens_total == cached
    assert after.prefix_cache_hit_rate > 0


def test_preemption_under_tiny_kv_budget_completes_every_request(alone) -> None:
    # 64-token context, 5 blocks of 16 tokens: six requests of ~20 tokens cannot all hold their blocks.
    tiny = LLM("smollm2-135m", n_ctx=64, kv_cache_memory=1, max_num_seqs=6)
    assert tiny.num_kv_blocks == 5
    outs = tiny.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == alone
    stats = tiny.stats()  # as of the step that finished the last request
    assert stats.num_preemptions > 0
    assert stats.kv_blocks_used == 0 and stats.num_running == 0
    tiny.shutdown()


def test_abort_frees_all_blocks(llm) -> None:
    import queue

    got: queue.Queue = queue.Queue()
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    rids = [llm.submit(p, params, got.put)[0] for p in PROMPTS]
    for _ in range(3 * len(PROMPTS)):  # a few steps' outputs
        out = got.get(timeout=HANG_S)
        assert not isinstance(out, BaseException) and not out.finished
    assert llm.stats().kv_blocks_used > 0
    for rid in rids:
        llm.abort(rid)
    wait_idle(llm)


def test_parallel_sampling_forks_and_seed_reproduces(llm) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=16, n=3, seed=1234, ignore_eos=True)
    a = llm.generate(["Tell me a story about a dragon."], params)[0]
    b = llm.generate(["Tell me a story about a dragon."], params)[0]
    assert len(a.outputs) == 3 and all(len(c.token_ids) == 16 for c in a.outputs)
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]  # same seed, same texts
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1  # the completions are distinct samples
    greedy = llm.generate(["Tell me a story"], SamplingParams(temperature=0, max_tokens=8, n=2))[0]
    assert greedy.outputs[0].token_ids == greedy.outputs[1].token_ids


def test_parallel_sampling_when_the_running_set_is_full() -> None:
    # Two n=2 requests with room for two sequences: the children cannot join the running set at their
    # parents' first token and must wait their turn instead of failing the engine.
    small = LLM("smollm2-135m", n_ctx=256, max_num_seqs=2)
    params = SamplingParams(temperature=0.8, max_tokens=4, n=2, seed=7, ignore_eos=True)
    outs = small.generate(["Hello", "Once upon a time"], params)
    assert [[len(c.token_ids) for c in o.outputs] for o in outs] == [[4, 4], [4, 4]]
    greedy = SamplingParams(temperature=0, max_tokens=6, n=2, ignore_eos=True)
    both = small.generate(["Hello", "Once upon a time"], greedy)
    for o in both:
        alone = small.generate([o.prompt_token_ids], greedy)[0].token_ids
        assert o.outputs[0].token_ids == o.outputs[1].token_ids == alone
    wait_idle(small)


def test_stop_strings_eos_and_length(llm) -> None:
    [full] = llm.generate(["1, 2, 3,"], SamplingParams(temperature=0, max_tokens=20))
    assert ", 6" in full.text
    [stopped] = llm.generate(["1, 2, 3,"], SamplingParams(temperature=0, max_tokens=20, stop=[", 6"]))
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.index(", 6")]
    chat = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    [eos] = llm.generate([chat], SamplingParams(temperature=0, max_tokens=64))
    assert eos.finish_reason == "stop" and eos.token_ids[-1] in llm.tokenizer.eog_ids
    assert "<|im_end|>" not in eos.text


def test_bad_requests_are_rejected_with_clear_errors(llm) -> None:
    with pytest.raises(PromptTooLongError, match="512"):
        llm.generate([[100] * 600], GREEDY)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[10**7]], GREEDY)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    # the engine is still usable afterwards, and nothing was left queued
    wait_idle(llm)
    assert llm.generate([PROMPTS[0]], GREEDY)[0].token_ids


def test_streams_match_generate_and_abort_on_early_exit(llm, alone) -> None:
    """LLM.stream from an event loop: the streamed deltas are the same tokens as LLM.generate, and leaving
    a stream early frees its KV blocks."""
    import asyncio

    async def main() -> list[list[int]]:
        async def one(prompt: str) -> list[int]:
            ids: list[int] = []
            async for out in llm.stream(prompt, GREEDY):
                for d in out.deltas:
                    ids.extend(d.token_ids)
            return ids

        streamed = await asyncio.gather(*[one(p) for p in PROMPTS[:3]])
        agen = llm.stream(PROMPTS[0], SamplingParams(max_tokens=200, ignore_eos=True))
        await agen.__anext__()
        await agen.aclose()  # a client that goes away after the first token
        return streamed

    assert asyncio.run(main()) == alone[:3]
    wait_idle(llm)


def test_q8_0_kv_cache_batched_chunked_and_prefix_hit_equal_alone(llm) -> None:
    """With a q8_0 KV cache: batched equals alone (prompts prefilled in 16-token chunks next to decodes),
    a prefix-cache hit equals the miss, the cache holds ~1.9x the tokens of f16 in the same budget, and a
    dtype the cache does not have is refused before a core starts."""
    budget = 16 << 20  # more than one context (the floor), so the budget sets the block count
    q8 = LLM(
        "smollm2-135m", n_ctx=512, kv_cache_dtype="q8_0", kv_cache_memory=budget, max_num_batched_tokens=16
    )
    shared = "Rules: answer in one word, never explain, and stay polite at all times. " * 3
    prompts = [*PROMPTS[:3], shared + "Name a colour."]
    alone_q8 = [q8.generate([p], GREEDY)[0].token_ids for p in prompts]  # the last one is a prefix miss
    assert [o.token_ids for o in q8.generate(prompts[:3], GREEDY)] == alone_q8[:3]
    [hit] = q8.generate([prompts[-1]], GREEDY)
    assert hit.metrics.num_cached_tokens >= 32 and hit.token_ids == alone_q8[-1]
    # SmolLM2: 30 layers x 3 KV heads x (64 + 64) values: 34 bytes per 32 values instead of 64
    assert (q8.kv_cache_dtype, q8.kv_bytes_per_token) == ("q8_0", 30 * 3 * 2 * 2 * 34)
    assert q8.kv_bytes_per_token * 64 == llm.kv_bytes_per_token * 34
    assert q8.num_kv_blocks == budget // (q8.kv_bytes_per_token * q8.block_size)
    q8.shutdown()
    with pytest.raises(ValueError, match=r"unknown KV cache dtype 'q4_0' \(supported: f16, q8_0\)"):
        LLM("smollm2-135m", kv_cache_dtype="q4_0")


def test_q8_0_kv_cache_refuses_head_sizes_it_cannot_block(tmp_path) -> None:
    """q8_0 blocks are 32 values along the head: a 16-wide head is refused by name, before a core starts
    (and by the backend itself)."""
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.testing.synthetic.models import write_tiny_model

    path = write_tiny_model(tmp_path / "head16.gguf", "llama", head_dim=16)
    with pytest.raises(ValueError, match="q8_0 stores blocks of 32 values .* head_dim is 16"):
        LLM(path, kv_cache_dtype="q8_0")
    with pytest.raises(ValueError, match="head_dim_v is 48"):
        CpuBackend().alloc_kv(1, 2, 16, 1, 64, 48, "q8_0")
