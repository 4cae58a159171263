#!/usr/bin/env bash
# Alternate llama.cpp (shared/bench/llamacpp_bench.py) and `edgellm bench --json` on the same file and
# threads, N rounds; prints one JSON line per run. Usage: scripts/compare_llamacpp.sh MODEL [ROUNDS] [THREADS]
set -euo pipefail
model=${1:?model name}; rounds=${2:-5}; threads=${3:-2}
path=$(python -c "from edgellm.catalog import resolve_model; print(resolve_model('$model'))")
bench=$(dirname "$0")/../../shared/bench/llamacpp_bench.py
for i in $(seq "$rounds"); do
  echo "{\"impl\": \"llama.cpp\", \"round\": $i, \"result\": $(python "$bench" "$path" 128 128 "$threads")}"
  echo "{\"impl\": \"edgellm\", \"round\": $i, \"result\": $(python -m edgellm bench "$model" --prompt-tokens 128 \
    --gen-tokens 128 --repeat 1 --threads "$threads" --ctx 2048 --json)}"
done
