#!/bin/bash
# SAPIENT on a GPU machine: SmolLM2-135M Q4_1 through `sapient --device cuda` (bf16 and f32
# activations) and on the same machine's CPU, against PyTorch + transformers on the same GGUF
# (scripts/gpu/torch_llm.py; transformers reads the GGUF with the `gguf` package, a wheel in
# .whl/). Run from the repository root with $OUT set to a folder for the outputs, after
# `scripts/gpu-build.sh` on a build machine: the GGUF at /tmp/m/model.gguf (or in two pieces,
# /tmp/m/a and .gpu/b, where what can be copied to the GPU machine at once is limited), and
# the stripped binary xz-compressed at .gpu/sapient.xz.
set -u
M=/tmp/m/model.gguf
[ -f $M ] || cat /tmp/m/a .gpu/b > $M
echo "sha256 $(sha256sum $M | cut -c1-16)  size $(stat -c %s $M)"
xz -dc .gpu/sapient.xz > /tmp/m/sapient && chmod +x /tmp/m/sapient
S=/tmp/m/sapient
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
P="Once upon a time, in a small village,"
for dev in "cuda" "cuda --dtype f32" "cpu"; do
  echo "== sapient generate --device $dev (256 tokens)"
  timeout 120 $S generate --model $M --device $dev --raw "$P" -n 256 --stats > $OUT/gen-${dev// /_}.txt 2>&1
  tail -4 $OUT/gen-${dev// /_}.txt
done
python3 - <<'PY' > $OUT/prompts.txt
import json; [print(c["prompt"]) for c in json.load(open("tests/data/llama/llamacpp_greedy.json"))]
PY
for dev in "cuda" "cuda --dtype f32"; do
  i=0
  while read -r p; do
    timeout 60 $S generate --model $M --device $dev --raw "$p" -n 64 > $OUT/g64-${dev// /_}-$i.txt 2>/dev/null
    i=$((i+1))
  done < $OUT/prompts.txt
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
for dt in bf16 f32; do
  PYTHONUNBUFFERED=1 timeout 240 python3 scripts/gpu/torch_llm.py $M --dtype $dt --pp 32 --tg 256 --reps 3 \
    --greedy tests/data/llama/llamacpp_greedy.json > $OUT/torch-$dt.json 2> $OUT/torch-$dt.err
  echo "torch $dt rc=$?"; tail -c 300 $OUT/torch-$dt.err
done
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
prompts = [l.rstrip("\n") for l in open(f"{out}/prompts.txt")]
for dt, dev in [("bf16", "cuda"), ("f32", "cuda_--dtype_f32")]:
    try:
        t = json.load(open(f"{out}/torch-{dt}.json"))
    except Exception as e:
        print("torch", dt, "missing:", e); continue
    print(f"torch {dt}: prefill {t['pp_tok_s']:.1f} tok/s ({t['pp']}), decode {t['tg_tok_s']:.1f} tok/s ({t['tg']})")
    for i, c in enumerate(t["greedy"]):
        ours = open(f"{out}/g64-{dev}-{i}.txt").read()
        theirs = c["text"]
        k = 0
        while k < min(len(ours), len(theirs)) and ours[k] == theirs[k]:
            k += 1
        print(f"  {dt} prompt {i}: same first {k} chars of ours {len(ours)} / torch {len(theirs)}")
PY
