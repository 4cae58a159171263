#!/usr/bin/env bash
# Alternate llama.cpp (scripts/bench/llamacpp_bench.py) and `edgellm bench --json` on the same file and
# threads, N rounds; prints one JSON line per run. MODEL: a catalog name or a GGUF path.
# llama.cpp's line gets peak_rss_mb (its max RSS, from /usr/bin/time where installed); edgellm's JSON has
# its own (front-end + engine core process).
# Usage: scripts/bench/compare_llamacpp.sh MODEL [ROUNDS] [THREADS] [GEN_TOKENS (default 128)]
set -euo pipefail
model=${1:?model name}; rounds=${2:-5}; threads=${3:-2}; gen=${4:-128}
path=$(python -c "from edgellm.models.catalog import resolve_model; print(resolve_model('$model'))")
bench=$(dirname "$0")/llamacpp_bench.py
rss_file=$(mktemp)
trap 'rm -f "$rss_file"' EXIT
for i in $(seq "$rounds"); do
  if [ -x /usr/bin/time ]; then
    result=$(/usr/bin/time -o "$rss_file" -f "%M" python "$bench" "$path" 128 "$gen" "$threads")
    result="${result%\}}, \"peak_rss_mb\": $(( $(tail -1 "$rss_file") / 1024 ))}"
  else
    result=$(python "$bench" "$path" 128 "$gen" "$threads")
  fi
  echo "{\"impl\": \"llama.cpp\", \"round\": $i, \"result\": $result}"
  echo "{\"impl\": \"edgellm\", \"round\": $i, \"result\": $(python -m edgellm bench "$model" --prompt-tokens 128 \
    --gen-tokens "$gen" --repeat 1 --threads "$threads" --ctx 2048 --json)}"
done
