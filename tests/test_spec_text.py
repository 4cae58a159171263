"""Speculative decoding is lossless for the text too: when a request ends inside a verify step's accepted
drafts (an end-of-generation id, a stop token id, max_tokens or a stop string among them), every token's
text up to the end reaches the caller and nothing after it does, exactly as when the same tokens come one
per step. Checked on the front-end's request stream directly, through `LLM` (in-process, 50+ prompts) and
through the server (a few prompts; EDGELLM_SPEC_SOAK=1 adds 60 prompts under 32 concurrent streams with
disconnects, tests/test_spec_soak.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from edgellm import LLM
from edgellm.chat_template import prompt_token_ids, render_chat
from edgellm.engine.frontend import RequestStream
from edgellm.engine.outputs import RequestOutput
from edgellm.gguf.reader import load_gguf
from edgellm.gguf.validation import tokenizer_from_gguf
from edgellm.sampling import SamplingParams
from edgellm.tokenizer import Tokenizer

NAMES = ["Ann", "Bob", "Cleo", "Dag", "Eva", "Finn", "Greta", "Hugo", "Ida", "Jon", "Kari", "Lars", "Mia"]
CITIES = ["Oslo", "Bergen", "Paris", "Rome", "Lima", "Cairo", "Tokyo"]


def cases(count: int) -> list[tuple[str, dict[str, Any]]]:
    """(user message, sampling options): "repeat this" requests, whose replies copy the prompt (n-gram
    drafts get accepted), ending on an end-of-generation id, max_tokens inside the reply, a stop string
    from the reply, or a stop token id from it, in turn. The last two are chosen by text here and made
    token ids by `params`."""
    out = []
    for i in range(count):
        name, city, age = NAMES[i % len(NAMES)], CITIES[i % len(CITIES)], 20 + i
        item = [
            f'{{"name": "{name}", "age": {age}, "city": "{city}"}}',
            f"SELECT id, name FROM users WHERE age > {age} ORDER BY name;",
            f"def area_{name.lower()}(width, height):\n    return width * height + {age}",
            f"name,age,city\n{name},{age},{city}",
        ][i % 4]
        if i % 3 == 0:  # the two-line message: JSON, then SQL
            item += f"\nSELECT id FROM users WHERE city = '{city}';"
        message = f"Repeat this exactly, then stop:\n{item}"
        kind = i % 4
        opts: dict[str, Any] = {"max_tokens": 48}
        if kind == 1:
            opts["max_tokens"] = 6 + i % 13
        elif kind == 2:
            opts["stop"] = [[city, name, "FROM", "width"][i % 4]]
        elif kind == 3:
            opts["stop_token_text"] = [f" {age}", city, " name", " *"][i % 4]
        out.append((message, opts))
    return out


def params(tok: Tokenizer, opts: dict[str, Any]) -> SamplingParams:
    opts = dict(opts)
    text = opts.pop("stop_token_text", None)
    if text is not None:
        opts["stop_token_ids"] = [tok.encode(text)[-1]]
    return SamplingParams(temperature=0.0, **opts)


def chat_ids(llm: LLM, message: str) -> list[int]:
    text = render_chat(llm.metadata, [{"role": "user", "content": message}], tokenizer=llm.tokenizer)
    return prompt_token_ids(llm.tokenizer, text)


# ---- the front-end's request stream, fed by hand -----------------------------------------------------
class _Core:
    def __init__(self) -> None:
        self.aborts: list[tuple[str, int | None]] = []

    def abort(self, rid: str, index: int | None = None) -> None:
        self.aborts.append((rid, index))


def _feed(tok: Tokenizer, p: SamplingParams, steps: list[tuple[list[int], str | None]]) -> tuple:
    """Wire outputs of one completion, a step each -> (text, token ids, finish reason, aborts)."""
    core, got = _Core(), []
    stream = RequestStream(core, tok, "r", [1], p, got.append)  # type: ignore[arg-type]
    for toks, reason in steps:
        stream([(("r", reason is not None, [(0, toks, reason, None)], 0, 0, None), 0.0)])
    outs: list[RequestOutput] = got
    deltas = [d for o in outs for d in o.deltas]
    assert outs[-1].finished and outs[-1].metrics.num_generated_tokens == sum(
        len(d.token_ids) for d in deltas
    )
    return (
        "".join(d.text for d in deltas),
        [t for d in deltas for t in d.token_ids],
        deltas[-1].finish_reason,
        core.aborts,
    )


@pytest.fixture(scope="module")
def tok(smollm2_path: Path) -> Tokenizer:
    return tokenizer_from_gguf(load_gguf(smollm2_path))


HEAD, STEP = '{"name": "Ann", "age": 31}', "\nSELECT id FROM users;"  # STEP: one verify step's tokens


@pytest.mark.parametrize(
    "stop, tail, reason",
    [
        ([], "eos", "stop"),  # an end-of-generation id closes the step
        ([], "", "length"),  # max_tokens is the step's last token
        (["FROM"], "more", None),  # a stop string inside the step; the core goes on until aborted
        ([" users"], "eos", "stop"),  # a stop string, then the core's own end in the same step
    ],
)
def test_a_step_of_several_tokens_gives_the_text_of_those_tokens_one_per_step(
    tok: Tokenizer, stop: list[str], tail: str, reason: str | None
) -> None:
    head = tok.encode(HEAD)
    ids = head + tok.encode(STEP) + {"eos": [2], "more": tok.encode(" x y"), "": []}[tail]
    assert tok.decode(ids).startswith(HEAD + STEP)
    p = SamplingParams(temperature=0.0, max_tokens=len(ids), stop=stop)
    last = [reason if i == len(ids) - 1 else None for i in range(len(ids))]
    one_per_step = _feed(tok, p, [([t], r) for t, r in zip(ids, last, strict=True)])
    in_one_step = _feed(tok, p, [([t], None) for t in head] + [(ids[len(head) :], reason)])
    assert in_one_step[:3] == one_per_step[:3]
    text, kept, finish, aborts = in_one_step
    if stop:  # the text before the stop string; the tokens up to the one that completed it
        assert text == (HEAD + STEP).split(stop[0])[0] and finish == "stop"
        assert (
            len(kept) < len(ids) - 1 and stop[0] in tok.decode(kept) and stop[0] not in tok.decode(kept[:-1])
        )
        assert (("r", 0) in aborts) == (reason is None)  # the core is told only when it had not ended it
    else:
        assert text == tok.decode(ids[: len(ids) - (tail == "eos")]) and kept == ids and finish == reason


# ---- through LLM ------------------------------------------------------------------------------------
IN_PROCESS = cases(56)


def _join(outs: list[RequestOutput]) -> tuple[str, list[int], str | None, int]:
    """A request's outputs -> (text, token ids, finish reason, tokens its last output brought)."""
    deltas = [d for o in outs for d in o.deltas]
    assert outs[-1].finished
    text = "".join(d.text for d in deltas)
    return (
        text,
        [t for d in deltas for t in d.token_ids],
        deltas[-1].finish_reason,
        len(outs[-1].deltas[-1].token_ids),
    )


