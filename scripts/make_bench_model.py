"""Write a 1B-class synthetic GGUF to benchmark on, or (--moe) a Qwen3-MoE-shaped one; never commit it.

Llama-3.2-1B shape (n_embd 2048, 16 layers, 32 query / 8 KV heads of 64, FFN 8192, rope base 500000,
rms eps 1e-5, tied output), SmolLM2's tokenizer metadata (vocabulary 49,152) copied from the catalog's
GGUF, random N(0, 0.02) F16 weights (norms = 1) written with gguf's GGUFWriter, then quantized by
llama.cpp's own quantizer (llama-cpp-python's `llama_model_quantize`). The weights are noise: compare
logits and speed, not text. Q4_K_M takes ~4 minutes on 2 cores and gives a ~669 MB file.

--moe: a qwen3moe file of Qwen3-30B-A3B's attention (32 query / 4 KV heads of 128, Q/K norms, rope base 1e6)
at hidden 2048 and 24 layers, each with 64 experts of FFN 768 of which 8 per token (MOE_SHAPE): ~15 GB at
F16 while it is written, ~5-6 GB at Q4_K_M (the active weights per token about a tenth of that).

Usage: python scripts/make_bench_model.py [--moe] [--out PATH] [--ftype Q4_K_M] [--layers N] [--seed 0]
Default output: the user's model cache (edgellm.catalog.models_dir()), bench-llama1b-<FTYPE>.gguf
(bench-qwen3moe-<FTYPE>.gguf with --moe).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

# Llama-3.2-1B's hyper-parameters (the vocabulary comes from the tokenizer source).
SHAPE = {
    "n_embd": 2048,
    "n_layers": 16,
    "n_heads": 32,
    "n_kv_heads": 8,
    "head_dim": 64,
    "n_ff": 8192,
    "rope_base": 500000.0,
    "rms_eps": 1e-5,
    "n_ctx_train": 131072,
}
# The MoE benchmark model (qwen3moe): Qwen3-30B-A3B's heads at a width and depth this machine holds
MOE_SHAPE = {
    "n_embd": 2048,
    "n_layers": 24,
    "n_heads": 32,
    "n_kv_heads": 4,
    "head_dim": 128,
    "n_ff": 6144,  # the dense width the file states (qwen3moe.feed_forward_length); no layer uses it
    "n_expert": 64,
    "n_expert_used": 8,
    "n_ff_exp": 768,
    "rope_base": 1e6,
    "rms_eps": 1e-6,
    "n_ctx_train": 40960,
}
TOKENIZER_SOURCE = "smollm2-135m"  # any catalog model with a BPE tokenizer; its tokenizer.* keys are copied


def copy_tokenizer(writer: gguf.GGUFWriter, source: Path) -> int:
    """Copy every tokenizer.* key of `source` into `writer`; returns the vocabulary size."""
    reader = gguf.GGUFReader(source)
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, field.types[0], sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, field.types[0])
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
    if not n_vocab:
        raise SystemExit(f"{source}: no tokenizer.ggml.tokens")
    return n_vocab


def write_f16(path: Path, n_layers: int, seed: int, s: dict | None = None) -> None:
    """The F16 model (norms and the MoE router F32), tensors generated one at a time as the writer
    streams them. s: SHAPE (a llama), or a shape with n_expert (MOE_SHAPE: a qwen3moe)."""
    from edgellm.catalog import resolve_model

    s = s or SHAPE
    moe = "n_expert" in s
    e, d, f = s["n_embd"], s["head_dim"], s["n_ff"]
    arch = "qwen3moe" if moe else "llama"
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"bench-{'qwen3moe' if moe else 'llama1b'} (random weights)")
    writer.add_block_count(n_layers)
    writer.add_context_length(s["n_ctx_train"])
    writer.add_embedding_length(e)
    writer.add_feed_forward_length(f)
    writer.add_head_count(s["n_heads"])
    writer.add_head_count_kv(s["n_kv_heads"])
    if moe:
        writer.add_key_length(d)
        writer.add_value_length(d)
        writer.add_expert_count(s["n_expert"])
        writer.add_expert_used_count(s["n_expert_used"])
        writer.add_expert_feed_forward_length(s["n_ff_exp"])
    else:
        writer.add_rope_dimension_count(d)
    writer.add_rope_freq_base(s["rope_base"])
    writer.add_layer_norm_rms_eps(s["rms_eps"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab = copy_tokenizer(writer, resolve_model(TOKENIZER_SOURCE))
    if not moe:
        writer.add_vocab_size(n_vocab)

    rng = np.random.default_rng(seed)
    # (name, [rows, cols] or [n]): ggml's shape reversed, as numpy holds the data
    tensors: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, e))]
    for i in range(n_layers):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", (e,)),
            (p + "attn_q.weight", (s["n_heads"] * d, e)),
            (p + "attn_k.weight", (s["n_kv_heads"] * d, e)),
            (p + "attn_v.weight", (s["n_kv_heads"] * d, e)),
            (p + "attn_output.weight", (e, s["n_heads"] * d)),
            (p + "ffn_norm.weight", (e,)),
        ]
        if moe:
            n_x, fe = s["n_expert"], s["n_ff_exp"]
            tensors += [
                (p + "attn_q_norm.weight", (d,)),
                (p + "attn_k_norm.weight", (d,)),
                (p + "ffn_gate_inp.weight", (n_x, e)),
                (p + "ffn_gate_exps.weight", (n_x, fe, e)),
                (p + "ffn_up_exps.weight", (n_x, fe, e)),
                (p + "ffn_down_exps.weight", (n_x, e, fe)),
            ]
        else:
            tensors += [
                (p + "ffn_gate.weight", (f, e)),
                (p + "ffn_up.weight", (f, e)),
                (p + "ffn_down.weight", (e, f)),
            ]
    tensors.append(("output_norm.weight", (e,)))
    if moe:  # Qwen3-30B-A3B has its own output matrix
        tensors.append(("output.weight", (n_vocab, e)))
    f32 = lambda name, shape: len(shape) == 1 or name.endswith("ffn_gate_inp.weight")  # noqa: E731
    # Header first (shapes and types are known without the data), then each tensor generated as it is
    # written, so no more than one tensor is in memory at a time.
    for name, shape in tensors:
        dtype = np.dtype(np.float32 if f32(name, shape) else np.float16)
        writer.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape in tensors:
        if len(shape) == 1:  # norms = 1
            writer.write_tensor_data(np.ones(shape, np.float32))
        else:  # N(0, 0.02) (an MoE layer's experts: 0.4 GB of float32 at MOE_SHAPE)
            w = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            writer.write_tensor_data(w if f32(name, shape) else w.astype(np.float16))
    writer.close()


def quantize(src: Path, dst: Path, ftype_name: str, threads: int) -> None:
    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name}", None)
    if ftype is None:
        raise SystemExit(f"unknown ftype {ftype_name!r} (llama_cpp has no LLAMA_FTYPE_MOSTLY_{ftype_name})")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed with code {rc}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="output GGUF (default: the user model cache)")
    ap.add_argument("--ftype", default="Q4_K_M", help="llama.cpp file type, e.g. Q4_K_M, Q4_0, Q8_0, F16")
    ap.add_argument("--moe", action="store_true", help="a Qwen3-MoE-shaped file (MOE_SHAPE) instead")
    ap.add_argument("--layers", type=int, help="layers (default: the shape's 16, or 24 with --moe)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--force", action="store_true", help="rewrite the output if it exists")
    args = ap.parse_args()
    ftype = args.ftype.upper()
    out = args.out
    if out is None:
        from edgellm.catalog import models_dir

        out = models_dir() / f"bench-{'qwen3moe' if args.moe else 'llama1b'}-{ftype}.gguf"
    shape = MOE_SHAPE if args.moe else SHAPE
    layers = args.layers or shape["n_layers"]
    if out.exists() and not args.force:
        print(f"{out} exists (--force rewrites it)")
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if ftype == "F16":
        write_f16(out, layers, args.seed, shape)
    else:
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            f16 = Path(tmp) / "f16.gguf"
            write_f16(f16, layers, args.seed, shape)
            print(f"F16 written in {time.perf_counter() - t0:.0f} s; quantizing to {ftype}", file=sys.stderr)
            partial = out.with_suffix(".partial")
            quantize(f16, partial, ftype, args.threads)
            partial.replace(out)  # a killed run leaves no file that looks finished
    print(f"{out}: {out.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
