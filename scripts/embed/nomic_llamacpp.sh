#!/usr/bin/env bash
# llama.cpp's embeddings of tests/data/embed/sentences.txt with nomic-embed-text-v1.5 (F16
# GGUF), one sentence per line, mean pooling, L2-normalised, written as little-endian f32
# (20 x 768) to tests/data/embed/nomic_llamacpp.f32.
#
# Usage: scripts/embed/nomic_llamacpp.sh LLAMA_BIN_DIR GGUF
# (llama.cpp built from the PyPI sdist by scripts/build-llamacpp.sh; the GGUF from
#  `cargo xtask fetch nomic-embed-text-v1.5`, under ~/.cache/sapient/models/.)
set -euo pipefail
bin=$1
gguf=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mktemp)
"$bin/llama-embedding" -m "$gguf" -f "$root/tests/data/embed/sentences.txt" \
    --pooling mean --embd-normalize 2 --embd-output-format json -c 2048 -b 2048 -ub 2048 \
    -t "$(nproc)" --no-warmup 2>/dev/null > "$out"
python3 - "$out" "$root/tests/data/embed/nomic_llamacpp.f32" <<'PY'
import json, struct, sys
d = json.load(open(sys.argv[1]))["data"]
d.sort(key=lambda e: e["index"])
with open(sys.argv[2], "wb") as f:
    for e in d:
        f.write(struct.pack(f"<{len(e['embedding'])}f", *e["embedding"]))
print(f"{len(d)} embeddings of {len(d[0]['embedding'])} values")
PY
rm -f "$out"
