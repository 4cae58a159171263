"""Request checks: the front-end's one validation of a request (`check_request`, called by LLM.make_request,
the way in of LLM, the server and the TUI; `check_embedding_input`, `check_score_input`) and the engine
core's guard before its kernels (the same functions): one set of rules and messages, so a request is judged
the same wherever it comes from."""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import TYPE_CHECKING

from edgellm.tokenizer import TextTooLongError

if TYPE_CHECKING:
    from edgellm.gguf.model_config import ModelConfig
    from edgellm.sampling.sampler import SamplingParams
    from edgellm.tokenizer import Tokenizer


class PromptTooLongError(ValueError):
    """`at_least`: refused by the text's size before tokenizing it (Tokenizer.min_tokens), so
    `num_tokens` is a lower bound."""

    def __init__(
        self, num_tokens: int, n_ctx: int, message: str | None = None, at_least: bool = False
    ) -> None:
        self.num_tokens, self.n_ctx, self.at_least = num_tokens, n_ctx, at_least
        super().__init__(
            message
            or f"prompt has {self.count} tokens but the context window is {n_ctx} tokens "
            f"(at most {n_ctx - 1} prompt tokens leave room for one generated token)"
        )

    @property
    def count(self) -> str:
        """The token count as a message says it ("at least N" when bounded by size)."""
        return f"at least {self.num_tokens}" if self.at_least else str(self.num_tokens)

    def __reduce__(self):  # noqa: ANN204 - crosses the core's pipe
        return (PromptTooLongError, (self.num_tokens, self.n_ctx, str(self), self.at_least))


class TokenIdError(ValueError):
    """A token id outside the vocabulary; `field` says where the request had it ("prompt", "input",
    "logit_bias"), so that an API can name its own field."""

    def __init__(self, field: str, token_id: object, vocab_size: int) -> None:
        self.field, self.token_id, self.vocab_size = field, token_id, vocab_size
        super().__init__(f"{field} token id {token_id!r} is outside the vocabulary (0..{vocab_size - 1})")

    def __reduce__(self):  # noqa: ANN204 - crosses the core's pipe
        return (TokenIdError, (self.field, self.token_id, self.vocab_size))


def check_request(ids: Sequence[int], params: SamplingParams, n_ctx: int, vocab_size: int) -> None:
    """A generation request the engine can run: its prompt (check_prompt) and the token ids its sampling
    parameters name (logit_bias)."""
    check_prompt(ids, n_ctx, vocab_size)
    for tid in params.logit_bias or ():
        if isinstance(tid, bool) or not isinstance(tid, Integral) or not 0 <= tid < vocab_size:
            raise TokenIdError("logit_bias", tid, vocab_size)


def check_prompt(ids: Sequence[int], n_ctx: int, vocab_size: int) -> None:
    """A prompt the engine can run: at least one token, every id in the vocabulary (the kernels do no
    bounds checks), and room for at least one generated token in the context window."""
    _check_ids(ids, vocab_size, "prompt")
    if len(ids) >= n_ctx:
        raise PromptTooLongError(len(ids), n_ctx)


def encode_within(tokenizer: Tokenizer, text: str, n_ctx: int, most: int) -> list[int]:
    """Text -> ids with BOS (and EOS) as the model adds them. Text that surely has more than `most`
    tokens is refused by its size before it is tokenized (PromptTooLongError with `at_least`), so an
    over-long prompt costs a length check, not the seconds and memory of tokenizing megabytes."""
    try:
        return tokenizer.encode(text, add_special=True, max_tokens=most)
    except TextTooLongError as e:
        raise PromptTooLongError(e.num_tokens, n_ctx, at_least=True) from None


POOLABLE = ("mean", "cls", "last", "rank")  # engine/pooling.py's ways


def check_pooling(pooling: str, head: bool = False) -> None:
    """ValueError unless the engine can pool this way; `head`: the model runs a classification head on the
    pooled row (ModelConfig.rank_head), which pooling "rank" needs."""
    if pooling == "rank" and not head:
        raise ValueError(
            "this model's pooling type is 'rank' (a reranker) but it has no classification head edgellm "
            "runs (encoders' cls / cls.output, Qwen 3's cls.output)"
        )
    if pooling == "none":
        raise ValueError(
            "this model's pooling type is 'none' (its GGUF's pooling_type: one vector per token), which "
            "gives no one vector per input; use a model file whose pooling_type is mean, cls or last"
        )
    if pooling not in POOLABLE:
        raise ValueError(
            f"this model's pooling type is {pooling!r} (its GGUF's pooling_type); embeddings support "
            f"{', '.join(POOLABLE)}"
        )


class EmbeddingOnlyError(ValueError):
    """Generation or scoring asked of a model that has no vocabulary projection (an encoder)."""


def check_generative(cfg: ModelConfig) -> None:
    """EmbeddingOnlyError for an encoder (arch/encoder.py): it embeds (and ranks), it cannot generate."""
    if not cfg.causal:
        raise EmbeddingOnlyError(
            f"this model ({cfg.arch}) is an embedding-only encoder: it cannot generate text or score "
            "tokens; use it for embeddings" + (" or reranking" if cfg.pooling == "rank" else "")
        )


def check_embedding_input(ids: Sequence[int], n_ctx: int, vocab_size: int) -> None:
    """An input to embed: as a prompt, but it may fill the whole context window (nothing is generated)."""
    _check_ids(ids, vocab_size, "input")
    if len(ids) > n_ctx:
        raise PromptTooLongError(
            len(ids), n_ctx, f"input has {len(ids)} tokens but the context window is {n_ctx} tokens"
        )


def check_score_input(ids: Sequence[int], n_ctx: int, vocab_size: int) -> None:
    """A sequence to score (teacher-forced logits): at least one token, no more than the context window
    (nothing is generated), every id in the model's vocabulary."""
    if not ids:
        raise ValueError("score() needs at least one token")
    if len(ids) > n_ctx:
        raise PromptTooLongError(len(ids), n_ctx, f"{len(ids)} tokens exceed the context window of {n_ctx}")
    if any(isinstance(t, bool) or not 0 <= t < vocab_size for t in ids):
        raise ValueError(f"token ids must be in 0..{vocab_size - 1}")


def _check_ids(ids: Sequence[int], vocab_size: int, what: str) -> None:
    if not ids:
        raise ValueError(f"empty {what}: at least one token is needed")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise TokenIdError(what, t, vocab_size)
