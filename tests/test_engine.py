"""The serving engine on the real default model: batching, chunked prefill, prefix caching, preemption,
abort, parallel sampling — every output compared with the same request run alone."""

from __future__ import annotations

import pytest

from edgellm import LLM, SamplingParams
from edgellm.engine.llm_engine import PromptTooLongError

PROMPTS = [
    "The capital of France is",
    "def add(a, b):\n    return",
    "My favourite fruit is",
    "1, 2, 3,",
    "Once upon a time",
    "The sky is blue because",
]
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
    before = llm.engine.stats()
    [out] = llm.generate([second], GREEDY)
    after = llm.engine.stats()
    assert out.token_ids == ref
    n_prompt = out.metrics.num_prompt_tokens
    cached = out.metrics.num_cached_tokens
    block = llm.engine.scheduler.config.block_size
    shared_tokens = len(llm.tokenize(shared))
    assert cached >= (shared_tokens // block - 1) * block and cached < n_prompt
    assert after.cached_tokens_total - before.cached_tokens_total == cached
    assert after.prefix_cache_hit_rate > 0


def test_preemption_under_tiny_kv_budget_completes_every_request(alone) -> None:
    # 64-token context, 5 blocks of 16 tokens: six requests of ~20 tokens cannot all hold their blocks.
    tiny = LLM("smollm2-135m", n_ctx=64, kv_cache_memory=1, max_num_seqs=6)
    assert tiny.engine.scheduler.config.num_blocks == 5
    outs = tiny.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == alone
    assert tiny.engine.stats().num_preemptions > 0
    assert tiny.engine.scheduler.block_manager.num_free_blocks == 5


def test_abort_frees_all_blocks(llm) -> None:
    eng = llm.engine
    bm = eng.scheduler.block_manager
    free0 = bm.num_free_blocks
    rids = [eng.add_request(p, SamplingParams(max_tokens=50, ignore_eos=True)) for p in PROMPTS]
    for _ in range(3):
        eng.step()
    assert bm.num_free_blocks < free0
    for rid in rids:
        out = eng.abort(rid)
        assert out is not None and out.finished and all(d.finish_reason == "abort" for d in out.deltas)
    assert bm.num_free_blocks == free0 and not eng.has_unfinished()
    assert eng.stats().num_running == 0 and eng.stats().kv_blocks_used == 0


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
    bm = small.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks


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
    assert not llm.engine.has_unfinished()
    assert llm.generate([PROMPTS[0]], GREEDY)[0].token_ids


@pytest.mark.parametrize("driver", ["thread", "loop"])
def test_streaming_engines_match_generate_and_abort_on_early_exit(llm, alone, driver) -> None:
    """AsyncLLMEngine (own thread) and LoopLLMEngine (steps on the caller's event loop): the streamed
    deltas are the same tokens as LLM.generate, and leaving a stream early frees its KV blocks."""
    import asyncio

    from edgellm.engine.async_engine import AsyncLLMEngine, LoopLLMEngine

    bm = llm.engine.scheduler.block_manager
    free0 = bm.num_free_blocks

    async def main() -> tuple[list[list[int]], int]:
        ae = AsyncLLMEngine(llm.engine) if driver == "thread" else LoopLLMEngine(llm.engine)

        async def one(prompt: str) -> list[int]:
            ids: list[int] = []
            async for out in ae.generate(prompt, GREEDY):
                for d in out.deltas:
                    ids.extend(d.token_ids)
            return ids

        try:
            streamed = await asyncio.gather(*[one(p) for p in PROMPTS[:3]])
            agen = ae.generate(PROMPTS[0], SamplingParams(max_tokens=200, ignore_eos=True))
            await agen.__anext__()
            await agen.aclose()  # a client that goes away after the first token
            for _ in range(100):  # the abort reaches the engine thread asynchronously
                if not llm.engine.has_unfinished():
                    break
                await asyncio.sleep(0.02)
            return streamed, bm.num_free_blocks
        finally:
            ae.shutdown()

    streamed, free_after = asyncio.run(main())
    assert streamed == alone[:3]
    assert free_after == free0 and not llm.engine.has_unfinished()
