#!/usr/bin/env bash
# One-shot check of the CUDA backend on a GPU machine with no network (the lent H200: Python 3.12, numba and
# numba-cuda preinstalled, 10 minutes per command). Run from the repo root:
#
#   bash scripts/gpu/gpu_check.sh          # on the GPU: at most ~8 minutes (per-step timeouts below)
#   bash scripts/gpu/gpu_check.sh --sim    # here: the same flow in the Numba CUDA simulator, tiny shapes
#
# 1. installs the carried wheels ($WHEELS, default .gpu_wheels/, filled by scripts/gpu/gpu_wheels.py;
#    git-ignored) into a fresh --target folder, offline (--no-index --no-deps), ahead of the machine's
#    own packages;
# 2. prints numba / numba-cuda / CUDA driver and runtime versions;
# 3. writes real-shape synthetic GGUFs on the machine (SmolLM2- and Gemma-3-shaped:
#    edgellm/testing/real_shapes.py), so nothing large travels;
# 4. compares CUDA against the CPU backend on them (logits NMSE, greedy tokens up to the first near-tie);
# 5. benchmarks batch-1 prefill and decode, and decode at 16 and 64 sequences in flight;
#    then batch-1 decode at a 4096-token context with split-K attention on and off (same tokens? speedup),
#    and decode replayed from CUDA graphs against plain launches at 1 and 16 in flight (GPU only);
# 6. profiles launches and per-kernel GPU time at batch-1 decode;
# 7. runs the CUDA test files for real (EDGELLM_CUDA_TESTS=gpu).
# Every step is its own process under `timeout`; kernels compile once (cache=True, one NUMBA_CACHE_DIR per
# run). STEPS="models compare" runs a subset. All figures go to one JSON: $OUT/gpu_check.json (OUT defaults to
# ./gpu_check_out). Exit status 0 only when every step ended well, the greedy tokens agreed and the
# tests passed.
set -uo pipefail
SIM=0
[ "${1:-}" = "--sim" ] && SIM=1
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.gpu_wheels}
OUT=${OUT:-gpu_check_out}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/edgellm_gpu_check.XXXXXX")
# seconds per step; they sum to 540 (+ the wheel install): inside one 10-minute command
declare -A LIMIT=([versions]=20 [models]=75 [compare]=130 [bench]=95 [splitk]=45 [graphs]=40 [profile]=45
  [tests]=90)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ORIG_PATH=${PYTHONPATH:-}
SITE=""
ARGS=(--work "$WORK")
if [ $SIM = 1 ]; then
  export NUMBA_ENABLE_CUDASIM=1
  ARGS+=(--sim)
  # the simulator's steps are one-core Python; the default test run starts this beside the rest of the
  # suite at a low priority (tests/background_runs.py): the GPU's limits, scaled (GPU_CHECK_TIME_SCALE)
  for k in "${!LIMIT[@]}"; do LIMIT[$k]=$((LIMIT[$k] * ${GPU_CHECK_TIME_SCALE:-4})); done
else
  export NUMBA_CACHE_DIR=$WORK/numba_cache  # fresh: no kernel compiled from other sources is reused
fi

STEPS=${STEPS:-versions models compare bench splitk graphs profile tests}  # a rerun can take a subset (models is needed)
step() {  # step NAME CMD...: run under the step's timeout, record "name rc limit seconds"
  local name=$1 t0 rc
  shift
  [[ " $STEPS " == *" $name "* ]] || return 0
  echo "== $name (timeout ${LIMIT[$name]} s) =="
  t0=$EPOCHREALTIME
  timeout -k 5 "${LIMIT[$name]}" "$@"
  rc=$?
  echo "$name $rc ${LIMIT[$name]} $(awk "BEGIN { print $EPOCHREALTIME - $t0 }")" >>"$WORK/steps.tsv"
  [ $rc = 0 ] || echo "!! step $name ended with status $rc (124: timeout)"
}

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "== wheels: $(cd "$WHEELS" && ls -- *.whl | tr '\n' ' ')"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$WHEELS"/*.whl \
    || { echo "!! wheel install failed"; exit 3; }
  SITE=":$WORK/site"
