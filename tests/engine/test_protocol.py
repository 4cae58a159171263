"""The messages between the front-end and the engine core process (engine/protocol.py) survive the pipe
(pickle) field for field, and FinishReason reads as the finish_reason strings the APIs report."""

from __future__ import annotations

import pickle

import numpy as np

from edgellm.engine import protocol as p
from edgellm.sampling.sampler import SamplingParams


def test_finish_reasons_read_as_the_api_strings() -> None:
    assert [str(r) for r in p.FinishReason] == ["stop", "length", "abort"]
    assert f"{p.FinishReason.LENGTH}" == "length"


def test_every_message_survives_pickling() -> None:
    stats = p.EngineStats(1, 2, 3, 4, 0.5, 0.25, 6, 7, 8, 9, 10, spec_draft_tokens_total=11)
    out = p.EngineCoreOutput(
        "r-1", [5, 6], p.FinishReason.LENGTH, [p.TokenLogprob(6, -0.5, [(6, -0.5), (2, -1.5)])], 1, 3, 2,
        first=True, request_finished=True, embedding=np.arange(3, dtype=np.float32),
    )  # fmt: skip
    messages = [
        p.EngineCoreRequest("r-1", [1, 2, 3], SamplingParams(temperature=0.0, n=2), 1, "call-0"),
        p.EngineCoreRequest("e-1", [1], None),
        p.AbortRequests(["a", "b"], 0),
        p.UtilityCall(3, "score", ([1, 2],)),
        p.Shutdown(),
        p.EngineCoreOutputs(stats, [(1.5, [out, p.EngineCoreOutput("r-2", [7])])]),
        p.CoreProgress("loading"),
        p.CoreReady({"n_ctx": 64}),
        p.RequestRejected("r-3", ValueError("bad")),
        p.UtilityResult(3, True, [1.0]),
    ]
    for msg in messages:
        back = pickle.loads(pickle.dumps(msg))
        assert type(back) is type(msg)
        if isinstance(msg, p.EngineCoreOutputs):
            (t, (got, plain)), (_, (want, _)) = back.steps[0], msg.steps[0]
            assert t == 1.5 and back.stats == stats and plain == p.EngineCoreOutput("r-2", [7])
            assert np.array_equal(got.embedding, want.embedding)
            got.embedding = want.embedding = None
            assert got == want and got.finish_reason is p.FinishReason.LENGTH
        elif isinstance(msg, p.RequestRejected):
            assert back.request_id == "r-3" and str(back.error) == "bad"
        else:
            assert back == msg
