"""The backend interface the model code is written against.

A backend owns where weights and activations live (numpy on the CPU, device arrays on CUDA) and the
kernels over them. Model files (`edgellm/arch/`) call only these methods, so a new backend needs no change
to the models, the engine, the server or the TUI.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgellm.gguf.reader import TensorInfo
from edgellm.gguf.rope import RopeParams

Array = Any  # numpy array on the CPU backend, device array on CUDA


@dataclass
class StepIndex:
    """An index array in both places: `host` for checks and lengths, `dev` for a device backend's kernels
    (the CPU backend reads `host`)."""

    host: np.ndarray
    dev: Any

    def __len__(self) -> int:
        return len(self.host)


@dataclass
class StepInputs:
    """A forward batch's index arrays where the backend's kernels read them (step_inputs)."""

    token_ids: Any  # [T] for embed
    positions: Any  # [T]
    seq_index: Any  # [T]
    block_tables: Any  # [S, max_blocks]
    slots: Any  # [T]
    logits_index: Any  # [L] for take_rows


@dataclass(frozen=True)
class ExpertRoute:
    """A mixture-of-experts layer's routing for one step (arch/moe.py): each token's k experts and
    weights, and its (token, slot) pairs sorted by expert (stable: tokens ascending within an expert),
    so each selected expert runs once over its tokens."""

    experts: np.ndarray  # [T, k] int64: each token's experts, most probable first
    weights: np.ndarray  # [T, k] float32: their weights in the sum
    tokens: np.ndarray  # [T*k] int64: the pairs' tokens in expert order
    ids: np.ndarray  # [R] int64: the selected experts, ascending
    bounds: np.ndarray  # [R + 1] int64: expert ids[r]'s pairs are rows bounds[r]:bounds[r + 1] of that order
    where: np.ndarray  # [T, k] int64: each pair's row in that order

    @property
    def runs(self) -> list[tuple[int, int, int]]:
        """(expert, start, end) per selected expert."""
        b = self.bounds.tolist()
        return [(e, b[r], b[r + 1]) for r, e in enumerate(self.ids.tolist())]


class Backend(ABC):
    name: str
    # Host memory of the prepared weights on huge pages (the CPU backend's; weight_memory.py): the
    # engine sets it from EngineConfig.huge_pages before the model loads.
    huge_pages: bool = True

    # --- weights -------------------------------------------------------------------------------------
    @abstractmethod
    def load_matrix(self, tensors: list[TensorInfo]) -> Any:
        """Repack one weight matrix, or several stacked along the output rows (fused QKV, gate|up)."""

    def load_matrices(self, groups: list[list[TensorInfo]]) -> list[Any]:
        """load_matrix of each group (a mixture-of-experts layer's experts), which a backend may repack in
        one pass over them all."""
        return [self.load_matrix(g) for g in groups]

    @abstractmethod
    def load_vector(self, tensor: TensorInfo) -> Array:
        """A float32 vector (norm weights, biases)."""

    # --- activations -----------------------------------------------------------------------------------
    @abstractmethod
    def empty(self, shape: tuple[int, ...]) -> Array:
        """Uninitialised float32 activations."""

    @abstractmethod
    def contiguous(self, x: Array) -> Array:
        """x as a C-contiguous array (a copy only when it is a strided view)."""

    @abstractmethod
    def to_host(self, x: Array) -> np.ndarray: ...

    @abstractmethod
    def from_host(self, x: np.ndarray) -> Array: ...

    def step_inputs(self, batch: Any) -> StepInputs:
        """The ForwardBatch's index arrays for this step's kernels: one from_host each by default (the
        identity on the CPU); a device backend sends them together."""
        return StepInputs(
            batch.token_ids,
            self.from_host(batch.positions),
            self.from_host(batch.seq_index),
            self.from_host(batch.block_tables),
            self.from_host(batch.slots),
            batch.logits_index,
        )

    # --- kernels -------------------------------------------------------------------------------------
    @abstractmethod
    def embed(self, w: Any, ids: np.ndarray | StepIndex, scale: float) -> Array:
        """Rows `ids` of a weight matrix as float32 [T, K], times `scale`."""

    @abstractmethod
    def matmul(self, x: Array, w: Any, out: Array) -> None:
        """out[M, N] = x[M, K] @ W[N, K].T"""

    @abstractmethod
    def rmsnorm(self, x: Array, w: Array, eps: float, out: Array) -> None: ...

    @abstractmethod
    def rmsnorm_heads(self, x: Array, w: Array, eps: float) -> None:
        """In place over [T, H, d] with a [d] weight."""

    @abstractmethod
    def rope(self, x: Array, positions: Array, rope: RopeParams) -> None:
        """In place over [T, H, d]: each token's heads rotated for its position (gguf/rope.py)."""

    @abstractmethod
    def gated_act(self, gate_up: Array, out: Array, kind: str) -> None:
        """out = act(gate) * up for gate_up = [gate | up]; kind is 'silu' or 'gelu'."""

    @abstractmethod
    def layernorm(self, x: Array, w: Array, b: Array, eps: float, out: Array) -> None:
        """out = (x - mean) / sqrt(var + eps) * w + b per row [T, n] (StarCoder 2, GPT-2). out may alias x."""

    @abstractmethod
    def gelu(self, x: Array) -> None:
        """In place over [T, n]: ggml's float32 GELU (tanh form through its f16 table), the ungated MLP's."""

    @abstractmethod
    def add(self, x: Array, y: Array) -> None:
        """x += y"""

    @abstractmethod
    def add_bias(self, x: Array, b: Array) -> None:
        """x[t] += b for every row"""

    @abstractmethod
    def alloc_kv(
        self, n_layers: int, n_blocks: int, block_size: int, n_kv: int, d: int, dv: int, dtype: str = "f16"
    ) -> Any:
        """Paged KV storage of n_blocks blocks of block_size tokens per layer, K [n_kv, d] and V [n_kv, dv]
        per token, in element type `dtype` (a row of quants/kv_cache.py's table; ValueError for head sizes
        the type cannot hold). Opaque to the model code: only the backend's kernels read it."""

    @abstractmethod
    def write_kv(self, kv: Any, layer: int, k: Array, v: Array, slots: Array) -> None: ...

    @abstractmethod
    def copy_blocks(self, kv: Any, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks src -> dst in every layer (copy-on-write)."""

    def read_kv_block(self, kv: Any, block: int) -> bytes:
        """One KV block of every layer as bytes (the prompt cache's spill: engine/prompt_cache.py)."""
        raise NotImplementedError(f"the {type(self).__name__} backend cannot read KV blocks out")

    def write_kv_block(self, kv: Any, block: int, payload: bytes) -> None:
        """Write read_kv_block's bytes back into a block (the prompt cache's restore)."""
        raise NotImplementedError(f"the {type(self).__name__} backend cannot write KV blocks in")

    @abstractmethod
    def attention(
        self,
        q: Array,
        kv: Any,
        layer: int,
        block_tables: Array,
        seq_index: Array,
        positions: Array,
        window: int,
        scale: float,
        out: Array,
        softcap: float = 0.0,
        sinks: Array | None = None,
    ) -> None:
        """out [T, H, dv] = causal attention of q [T, H, d] over the cached K/V. softcap > 0: Gemma 2's
        attention logit soft-capping, in llama.cpp's order (Q times scale, Q.K, cap * tanh(. / cap),
        softmax). sinks [H] float32 (gpt-oss): head h's softmax has one more logit sinks[h], in its
        denominator only (no value), as ggml_soft_max_add_sinks; a backend without attention_sinks
        refuses them."""

    # Whether attention() takes sinks (gpt-oss refuses to load on a backend without them).
    attention_sinks: bool = False

    # --- whole layers ----------------------------------------------------------------------------------
    def prepare_layer(self, cfg: Any, attn: Any, ffn: Any, layer: int) -> Any:
        """The backend's own form of decoder layer `layer` (arch/common.py's AttentionWeights and
        FeedForwardWeights), run by decoder_layer instead of the kernel calls above; None (the default)
        when it has none. ffn None: the attention block alone (a mixture-of-experts layer, whose FFN
        the model runs after decoder_layer)."""
        return None

    def decoder_layer(self, fused: Any, x: Array, kv: Any, layer: int, inp: StepInputs) -> bool:
        """x += Attention, then x += FFN, as attention_block and feed_forward_block compute them, for a
        prepare_layer result; False (nothing done) when this batch or cache has no fused form."""
        return False

    # --- logits and sampling ---------------------------------------------------------------------------
    # The defaults work on host arrays (the CPU backend's numpy activations, where to_host/from_host are the
    # identity, so they add no copy); a device backend overrides them to keep the logits where they are.

    # True when argmax / top_k run where the logits live, so the engine asks for ids instead of logits.
    samples_on_device: bool = False

    def take_rows(self, x: Array, index: np.ndarray) -> Array:
        """Rows `index` of x [T, n] as a new contiguous [L, n] activation (the rows that need logits)."""
        return self.from_host(np.ascontiguousarray(self.to_host(x)[index], dtype=np.float32))

    def moe_route(self, logits: np.ndarray, k: int, gating: str, renormalise: bool) -> ExpertRoute | None:
        """A mixture-of-experts layer's routing of host router logits [T, n_expert] float32 (arch/moe.py's
        ROUTERS and group_by_expert define it) in compiled code; None where the backend has none: the
        caller routes with numpy."""
        return None

    def moe_experts(self, h: Array, route: ExpertRoute, experts: Any, activation: str, outs: Array) -> bool:
        """The routed experts of a mixture-of-experts layer in one go (arch/moe.py): outs[i] = expert e's
        FFN of h[route.tokens[i]] for each run (e, start, end) of the route and start <= i < end, with the
        bits of running them expert by expert; `experts` is the layer's arch.moe.ExpertMatrices. False
        (nothing done) where the backend has no such form: the caller runs them one by one."""
        return False

    def moe_block(self, x: Array, w: Any, cfg: Any) -> bool:
        """x += a whole mixture-of-experts feed-forward block (arch/moe.py's moe_feed_forward_block: w its
        MoeFeedForwardWeights, cfg the ModelConfig) in one call, with the bits of its step-by-step form;
        False (nothing done) where the backend has no such form for it."""
        return False

    def moe_combine(self, outs: Array, where: np.ndarray, weights: np.ndarray) -> Array:
        """The mixture-of-experts sum (arch/moe.py): out[t] = sum over slots s, in slot order, of
        weights[t, s] * outs[where[t, s]], each product rounded to float32 before it is added, as ggml
        multiplies then adds. outs: [T*k, n] expert outputs; where: [T, k] int64; weights: [T, k] float32.
        A new [T, n] array."""
        y = self.to_host(outs)
        out = weights[:, 0, None] * y[where[:, 0]]
        for s in range(1, where.shape[1]):
            out += weights[:, s, None] * y[where[:, s]]
        return self.from_host(np.ascontiguousarray(out, np.float32))

    def scale(self, x: Array, s: float) -> Array:
        """x * s in float32 (Granite's residual and logit multipliers); may return a new array."""
        return self.from_host(self.to_host(x) * np.float32(s))

    def softcap(self, x: Array, cap: float) -> Array:
        """tanh(x / cap) * cap, the final logit soft-capping; may return a new array."""
        return self.from_host(np.tanh(self.to_host(x) / cap) * cap)

    def argmax(self, logits: Array) -> np.ndarray:
        """np.argmax of each row [L] (the first maximum; the first NaN if any)."""
        return np.argmax(self.to_host(logits), axis=1)

    def top_k(self, logits: Array, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's k best entries as (values float32 [L, k], ids [L, k]): the first k of
        np.argsort(-row, kind="stable"), i.e. larger first, equal values by lower id, NaN last."""
        x = self.to_host(logits)
        ids = np.argsort(-x, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(x, ids, axis=1), ids
