"""Images in the engine: the checks on a request's MediaSpans (protocol.py) before they reach a kernel,
and each step's share of them for the runner (RunItem.media).

A non-causal image (Gemma 3) is computed as llama.cpp computes it with causal attention off for the
image's batch: each of its tokens attends to every earlier token and to the whole image. The attention
kernels take a causal limit per token (its position); the image's tokens get the image's last position
as theirs (ForwardBatch.attn_positions) while RoPE keeps the true positions. With a sliding window the
kernel measures the window from that limit where llama.cpp measures it from the token: the image tokens
whose windows differ are computed again one by one (arch/common.py's window_from_token)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgellm.engine.protocol import MediaSpan

# the architectures whose forward pass takes embedding rows (arch/llama.py's LlamaModel._layers)
MEDIA_ARCHS = frozenset({"gemma3"})


@dataclass
class StepMedia:
    """One RunItem's image rows: offsets into its token_ids, their embeddings, and every token's causal
    limit when one of them is in a non-causal image (else None)."""

    rows: np.ndarray  # [R] int32
    embeds: np.ndarray  # [R, n_embd] float32
    attn_positions: np.ndarray | None  # [n] int32


def check_media_arch(arch: str) -> None:
    """ValueError unless the text model's forward pass takes image rows."""
    if arch not in MEDIA_ARCHS:
        supported = ", ".join(sorted(MEDIA_ARCHS))
        raise ValueError(f"images are not supported for the {arch} architecture yet (only {supported})")


def check_media(media: list[MediaSpan], n_prompt: int, cfg) -> list[MediaSpan]:  # noqa: ANN001
    """The spans sorted, checked: inside the prompt, not overlapping, [n, n_embd] finite float32 rows."""
    if not media:
        return []
    check_media_arch(cfg.arch)
    spans = sorted(media, key=lambda m: m.start)
    prev_end = 0
    for m in spans:
        e = np.asarray(m.embeds)
        if e.ndim != 2 or e.shape[1] != cfg.n_embd or e.dtype != np.float32 or len(e) == 0:
            raise ValueError(
                f"image embeddings of shape {e.shape} ({e.dtype}); expected [n, {cfg.n_embd}] f32"
            )
        if not np.isfinite(e).all():
            raise ValueError("image embeddings are not finite")
        if m.start < prev_end or m.end > n_prompt:
            raise ValueError(f"image at positions {m.start}..{m.end} overlaps another or leaves the prompt")
        prev_end = m.end
    return spans


def media_rows(media: list[MediaSpan], start: int, n: int) -> StepMedia | None:
    """The image rows among the tokens start .. start + n of a sequence (None: no image there)."""
    rows, embeds = [], []
    limits = None
    for m in media:
        lo, hi = max(m.start, start), min(m.end, start + n)
        if lo >= hi:
            continue
        rows.append(np.arange(lo - start, hi - start, dtype=np.int32))
        embeds.append(m.embeds[lo - m.start : hi - m.start])
        if m.non_causal:
            if limits is None:
                limits = np.arange(start, start + n, dtype=np.int32)
            limits[lo - start : hi - start] = m.end - 1
    if not rows:
        return None
    return StepMedia(np.concatenate(rows), np.concatenate(embeds).astype(np.float32), limits)
