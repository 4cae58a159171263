"""Write llama.cpp's logits for the oracle cases (edgellm/testing/oracle_cases.py) to tests/fixtures/oracle/.

Needs llama-cpp-python 0.3.36 (the oracle; never imported by the default test run). For each case: write the
tiny GGUF to a temporary directory, score the case's tokens with llama.cpp in one batched pass (logits_all),
and again token by token (llama.cpp's own batched-vs-sequential drift: the floor of what "agrees" means),
and save <case>.npz: the tokens, the positions kept, llama.cpp's logits there (float32), the sha256 of the
GGUF bytes (the test rewrites the file and refuses a fixture whose file has drifted), and the drift.

Usage: python scripts/make_oracle_fixtures.py [CASE ...]   (default: every case)
       python scripts/make_oracle_fixtures.py --missing      (only the cases without a fixture)
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgellm.testing.llamacpp_oracle import without_extra_buffer_types  # noqa: E402
from edgellm.testing.oracle_cases import CASES, OracleCase, nmse  # noqa: E402

OUT_DIR = ROOT / "tests" / "fixtures" / "oracle"
N_BATCH = 512


def score_llamacpp(path: Path, case: OracleCase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens [n], batched logits [n, n_vocab], token-by-token logits [n, n_vocab]) from llama.cpp."""
    import llama_cpp

    without_extra_buffer_types()  # SIGILL in llama.cpp's AMX matmul on this VM otherwise
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=case.n_ctx,
        n_batch=N_BATCH,
        n_ubatch=N_BATCH,
        n_threads=2,
        logits_all=True,
        verbose=False,
        seed=0,
    )
    tokens = case.tokens(llm.n_vocab())
    ids = tokens.tolist()
    llm.reset()
    llm.eval(ids)
    batched = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.reset()
    for t in ids:
        llm.eval([t])
    single = np.array(llm.scores[: len(ids)], dtype=np.float32)
    return tokens, batched, single


def make(name: str) -> str:
    import llama_cpp

    case = CASES[name]
    with tempfile.TemporaryDirectory() as tmp:
        path = case.write(Path(tmp) / f"{name}.gguf")
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        t0 = time.perf_counter()
        tokens, batched, single = score_llamacpp(path, case)
        seconds = time.perf_counter() - t0
    pos = case.fixture_positions()
    drift = nmse(single[pos], batched[pos])
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        OUT_DIR / f"{name}.npz",
        tokens=tokens,
        positions=pos,
        logits=batched[pos],
        gguf_sha256=np.str_(sha),
        llamacpp_drift_nmse=np.float64(drift),
        generator=np.str_(f"llama-cpp-python {llama_cpp.__version__}, n_batch {N_BATCH}, 2 threads"),
    )
    return f"{name}: drift (batched vs token by token) NMSE {drift:.2e}, {seconds:.1f} s"


def main() -> None:
    args = sys.argv[1:]
    if args == ["--missing"]:
        args = [n for n in CASES if not (OUT_DIR / f"{n}.npz").exists()]
    unknown = [a for a in args if a not in CASES]
    if unknown:
        sys.exit(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(CASES)}")
    for name in args or list(CASES):
        print(make(name), flush=True)


if __name__ == "__main__":
    main()
