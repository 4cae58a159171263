"""Request checks shared by every front-end (LLM, the server, the TUI) and the engine core: one set of
rules and messages, so a prompt is judged the same wherever it comes from."""

from __future__ import annotations

from collections.abc import Sequence


class PromptTooLongError(ValueError):
    def __init__(self, num_tokens: int, n_ctx: int, message: str | None = None) -> None:
        self.num_tokens, self.n_ctx = num_tokens, n_ctx
        super().__init__(
            message
            or f"prompt has {num_tokens} tokens but the context window is {n_ctx} tokens "
            f"(at most {n_ctx - 1} prompt tokens leave room for one generated token)"
        )

    def __reduce__(self):  # noqa: ANN204 - crosses the core's pipe
        return (PromptTooLongError, (self.num_tokens, self.n_ctx, str(self)))


def check_prompt(ids: Sequence[int], n_ctx: int, vocab_size: int) -> None:
    """A prompt the engine can run: at least one token, every id in the vocabulary (the kernels do no
    bounds checks), and room for at least one generated token in the context window."""
    _check_ids(ids, vocab_size, "prompt")
    if len(ids) >= n_ctx:
        raise PromptTooLongError(len(ids), n_ctx)


def check_embedding_input(ids: Sequence[int], n_ctx: int, vocab_size: int) -> None:
    """An input to embed: as a prompt, but it may fill the whole context window (nothing is generated)."""
    _check_ids(ids, vocab_size, "input")
    if len(ids) > n_ctx:
        raise PromptTooLongError(
            len(ids), n_ctx, f"input has {len(ids)} tokens but the context window is {n_ctx} tokens"
        )


def _check_ids(ids: Sequence[int], vocab_size: int, what: str) -> None:
    if not ids:
        raise ValueError(f"empty {what}: at least one token is needed")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise ValueError(f"{what} token id {t!r} is outside the vocabulary (0..{vocab_size - 1})")
