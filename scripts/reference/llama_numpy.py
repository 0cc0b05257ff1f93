#!/usr/bin/env python3
"""Independent numpy reference of a LLaMA-family forward pass, read straight from a GGUF.

Usage: llama_numpy.py MODEL.gguf IDS [--greedy N] [--json OUT]
IDS is a comma-separated list of token ids. Prints the greedy continuation and writes the
last-position logits (and a few positions) to OUT when asked.

Written from the GGUF conventions (llama.cpp): arch `llama` stores Q/K rows permuted for
interleaved ("NORM") RoPE, `qwen2` uses rotate-half ("NEOX") RoPE and has Q/K/V biases.
Runs in float64 on dequantized weights: it is slow but exact up to the weights' own rounding.
Needs numpy and gguf (keep them in a venv outside the repository).
"""
import argparse, json, sys
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def load(path):
    r = GGUFReader(path)
    f = r.fields
    def val(k, d=None):
        if k not in f:
            return d
        fld = f[k]
        v = fld.parts[fld.data[0]]
        if fld.types[0].name == 'STRING':
            return bytes(v).decode()
        return v.tolist()[0]
    arch = val('general.architecture')
    hp = dict(
        arch=arch,
        n_layer=val(f'{arch}.block_count'),
        n_embd=val(f'{arch}.embedding_length'),
        n_head=val(f'{arch}.attention.head_count'),
        n_kv=val(f'{arch}.attention.head_count_kv'),
        eps=val(f'{arch}.attention.layer_norm_rms_epsilon'),
        theta=val(f'{arch}.rope.freq_base', 10000.0),
    )
    W = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        shape = tuple(reversed([int(x) for x in t.shape]))
        W[t.name] = a.reshape(shape)
    return hp, W


def rope(x, pos, theta, interleaved):
    # x: [T, H, D]
    T, H, D = x.shape
    inv = 1.0 / theta ** (np.arange(0, D, 2) / D)
    ang = np.outer(pos, inv)  # [T, D/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out
    h = D // 2
    x0, x1 = x[..., :h], x[..., h:]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)


def forward(hp, W, ids):
    T = len(ids)
    nh, nkv, d = hp['n_head'], hp['n_kv'], hp['n_embd'] // hp['n_head']
    interleaved = hp['arch'] in ('llama', 'mistral')
    x = W['token_embd.weight'][ids]
    pos = np.arange(T)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    def norm(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + hp['eps']) * w
    def lin(v, name):
        y = v @ W[name + '.weight'].T
        if name + '.bias' in W:
            y = y + W[name + '.bias']
        return y
    for i in range(hp['n_layer']):
        p = f'blk.{i}.'
        h = norm(x, W[p + 'attn_norm.weight'])
        q = lin(h, p + 'attn_q').reshape(T, nh, d)
        k = lin(h, p + 'attn_k').reshape(T, nkv, d)
        v = lin(h, p + 'attn_v').reshape(T, nkv, d)
        q, k = rope(q, pos, hp['theta'], interleaved), rope(k, pos, hp['theta'], interleaved)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        att = np.einsum('thd,shd->hts', q, k) / np.sqrt(d) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum('hts,shd->thd', att, v).reshape(T, nh * d)
        x = x + lin(o, p + 'attn_output')
        h = norm(x, W[p + 'ffn_norm.weight'])
        g, u = lin(h, p + 'ffn_gate'), lin(h, p + 'ffn_up')
        x = x + lin(g / (1 + np.exp(-g)) * u, p + 'ffn_down')
    x = norm(x, W['output_norm.weight'])
    out = W['output.weight'] if 'output.weight' in W else W['token_embd.weight']
    return x @ out.T  # [T, vocab]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('model')
    ap.add_argument('ids')
    ap.add_argument('--greedy', type=int, default=0)
    ap.add_argument('--json')
    a = ap.parse_args()
    hp, W = load(a.model)
    ids = [int(x) for x in a.ids.split(',')]
    logits = forward(hp, W, ids)
    if a.json:
        last = logits[-1]
        top = np.argsort(-last)[:50]
        rng = np.random.default_rng(0)
        probe = sorted(rng.choice(len(last), 200, replace=False).tolist())
        json.dump({
            'model': a.model.split('/')[-1], 'ids': ids,
            'top50_ids': top.tolist(), 'top50_logits': last[top].tolist(),
            'probe_ids': probe, 'probe_logits_last': last[probe].tolist(),
            'probe_logits_pos5': logits[5][probe].tolist() if len(ids) > 5 else [],
            'mean_last': float(last.mean()), 'std_last': float(last.std()),
        }, open(a.json, 'w'), indent=1)
    gen = []
    for _ in range(a.greedy):
        t = int(np.argmax(logits[-1]))
        gen.append(t)
        ids.append(t)
        logits = forward(hp, W, ids)
    if gen:
        print(','.join(map(str, gen)))
    else:
        print(','.join(map(str, np.argsort(-logits[-1])[:10].tolist())))


if __name__ == '__main__':
    main()
