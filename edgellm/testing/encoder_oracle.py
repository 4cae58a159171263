"""Encoders against llama.cpp: edgellm's pooled vectors (or rerank scores) for token ids, in process on the
CPU backend through the engine core as LLM.embed sends them (all inputs as one request's group, so the
scheduler batches them), and llama.cpp's for the same ids (llama-cpp-python, used only by
scripts/fixtures/make_encoder_fixtures.py: the default test run reads the fixture it writes)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from edgellm.testing.synthetic.encoder import write_tiny_encoder

T = GGMLQuantizationType
N_CTX = 128
# Texts of several lengths (2 to ~120 tokens): accents to strip, case to lower, punctuation and CJK split
# off, words the vocabulary lacks ([UNK]), whitespace runs and control characters dropped
TEXTS = (
    "Hello world!",
    "The quick brown fox sat on the mat.",
    "Café NAÏVE résumé: what is the capital of France?",
    "xyzzy plugh\tthe\u0007 dog,,  runs\n\nquickly",
    "中文 embed-rank (query; document)",
    " ".join(["the cat sat on the mat and the dog played"] * 10),
    "a",
    "query: Paris[SEP]document: [MASK] is the capital",  # special-token text parsed, as llama-server does
    "Ωmega costs 5€, the €uro",  # words with a character no entry covers: one [UNK] each
)
QUERY = "What is the capital of France?"
DOCUMENTS = (
    "Paris is the capital of France.",
    "The cat sat on the mat.",
    "hello",
    "France: its capital, Paris, is a city of cafes and quick brown foxes.",
    "the dog is quick and the fox is brown",
)


@dataclass(frozen=True)
class EncoderCase:
    arch: str
    pooling: int  # llama.cpp's llama_pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank
    qtype: GGMLQuantizationType = T.F32
    fused_qkv: bool | None = None
    gate_in_up: bool = False
    seed: int = 0

    def write(self, path: str | Path) -> Path:
        return write_tiny_encoder(
            path, self.arch, pooling=self.pooling, reranker=self.pooling == 4, context_length=N_CTX,
            qtype=self.qtype, fused_qkv=self.fused_qkv, gate_in_up=self.gate_in_up, seed=self.seed,
        )  # fmt: skip


CASES = {
    "bert_mean": EncoderCase("bert", 1),
    "bert_cls_q8_0": EncoderCase("bert", 2, T.Q8_0, seed=1),
    "bert_last_f16_fused": EncoderCase("bert", 3, T.F16, fused_qkv=True, seed=2),
    "bert_none": EncoderCase("bert", 0, seed=3),
    "bert_rerank": EncoderCase("bert", 4, seed=4),
    "nomic_bert_mean": EncoderCase("nomic-bert", 1, seed=5),
    "nomic_bert_cls_q8_0": EncoderCase("nomic-bert", 2, T.Q8_0, seed=6),
    "jina_bert_v2_mean": EncoderCase("jina-bert-v2", 1, seed=7),
    "jina_bert_v2_mean_gate_in_up": EncoderCase("jina-bert-v2", 1, gate_in_up=True, seed=8),
    "jina_bert_v2_rerank": EncoderCase("jina-bert-v2", 4, seed=10),
}


QWEN3_RERANK_CTX = 512  # the tiny byte-level vocabulary spends a token on most characters
# A Qwen3-Reranker-shaped decoder: qwen3 with cls.output ("yes", "no"), pooling rank, and the prompt from
# its tokenizer.chat_template.rerank (as llama.cpp's converter writes one)
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements of the Query. Answer only "
    '"yes" or "no".<|im_end|>\n<|im_start|>user\n<Query>: {query}\n<Document>: {document}<|im_end|>\n'
    "<|im_start|>assistant\n"
)


def write_qwen3_reranker(path: str | Path) -> Path:
    from gguf import GGUFValueType

    from edgellm.testing.synthetic.models import Typed, write_tiny_model

    return write_tiny_model(
        path,
        "qwen3",
        "F16",  # a score within 1e-3 of llama.cpp's needs more than 4-bit weights' agreement
        context_length=QWEN3_RERANK_CTX,
        seed=9,
        metadata_overrides={
            "qwen3.pooling_type": Typed(4, GGUFValueType.UINT32),
            "qwen3.classifier.output_labels": ["yes", "no"],
            "tokenizer.chat_template.rerank": QWEN3_RERANK_TEMPLATE,
        },
        extra_tensors={"cls.output.weight": (2, 64)},
        weight_scale={"cls.output": 0.5},  # P(yes) spread inside (0, 1), not saturated
    )


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def token_states_edgellm(path: str | Path, ids: list[int]) -> np.ndarray:
    """The final hidden state of every token of one input [n, n_embd] (pooling none), in process."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.engine.model_runner import ModelRunner, RunItem
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.gguf.validation import validate_model

    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    be = CpuBackend()
    n_blocks = -(-len(ids) // 16)
    runner = ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, be), cfg, be, n_blocks, 16)
    rows = np.arange(len(ids), dtype=np.int32)
    runner.run([RunItem(list(range(n_blocks)), list(ids), 0, need_logits=False, hidden_rows=rows)])
    return runner.last_hidden[0]