else
  echo "== no wheels in $WHEELS: using the installed packages"
fi
export PYTHONPATH="$PWD$SITE${ORIG_PATH:+:$ORIG_PATH}"  # the carried versions win over the machine's
command -v nvidia-smi >/dev/null && nvidia-smi -L

step versions $PY scripts/gpu/gpu_check.py versions "${ARGS[@]}"
# the two models are written in parallel (the Gemma-shaped one is ~250 MB)
step models bash -c '"$0" scripts/gpu/gpu_check.py models --models smollm2 "$@" & a=$!
  "$0" scripts/gpu/gpu_check.py models --models gemma3 "$@" & b=$!
  wait $a; ra=$?; wait $b; exit $((ra | $?))' "$PY" "${ARGS[@]}"
step compare $PY scripts/gpu/gpu_check.py compare "${ARGS[@]}"
step bench $PY scripts/gpu/gpu_check.py bench "${ARGS[@]}"
step splitk $PY scripts/gpu/gpu_check.py splitk "${ARGS[@]}"
step graphs $PY scripts/gpu/gpu_check.py graphs "${ARGS[@]}"
step profile $PY scripts/gpu/gpu_check.py profile "${ARGS[@]}"
step tests $PY scripts/gpu/gpu_check.py tests --timeout $((LIMIT[tests] - 5)) "${ARGS[@]}"
$PY scripts/gpu/gpu_check.py merge --out "$OUT/gpu_check.json" "${ARGS[@]}" >/dev/null || exit 4
$PY - "$OUT/gpu_check.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
bad = [n for n, s in r["steps"].items() if s["rc"] != 0]
bad += [f"compare:{m}" for m, c in r.get("compare", {}).items() if not c["greedy_equal"]]
bad += ["tests"] if "tests" in r["steps"] and r.get("tests", {}).get("returncode", 1) != 0 else []
bad += [f"splitk:{m}" for m, c in r.get("splitk", {}).items() if not c["logits_nmse"] < 1e-4]
print(json.dumps({k: r[k] for k in ("steps", "versions") if k in r}, indent=1))
for m, b in r.get("bench", {}).items():
    d = b["decode_b1"]
    flights = ", ".join(f"{k[10:]} in flight {v['aggregate_tok_s']:.0f} tok/s" for k, v in b.items() if k.startswith("in_flight_"))
    print(f"{m}: decode b1 {d['tok_s']:.1f} tok/s (bound {b['bandwidth_bound_tok_s_b1']:.0f}), "
          f"{d['launches_per_token']:.0f} launches, {d['host_to_device_copies_per_token']:g}+{d['device_to_host_copies_per_token']:g} copies/token; "
          f"prefill {b['prefill_tok_s']:.0f} tok/s; {flights}")
for m, c in r.get("splitk", {}).items():
    print(f"{m}: decode b1 at {c['context']} keys, split-K {c['speedup']:.2f}x unsplit "
          f"(attention {c['attention_gpu_us_per_token_split']:.0f} vs {c['attention_gpu_us_per_token_unsplit']:.0f} "
          f"us/token), logits NMSE {c['logits_nmse']:.1e}, same tokens: {c['same_tokens']}")
for m, g in r.get("graphs", {}).items():
    for k, c in g.items():
        if k.startswith("batch_"):
            bad += [] if c["same_tokens"] else [f"graphs:{m}:{k}"]
            print(f"{m}: {k[6:]} in flight, CUDA graphs {c['speedup']:.2f}x plain launches "
                  f"({c['launches_per_step']['plain']:.0f} launches/step), same tokens: {c['same_tokens']}")
print("FAILED: " + ", ".join(bad) if bad else "all steps passed")
sys.exit(1 if bad else 0)
PYEOF
