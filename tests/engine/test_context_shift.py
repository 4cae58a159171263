"""Rolling window (SamplingParams.context_shift_keep, Scheduler.shift_context): a completion that fills the
context shifts out the oldest tokens after its kept head and goes on to max_tokens; the window is
re-prefilled, so each token after a shift is the one a fresh request with the kept window as its prompt
draws (greedy)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgellm import LLM, SamplingParams
from edgellm.testing.synthetic.models import write_tiny_model

N_CTX = 48
KEEP = 5
NO_SPECIALS = {0: -100, 1: -100, 2: -100}  # the tiny vocabulary's end-of-generation tokens kept out


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    path: Path = write_tiny_model(tmp_path_factory.mktemp("shift") / "tiny.gguf", "qwen3")
    with LLM(path, n_ctx=N_CTX, kv_cache_memory=1 << 22) as llm:
        yield llm


def test_a_rolling_window_generates_past_the_context(llm: LLM) -> None:
    prompt = llm.tokenizer.encode("the cat sat on the mat")
    assert KEEP < len(prompt) < N_CTX // 2
    params = SamplingParams(
        max_tokens=3 * N_CTX, temperature=0, logit_bias=NO_SPECIALS, context_shift_keep=KEEP
    )
    out = llm.generate([prompt], params)[0].outputs[0]
    assert len(out.token_ids) == 3 * N_CTX and out.finish_reason == "length"  # every requested token

    # The first shift: the context filled with the prompt and N_CTX - len(prompt) generated tokens; half
    # of those after the head went, and the next token continues the kept window.
    whole = prompt + out.token_ids
    k = N_CTX - len(prompt)
    n_discard = (N_CTX - KEEP) // 2
    window = whole[:KEEP] + whole[KEEP + n_discard : N_CTX]
    fresh = llm.generate([window], SamplingParams(max_tokens=1, temperature=0, logit_bias=NO_SPECIALS))
    assert fresh[0].outputs[0].token_ids == [out.token_ids[k]]

    plain = SamplingParams(max_tokens=3 * N_CTX, temperature=0, logit_bias=NO_SPECIALS)
    capped = llm.generate([prompt], plain)[0].outputs[0]  # without the window the context ends it
    assert len(capped.token_ids) == N_CTX - len(prompt) and capped.token_ids == out.token_ids[:k]
    assert capped.finish_reason == "length"
