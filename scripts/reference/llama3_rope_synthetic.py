#!/usr/bin/env python3
"""A synthetic Llama 3.2-style checkpoint (llama3 RoPE scaling, tied embeddings, no
output.weight) and its references, for xtask/src/convert/synthetic.rs:
tests/data/llama/llama3_rope_synthetic.json. Same weights scheme and tools as
qwen3_synthetic.py (run the same way, with its arguments); the prompt (~150 tokens) is longer
than the checkpoint's original_max_position_embeddings (64), so the scaling matters.
RoPE as transformers' `_compute_llama3_parameters` (rotate-half on the HF weights); the GGUF
from `cargo xtask convert` carries it as llama.cpp's `rope_freqs.weight` divisors.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen3_synthetic import attend, make_references, rms, rope_fn, swiglu  # noqa: E402

H, I, LAYERS, HEADS, KV = 64, 160, 2, 4, 2
HD = H // HEADS
THETA, EPS = 500_000.0, 1e-5
SCALING = {'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
           'original_max_position_embeddings': 64}
PROMPT = ' '.join(f'Item {i}: the value is {i * 7 % 13}.' for i in range(16))


def tensors(vocab):
    out = [('model.embed_tokens.weight', (vocab, H), 0.0, 1.0)]
    lin = lambda i: (0.0, math.sqrt(3.0 / i))
    for l in range(LAYERS):
        p = f'model.layers.{l}.'
        out += [
            (p + 'input_layernorm.weight', (H,), 1.0, 0.2),
            (p + 'self_attn.q_proj.weight', (HEADS * HD, H)) + lin(H),
            (p + 'self_attn.k_proj.weight', (KV * HD, H)) + lin(H),
            (p + 'self_attn.v_proj.weight', (KV * HD, H)) + lin(H),
            (p + 'self_attn.o_proj.weight', (H, HEADS * HD)) + lin(HEADS * HD),
            (p + 'post_attention_layernorm.weight', (H,), 1.0, 0.2),
            (p + 'mlp.gate_proj.weight', (I, H)) + lin(H),
            (p + 'mlp.up_proj.weight', (I, H)) + lin(H),
            (p + 'mlp.down_proj.weight', (H, I)) + lin(I),
        ]
    out.append(('model.norm.weight', (H,), 1.0, 0.2))
    return out


def inv_freq():
    inv = THETA ** (-np.arange(0, HD, 2, dtype=np.float64) / HD)
    f, lo, hi, old = SCALING['factor'], SCALING['low_freq_factor'], SCALING['high_freq_factor'], \
        SCALING['original_max_position_embeddings']
    wavelen = 2 * math.pi / inv
    smooth = (old / wavelen - lo) / (hi - lo)
    return np.where(wavelen < old / hi, inv, np.where(wavelen > old / lo, inv / f, (1 - smooth) * inv / f + smooth * inv))


def forward(W, ids):
    x = W['model.embed_tokens.weight'][ids].astype(np.float64)
    T = len(ids)
    rope = rope_fn(T, inv_freq())
    for l in range(LAYERS):
        p = lambda n: W[f'model.layers.{l}.{n}'].astype(np.float64)
        h = rms(x, p('input_layernorm.weight'), EPS)
        q = rope((h @ p('self_attn.q_proj.weight').T).reshape(T, HEADS, HD))
        k = rope((h @ p('self_attn.k_proj.weight').T).reshape(T, KV, HD))
        v = (h @ p('self_attn.v_proj.weight').T).reshape(T, KV, HD)
        x = x + attend(q, k, v) @ p('self_attn.o_proj.weight').T
        h = rms(x, p('post_attention_layernorm.weight'), EPS)
        x = x + swiglu(h @ p('mlp.gate_proj.weight').T, h @ p('mlp.up_proj.weight').T) @ p('mlp.down_proj.weight').T
    x = rms(x, W['model.norm.weight'].astype(np.float64), EPS)
    return x @ W['model.embed_tokens.weight'].astype(np.float64).T


def main():
    make_references('llama3_rope_synthetic', tensors, lambda vocab: {
        'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'hidden_size': H, 'intermediate_size': I,
        'num_hidden_layers': LAYERS, 'num_attention_heads': HEADS, 'num_key_value_heads': KV, 'head_dim': HD,
        'rms_norm_eps': EPS, 'rope_theta': THETA, 'rope_scaling': SCALING, 'max_position_embeddings': 512,
        'vocab_size': vocab, 'tie_word_embeddings': True, 'attention_bias': False, 'hidden_act': 'silu',
        'torch_dtype': 'float32', 'gguf_tokenizer_pre': 'qwen2',
    }, forward, PROMPT, min_ids=2 * SCALING['original_max_position_embeddings'])


if __name__ == '__main__':
    main()
