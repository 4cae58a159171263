"""The LoRA updates of one forward step, beside the base matmuls (never merged into the weights).

A step's batch mixes requests that use different adapters (or none): rows are grouped by adapter (Punica /
S-LoRA's segmented form), and for each adapter k and each adapted tensor of a matmul
    out[rows_k, cols] += (scale_row * factor) * (x[rows_k] @ A^T) @ B^T
with rows_k the batch rows whose request uses k, scale_row that request's scale for k, and factor
alpha / rank (adapter.py). A request with two adapters gets both sums, as llama.cpp's build_lora_mm adds
one update per adapter. The work is rank-r (4-64) products on the host: two BLAS calls per adapter and
tensor, small beside the base matmul, and the same on every CPU tier. On a device backend (CUDA) the same
host products are computed from the matmul's input brought to the host, and added to its output as one
uploaded [n, n_out] array: correct, not fast (a device kernel for the grouped products is left to do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgellm.lora.adapter import LoraAdapter, SlotKey
from edgellm.quants.activations import quantize_act_ref
from edgellm.quants.packing import ACT_ROUNDING


@dataclass(frozen=True)
class RowGroup:
    """The rows of an array that one adapter applies to, and each row's scale."""

    adapter: LoraAdapter
    rows: slice | np.ndarray  # a slice where the rows are contiguous (a copy-free view)
    scales: np.ndarray  # [n, 1] float32


def _groups(adapters: list[LoraAdapter], scales: np.ndarray) -> list[RowGroup]:
    """scales [n_rows, n_adapters]: each row's scale per adapter (0: not used)."""
    groups = []
    for k, adapter in enumerate(adapters):
        rows = np.flatnonzero(scales[:, k])
        if not len(rows):
            continue
        s = scales[rows, k].astype(np.float32).reshape(-1, 1)
        if rows[-1] - rows[0] + 1 == len(rows):
            groups.append(RowGroup(adapter, slice(int(rows[0]), int(rows[-1]) + 1), s))
        else:
            groups.append(RowGroup(adapter, rows, s))
    return groups


class LoraStep:
    """Which rows of a forward batch use which adapter at which scale: token rows (every layer's
    matmuls) and logits rows (the output projection, over batch.logits_index)."""

    def __init__(
        self, adapters: list[LoraAdapter], token_scales: np.ndarray, logits_index: np.ndarray, be: Any = None
    ) -> None:
        # token_scales [T, n_adapters] float32; be: the backend, for arrays that are not host arrays
        self.be = be
        self.tokens = _groups(adapters, token_scales)
        self.logits = _groups(adapters, token_scales[logits_index]) if len(logits_index) else []
        # the layers some adapter of the step adapts: the others keep the backend's one-call layer
        self.layers = frozenset(il for g in self.tokens for il, _ in g.adapter.parts if il >= 0)

    def touches(self, il: int) -> bool:
        return il in self.layers

    def add(self, slot: SlotKey, x: Any, out: Any, logits_rows: bool = False) -> None:
        """out [n, n_cols] += the updates of every adapter with a tensor in matmul `slot`; x [n, n_in] the
        matmul's input (host arrays, the CPU backend's; else the backend's, through the host)."""
        groups = [g for g in (self.logits if logits_rows else self.tokens) if g.adapter.parts.get(slot)]
        if not groups:
            return
        if isinstance(out, np.ndarray):
            _add_updates(slot, groups, x, out)
            return
        delta = np.zeros(out.shape, np.float32)
        _add_updates(slot, groups, self.be.to_host(x), delta)
        self.be.add(out, self.be.from_host(delta))


def round_input(x: np.ndarray, dot: str) -> np.ndarray:
    """x as llama.cpp's CPU rounds a matmul's input for a weight whose vec_dot type is `dot`."""
    if dot == "f32":
        return x
    if dot == "q8_0":  # blocks of 32 with an f16 scale: what the int8 dot products see, dequantized
        xq, xs, _ = quantize_act_ref(x, 32, "q8_0")
        return (xq.reshape(len(x), -1, 32) * xs[..., None]).reshape(x.shape).astype(np.float32)
    return ACT_ROUNDING[dot](x)


def _add_updates(slot: SlotKey, groups: list[RowGroup], x: np.ndarray, out: np.ndarray) -> None:
    """As llama.cpp's build_lora_mm: ab = B (A x), rounded per the types, then scaled and added."""
    for g in groups:
        xr = x[g.rows]  # [n_k, n_in]
        rounded: dict[str, np.ndarray] = {}
        for p in g.adapter.parts[slot]:
            if p.a_dot not in rounded:
                rounded[p.a_dot] = round_input(xr, p.a_dot)
            t = round_input(rounded[p.a_dot] @ p.a.T, p.b_dot)  # [n_k, r]
            ab = t @ p.b.T  # [n_k, n_cols]
            ab *= g.scales * np.float32(p.factor)
            out[g.rows, p.col0 : p.col0 + p.b.shape[0]] += ab


def step_for_batch(
    adapters: list[LoraAdapter], choices: list[tuple[tuple[int, float], ...]], counts: list[int],
    logits_index: np.ndarray, be: Any = None,
) -> LoraStep | None:  # fmt: skip
    """The step's LoraStep from each item's choice ((adapter index, scale), ...) and token count; None when
    no item uses an adapter (the step runs exactly as without LoRA). be: the backend of the arrays."""
    if not any(choices):
        return None
    scales = np.zeros((sum(counts), len(adapters)), np.float32)
    t0 = 0
    for choice, n in zip(choices, counts, strict=True):
        for k, s in choice:
            scales[t0 : t0 + n, k] = s
        t0 += n
    return LoraStep(adapters, scales, logits_index, be)
