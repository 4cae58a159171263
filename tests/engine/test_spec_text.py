"""Speculative decoding is lossless for the text too: when a request ends inside a verify step's accepted
drafts (an end-of-generation id, a stop token id, max_tokens or a stop string among them), every token's
text up to the end reaches the caller and nothing after it does, exactly as when the same tokens come one
per step. Checked on the front-end's request stream directly, through `LLM` (in-process, 50+ prompts) and
through the server (a few prompts; EDGELLM_SPEC_SOAK=1 adds 60 prompts under 32 concurrent streams with
disconnects)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgellm import LLM
from edgellm.chat.template import prompt_token_ids, render_chat
from edgellm.engine.frontend import RequestStream
from edgellm.engine.outputs import RequestOutput
from edgellm.engine.protocol import EngineCoreOutput, FinishReason
from edgellm.gguf.load import load_gguf
from edgellm.gguf.validation import tokenizer_from_gguf
from edgellm.sampling.sampler import SamplingParams
from edgellm.testing.paths import SCRIPTS  # noqa: E402
from edgellm.testing.servers import MODEL, httpx
from edgellm.testing.servers import metrics as _metrics
from edgellm.testing.servers import serve as _start
from edgellm.tokenizer import Tokenizer

sys.path.insert(0, str(SCRIPTS / "soak"))
from soak_traffic import join_stream, parse_sse  # noqa: E402

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
        if i % 3 == 0:  # the issue's two-line message: JSON, then SQL
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
    """Core outputs of one completion, a step each -> (text, token ids, finish reason, aborts)."""
    core, got = _Core(), []
    stream = RequestStream(core, tok, "r", [1], p, got.append)  # type: ignore[arg-type]
    for toks, reason in steps:
        why = None if reason is None else FinishReason[reason.upper()]
        stream([(EngineCoreOutput("r", toks, why, request_finished=why is not None), 0.0)])
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


# ---- through the server -----------------------------------------------------------------------------
SOAK = os.environ.get("EDGELLM_SPEC_SOAK") == "1"


@pytest.fixture(scope="module")
def servers(smollm2_path: Path) -> Iterator[tuple[str, str]]:
    """A plain server and an n-gram speculative one, room for 32 streams each."""
    args = ("--max-num-seqs", "32", "--max-queue", "64")
    plain, spec = _start(smollm2_path, *args), _start(smollm2_path, *args, "--speculative", "ngram")
    try:
        yield next(plain), next(spec)
    finally:
        plain.close()
        spec.close()


def _body(message: str, opts: dict[str, Any]) -> dict[str, Any]:
    """A chat body for the server, which takes stop strings but not stop token ids: the token's text is
    the stop string there."""
    opts = dict(opts)
    text = opts.pop("stop_token_text", None)
    if text is not None:
        opts["stop"] = [text.strip()]
    return {"model": MODEL, "messages": [{"role": "user", "content": message}], "temperature": 0, **opts}


async def _ask(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], stream: bool, leave_after: int = 0
) -> tuple:
    """(text, finish reason, completion tokens) of one chat request. Streamed with leave_after > 0, the
    client goes away after that many chunks past the first: the text it had by then, None, None."""
    if not stream:
        r = await http.post(f"{url}/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        choice, usage = r.json()["choices"][0], r.json()["usage"]
        return choice["message"]["content"], choice["finish_reason"], usage["completion_tokens"]
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    lines: list[str] = []
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            lines.append(line)
            if leave_after and sum(x.startswith("data: ") for x in lines) > leave_after:
                break  # leaving the block closes the connection: the server aborts the request
    chunks, done = parse_sse(lines)
    text, reason = join_stream(chunks, chat=True).get(0, ("", None))
    if leave_after and not done:
        return text, None, None
    assert done
    return text, reason, chunks[-1]["usage"]["completion_tokens"]


SERVED = [
    c for i, c in enumerate(cases(8)) if i in (0, 1, 2, 3, 6)
]  # EOS, length, 2 stop strings, token text


def test_speculative_server_answers_the_plain_servers_text(servers: tuple[str, str]) -> None:
    """The issue's request and a few more whose end falls inside accepted drafts: the speculative server
    answers the plain one's text, finish reason and token count, streamed and not."""
    plain, spec = servers
    issue = 'Repeat this exactly, then stop:\n{"name": "Ann", "age": 31, "city": "Oslo"}\n'
    issue += "SELECT id, name FROM users WHERE age > 30 ORDER BY name;"
    bodies = [_body(issue, {"max_tokens": 32})] + [_body(m, o) for m, o in SERVED]

    async def run() -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            for body in bodies:
                want = await _ask(http, plain, body, stream=False)
                for stream in (False, True):
                    assert await _ask(http, spec, body, stream) == want, (body, stream)

    asyncio.run(run())


@pytest.mark.skipif(not SOAK, reason="EDGELLM_SPEC_SOAK=1 runs it (minutes)")
def test_speculative_server_under_32_streams_with_disconnects(servers: tuple[str, str]) -> None:
    """60 requests, 32 at a time, streamed; every fifth client leaves after a few chunks. Each finished
    answer is the plain server's (taken at the same concurrency), each abandoned one a prefix of it, and
    the speculative server ends with nothing running."""
    plain, spec = servers
    bodies = [_body(m, o) for m, o in cases(60)]

    async def run(url: str, leave: bool) -> list[tuple]:
        gate = asyncio.Semaphore(32)
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=40)) as http:

            async def one(i: int, body: dict[str, Any]) -> tuple:
                async with gate:
                    return await _ask(
                        http, url, body, stream=True, leave_after=2 + i % 3 if leave and i % 5 == 4 else 0
                    )

            return await asyncio.gather(*[one(i, b) for i, b in enumerate(bodies)])

    want = asyncio.run(run(plain, leave=False))
    got = asyncio.run(run(spec, leave=True))
    left = [i for i, g in enumerate(got) if g[1] is None]
    wrong = [i for i, (w, g) in enumerate(zip(want, got, strict=True)) if g != w and i not in left]
    wrong += [i for i in left if not want[i][0].startswith(got[i][0])]
    m = _metrics(spec)
    print(
        f"\n{len(bodies)} requests, 32 at a time: {len(bodies) - len(left)} finished, {len(left)} abandoned, "
        f"{len(wrong)} differ from plain; drafts accepted {m['edgellm_spec_accepted_tokens_total']:.0f}"
        f" of {m['edgellm_spec_draft_tokens_total']:.0f}"
    )
    assert not wrong, [(i, bodies[i]["messages"][0]["content"], got[i], want[i]) for i in wrong]
    assert len(left) >= 6
    deadline = time.monotonic() + 10
    while _metrics(spec)["edgellm_num_requests_running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    m = _metrics(spec)
    assert m["edgellm_num_requests_running"] == 0 and m["edgellm_kv_cache_blocks_used"] == 0
