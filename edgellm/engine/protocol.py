"""The messages between the front-end (LLM, the server, the TUI) and the engine core process, as small
pickle-able dataclasses (vLLM v1's engine/__init__.py). This module imports nothing of the core (no model,
runner, scheduler or backend): both sides share it without the front-end loading the core.

In, front-end -> core: EngineCoreRequest (a generation, an embedding or a scoring), AbortRequests,
UtilityCall, Shutdown. Out, core -> front-end: CoreProgress lines, then CoreReady or CoreLoadFailed while
it loads; then EngineCoreOutputs per step (or per EngineConfig.stream_interval), RequestRejected,
UtilityResult, and CoreFailed when a step raised. Only ids, numbers, strings, SamplingParams, numpy arrays
and exceptions cross: no tokenizer state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from edgellm.sampling.sampler import SamplingParams


class FinishReason(enum.IntEnum):
    """Why a completion ended; str() gives the finish_reason the APIs report."""

    STOP = 0  # a stop or end-of-generation token id (a stop string the front-end matched reports "stop" too)
    LENGTH = 1  # max_tokens (capped by the context window), or the sequence outgrew the whole KV pool
    ABORT = 2  # cancelled: by the client, or by the front-end after a stop string

    def __str__(self) -> str:
        return self.name.lower()


class RequestKind(enum.IntEnum):
    """What the core does with a request's tokens. The scheduler plans all three alike (chunked over the
    paged KV cache, batched with the rest, preemptible); only a generation samples."""

    GENERATE = 0  # sample completions after the prompt (EngineCoreRequest.sampling_params)
    EMBED = 1  # pool the input's final hidden states into one vector (EngineCoreOutput.embedding)
    SCORE = 2  # teacher-forced: the logits at every position of the input (EngineCoreOutput.logits)


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the most likely alternatives (id, logprob)


# ---- front-end -> core ------------------------------------------------------------------------------
@dataclass
class MediaSpan:
    """An image's place in a prompt (vision/prompt.py): its embeddings stand in for the token ids at
    positions start .. start + len(embeds). key: the image's content hash (the prefix cache's key for those
    positions). non_causal: its tokens attend to each other both ways (Gemma 3), so the scheduler computes
    the span in one step."""

    start: int
    embeds: np.ndarray  # [n, n_embd] float32
    key: str
    non_causal: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.embeds)


@dataclass
class EngineCoreRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams | None  # None for an embedding or a scoring (nothing is sampled)
    priority: int = 0  # lower is served first
    # The client request this one is part of (an HTTP request's prompts or embedding inputs): they share
    # its part of each step. None: a group of its own.
    group: str | None = None
    kind: RequestKind = RequestKind.GENERATE
    media: list[MediaSpan] | None = None  # images: embeddings in place of some prompt positions


@dataclass
class AbortRequests:
    """Stop requests (an abandoned call's inputs all at once), or only completion `index` of each (a stop
    string the front-end matched). A no-op for those that already finished."""

    request_ids: list[str]
    index: int | None = None


@dataclass
class UtilityCall:
    """A request/reply message ("stats"): answered by one UtilityResult with the same call_id."""

    call_id: int
    name: str
    args: tuple


@dataclass
class Shutdown:
    pass


# ---- core -> front-end ------------------------------------------------------------------------------
@dataclass
class EngineStats:
    """A snapshot of the engine's gauges and counters (the server's /metrics is built from it)."""

    num_running: int
    num_waiting: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_usage: float  # fraction of blocks held by live sequences
    prefix_cache_hit_rate: float
    num_preemptions: int
    prompt_tokens_total: int
    cached_tokens_total: int
    generated_tokens_total: int
    requests_finished_total: int
    spec_draft_tokens_total: int = 0  # speculative decoding: drafts verified
    spec_accepted_tokens_total: int = 0  # of those, accepted
    spec_verify_steps_total: int = 0  # (sequence, step) pairs that verified drafts
    spec_pauses_total: int = 0  # times a sequence's speculation paused for low acceptance

    @property
    def spec_acceptance_rate(self) -> float:
        n = self.spec_draft_tokens_total
        return self.spec_accepted_tokens_total / n if n else 0.0

    @property
    def spec_mean_accepted_length(self) -> float:
        """Tokens per verify step of a sequence: accepted drafts + the target's own (0 without any)."""
        n = self.spec_verify_steps_total
        return (self.spec_accepted_tokens_total + n) / n if n else 0.0


@dataclass
class EngineCoreOutput:
    """One completion's news from one step: token ids only (the front-end detokenizes). A request of n
    completions has one per completion that moved in the step."""

    request_id: str
    new_token_ids: list[int]  # a verify step brings the accepted drafts and one more
    finish_reason: FinishReason | None = None  # the completion ended with the last of new_token_ids
    logprobs: list[TokenLogprob] | None = None  # one per new token, when the request asked for them
    index: int = 0  # which of the request's n completions
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served (known from the first token on)
    num_preemptions: int = 0  # times the request lost its KV blocks (known once it finished)
    first: bool = False  # the step brought the request's first tokens (its time to first token)
    request_finished: bool = False  # every completion has finished: nothing more comes for the request
    embedding: np.ndarray | None = None  # [n_embd] float32: an embedding request's pooled vector
    logits: np.ndarray | None = None  # [n, n_vocab] float32: a scoring's, row t predicting token t+1
    num_shifted_tokens: int = 0  # tokens a rolling window shifted out (known once it finished)

    def __reduce__(self) -> tuple:
        # Positional fields: a step of 16 outputs pickles in half the time, unpickles in a quarter.
        return (EngineCoreOutput, _OUTPUT_FIELDS(self))


_OUTPUT_FIELDS = attrgetter(*(f.name for f in fields(EngineCoreOutput)))


@dataclass
class EngineCoreOutputs:
    """One message of outputs: each step since the previous message as (step time, its outputs), several
    when EngineConfig.stream_interval batches them (none after adds and aborts that left the engine idle), and
    the engine's gauges after the last."""

    stats: EngineStats
    steps: list[tuple[float, list[EngineCoreOutput]]] = field(default_factory=list)


@dataclass
class CoreProgress:
    line: str  # a loading step, for the user


@dataclass
class CoreReady:
    info: dict[str, Any]  # the loaded engine's sizes and timings (EngineCoreProc.info)


@dataclass
class CoreLoadFailed:
    error: BaseException


@dataclass
class RequestRejected:
    """The core refused an EngineCoreRequest (the core's guard, or a request that can never fit)."""

    request_id: str
    error: BaseException


@dataclass
class UtilityResult:
    call_id: int
    ok: bool
    value: Any  # the result, or the exception when not ok


@dataclass
class CoreFailed:
    """A step raised: the core process ends, and the front-end fails its requests with this reason."""

    error: BaseException
