"""Dump llama.cpp's intermediate tensors for an oracle case: every f32 / f16 node of one batched decode of
the case's first N tokens, through llama.cpp's eval callback (cb_eval), into an .npz keyed by node name
(a name seen again gets __1, __2, ...: "Qcur-0" is the projection, "Qcur-0__2" the roped Q).

What it is for: running one edgellm kernel on llama.cpp's inputs for that op and comparing the outputs bit
for bit (docs/oracle_cases.md, "The quantized cases' residual", was found this way). Needs
llama-cpp-python 0.3.36 (never imported by the default test run); the ggml_tensor layout below is that
version's ggml.h.

Usage: python scripts/dump_llamacpp_tensors.py CASE N_TOKENS OUT.npz
"""

from __future__ import annotations

import ctypes
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgellm.testing.llamacpp_oracle import without_extra_buffer_types  # noqa: E402
from edgellm.testing.oracle_cases import CASES  # noqa: E402

GGML_MAX_SRC, GGML_MAX_NAME = 10, 64
DTYPES = {0: np.float32, 1: np.float16}  # ggml_type -> numpy; other types are skipped


class GgmlTensor(ctypes.Structure):
    _fields_ = [  # noqa: RUF012 - ctypes layout
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


def dump(case_name: str, n: int) -> dict[str, np.ndarray]:
    import llama_cpp.llama_cpp as ll

    store: dict[str, np.ndarray] = {}

    def on_tensor(t, ask, _user):  # noqa: ANN001, ANN202
        if ask:
            return True  # observe every node
        tt = ctypes.cast(t, ctypes.POINTER(GgmlTensor)).contents
        dtype = DTYPES.get(tt.type)
        if dtype is None or not tt.data:
            return True
        ne, nb = list(tt.ne), list(tt.nb)
        size = sum((ne[i] - 1) * nb[i] for i in range(4)) + np.dtype(dtype).itemsize
        raw = np.frombuffer(bytes((ctypes.c_char * size).from_address(tt.data)), np.uint8).view(dtype)
        arr = np.lib.stride_tricks.as_strided(raw, shape=ne[::-1], strides=nb[::-1]).copy()  # [ne3..ne0]
        name, key, i = tt.name.decode(), tt.name.decode(), 0
        while key in store:
            i += 1
            key = f"{name}__{i}"
        store[key] = arr
        return True

    callback = ll.ggml_backend_sched_eval_callback(on_tensor)
    case = CASES[case_name]
    with tempfile.TemporaryDirectory() as tmp:
        path = case.write(Path(tmp) / f"{case_name}.gguf")
        without_extra_buffer_types()
        model = ll.llama_model_load_from_file(str(path).encode(), ll.llama_model_default_params())
        cp = ll.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = case.n_ctx, 512, 512
        cp.n_threads = cp.n_threads_batch = 2
        cp.flash_attn_type = 0  # disabled, as the fixtures (llama_cpp.Llama's default)
        cp.cb_eval = callback
        ctx = ll.llama_init_from_model(model, cp)
        tokens = case.tokens(ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model)))[:n]
        batch = ll.llama_batch_init(n, 0, 1)
        batch.n_tokens = n
        for i, tok in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = int(tok), i, 1, 1
            batch.seq_id[i][0] = 0
        if ll.llama_decode(ctx, batch) != 0:
            sys.exit("llama_decode failed")
        ll.llama_batch_free(batch)
        ll.llama_free(ctx)
        ll.llama_model_free(model)
    store["tokens"] = tokens
    return store


def main() -> None:
    if len(sys.argv) != 4 or sys.argv[1] not in CASES:
        sys.exit(__doc__)
    store = dump(sys.argv[1], int(sys.argv[2]))
    np.savez_compressed(sys.argv[3], **store)
    print(f"{len(store) - 1} tensors -> {sys.argv[3]}")


if __name__ == "__main__":
    main()
