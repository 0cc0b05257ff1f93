#!/usr/bin/env python3
"""Float64 numpy reference for nomic-embed-text-v1.5 (nomic-bert GGUF).

Reads the GGUF with the `gguf` package, tokenizes with the `tokenizers` library's
BertWordPieceTokenizer built from the GGUF vocabulary (llama.cpp's spelling undone: `▁word`
is a word-initial piece, others are `##` continuations), runs the encoder in float64
(post-norm blocks, NeoX rotary, SwiGLU) and mean-pools + L2-normalises.

Writes, for the sentences in tests/data/embed/sentences.txt:
  OUT/nomic_numpy_ids.json   token ids per sentence
  OUT/nomic_numpy.f32        embeddings, little-endian f32, 20 x 768

Usage: python3 scripts/embed/nomic_numpy.py GGUF SENTENCES OUTDIR
(venv outside the repo: pip install numpy gguf tokenizers)
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from tokenizers import BertWordPieceTokenizer

gguf_path, sentences_path, out = sys.argv[1:4]
r = GGUFReader(gguf_path)


def field(name):
    f = r.fields[name]
    if f.types and f.types[0].name == "ARRAY":
        return [bytes(f.parts[i]).decode() if f.types[-1].name == "STRING" else f.parts[i][0] for i in f.data]
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types[0].name == "STRING" else v[0]


arch = field("general.architecture")
assert arch == "nomic-bert", arch
d = int(field(f"{arch}.embedding_length"))
nh = int(field(f"{arch}.attention.head_count"))
nl = int(field(f"{arch}.block_count"))
eps = float(field(f"{arch}.attention.layer_norm_epsilon"))
base = float(field(f"{arch}.rope.freq_base"))
hd = d // nh

tensors = {}
for t in r.tensors:
    a = np.array(t.data)
    # gguf stores dims fastest-first: the numpy array is already [rows, cols] (out, in)
    tensors[t.name] = a.astype(np.float64).reshape([int(x) for x in reversed(t.shape)])

tokens = field("tokenizer.ggml.tokens")
vocab = {}
for i, t in enumerate(tokens):
    if t.startswith("[") and t.endswith("]"):
        s = t
    elif t.startswith("\u2581"):
        s = t[1:]
    else:
        s = "##" + t
    vocab.setdefault(s, i)
tok = BertWordPieceTokenizer(vocab, lowercase=True, strip_accents=None, clean_text=True, handle_chinese_chars=True)


def ln(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def rope(x):
    # x: [L, heads, hd], NeoX pairing (i, i + hd/2)
    L = x.shape[0]
    half = hd // 2
    inv = base ** (-2.0 * np.arange(half) / hd)
    ang = np.arange(L)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, a * s + b * c], -1)


def embed(ids):
    T = tensors
    x = T["token_embd.weight"][ids] + T["token_types.weight"][0]
    x = ln(x, T["token_embd_norm.weight"], T["token_embd_norm.bias"])
    L = len(ids)
    for i in range(nl):
        p = f"blk.{i}."
        qkv = x @ T[p + "attn_qkv.weight"].T
        q, k, v = (qkv[:, j * d:(j + 1) * d].reshape(L, nh, hd) for j in range(3))
        q, k = rope(q), rope(k)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = np.einsum("hqk,khd->qhd", s, v).reshape(L, d)
        x = ln(x + a @ T[p + "attn_output.weight"].T, T[p + "attn_output_norm.weight"], T[p + "attn_output_norm.bias"])
        up = x @ T[p + "ffn_up.weight"].T
        g = x @ T[p + "ffn_gate.weight"].T
        h = (g / (1 + np.exp(-g))) * up
        x = ln(x + h @ T[p + "ffn_down.weight"].T, T[p + "layer_output_norm.weight"], T[p + "layer_output_norm.bias"])
    e = x.mean(0)
    return e / np.linalg.norm(e)


sentences = [l.rstrip("\n") for l in open(sentences_path, encoding="utf-8") if l.strip()]
ids = [tok.encode(s).ids for s in sentences]
embs = np.stack([embed(i) for i in ids]).astype("<f4")
json.dump(ids, open(f"{out}/nomic_numpy_ids.json", "w"))
embs.tofile(f"{out}/nomic_numpy.f32")
print(f"{len(sentences)} sentences, {embs.shape[1]} dims, tokens per sentence {[len(i) for i in ids]}")