def engine_core(path: str | Path, n_ctx: int = N_CTX, n_blocks: int = 64) -> Any:
    """An in-process EngineCore on the CPU backend for the file, after LLM()'s load checks, scheduled as
    the engine process schedules it: an encoder's inputs whole, a decoder's in chunks of 64 tokens."""
    from edgellm.arch import ARCHITECTURES
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.engine.core_process import encoder_scheduling
    from edgellm.engine.engine_core import EngineCore
    from edgellm.engine.model_runner import ModelRunner
    from edgellm.engine.scheduler import SchedulerConfig
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.gguf.validation import validate_model

    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    be = CpuBackend()
    runner = ModelRunner(ARCHITECTURES[cfg.arch](cfg, g, be), cfg, be, n_blocks, 16)
    sched = SchedulerConfig(16, 64, 16, n_blocks, max_pooled_tokens_per_step=64)
    if not cfg.causal:
        sched = encoder_scheduling(sched, n_ctx)
    return EngineCore(runner, frozenset(), n_ctx, sched)


def embed_edgellm(path: str | Path, inputs: list[list[int]], n_ctx: int = N_CTX) -> list[np.ndarray]:
    """Each input's pooled vector (pooling "rank": the head's outputs), after LLM()'s load checks."""
    engine = engine_core(path, n_ctx, sum(-(-len(x) // 16) for x in inputs) + 1)
    rids = [engine.add_embedding_request(list(x), group="all") for x in inputs]
    got: dict[str, np.ndarray] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.embedding is not None:
                got[out.request_id] = out.embedding
    return [got[r] for r in rids]


def embed_llamacpp(path: str | Path, inputs: list[list[int]], pooling: int, n_ctx: int = N_CTX) -> list[Any]:
    """llama.cpp's vectors for each input, every input its own sequence of a batched decode (as
    llama-server batches them): pooled [n_embd] (rank: [n_cls_out]), or per token [n, n_embd] with
    pooling 0 (none). Unnormalised. Mean pooling decodes two sequences at a time: llama.cpp 0.3.36 fails
    ggml_can_mul_mat in its mean pooling with three or more sequences in one decode."""
    import llama_cpp

    from edgellm.testing.oracle.llamacpp import without_extra_buffer_types

    without_extra_buffer_types()  # SIGILL in llama.cpp's AMX matmul on this VM otherwise
    per_decode = 2 if pooling == 1 else len(inputs)
    total = n_ctx * per_decode  # llama-cpp-python caps n_batch at n_ctx: one decode holds its inputs
    llm = llama_cpp.Llama(
        str(path), embedding=True, pooling_type=pooling, n_ctx=total, n_batch=total, n_ubatch=total,
        n_seq_max=per_decode, verbose=False,
    )  # fmt: skip
    n_embd = llm.n_embd()
    n_out = llama_cpp.llama_model_n_cls_out(llm.model) if pooling == 4 else n_embd
    out: list[Any] = []
    for start in range(0, len(inputs), per_decode):
        group = inputs[start : start + per_decode]
        llm._batch.reset()
        for i, ids in enumerate(group):
            llm._batch.add_sequence(ids, i, True)
        llm._ctx.kv_cache_clear()
        llm._ctx.decode(llm._batch)
        if pooling == 0:
            ptr = llama_cpp.llama_get_embeddings(llm._ctx.ctx)
            pos = 0
            for ids in group:
                rows = np.array(ptr[pos * n_embd : (pos + len(ids)) * n_embd], np.float32)
                out.append(rows.reshape(len(ids), n_embd))
                pos += len(ids)
        else:
            for i in range(len(group)):
                out.append(np.array(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, i)[:n_out], np.float32))
    llm.close()
    return out


def tokenize_llamacpp(path: str | Path, texts: list[str], add_special: bool = True) -> list[list[int]]:
    """llama.cpp's ids for each text, special-token text parsed with add_special (as llama-server
    tokenizes an input), not without (as it tokenizes a rerank prompt's query and document)."""
    import llama_cpp

    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    ids = [llm.tokenize(t.encode("utf-8"), add_bos=add_special, special=add_special) for t in texts]
    llm.close()
    return ids


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