async def _stream(llm: LLM, ids: list[int], p: SamplingParams) -> tuple:
    return _join([out async for out in llm.stream(ids, p)])


def _generate(llm: LLM, ids: list[int], p: SamplingParams) -> tuple:
    outs: list[RequestOutput] = []
    result = llm.generate([ids], p, on_output=outs.append)[0]
    joined = _join(outs)
    assert (result.text, result.token_ids, result.finish_reason) == joined[:3]
    return joined


def test_speculative_text_equals_plain_text_in_process(smollm2_path: Path) -> None:
    """56 requests: greedy plain decoding (all at once: the kernels are batch-invariant) against n-gram
    speculation at batch 1, each request once through generate() and once streamed, text for text and
    token for token. Many of them end inside a verify step's accepted drafts (their last output brings
    several tokens), which is where text used to be lost."""
    with LLM(smollm2_path, n_ctx=512) as plain:
        all_params = [params(plain.tokenizer, o) for _, o in IN_PROCESS]
        prompts = [chat_ids(plain, m) for m, _ in IN_PROCESS]

        async def everything() -> list[tuple]:
            return await asyncio.gather(
                *[_stream(plain, ids, p) for ids, p in zip(prompts, all_params, strict=True)]
            )

        want = asyncio.run(everything())
    with LLM(smollm2_path, n_ctx=512, speculative="ngram") as spec:
        whole = [_generate(spec, ids, p) for ids, p in zip(prompts, all_params, strict=True)]
        streamed = [asyncio.run(_stream(spec, ids, p)) for ids, p in zip(prompts, all_params, strict=True)]
        stats = spec.stats()
    for i, (w, g, s) in enumerate(zip(want, whole, streamed, strict=True)):
        assert g[:3] == w[:3], (i, IN_PROCESS[i])
        assert s[:3] == w[:3], (i, IN_PROCESS[i])
    assert {w[2] for w in want} == {"stop", "length"}
    ends_in_drafts = sum(g[3] > 1 for g in whole)
    assert ends_in_drafts >= len(whole) // 4 and stats.spec_accepted_tokens_total > 0
