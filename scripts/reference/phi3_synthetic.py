#!/usr/bin/env python3
"""A synthetic Phi-3 checkpoint (Phi3ForCausalLM's layer structure, small, random weights) and
its references, for xtask/src/convert/synthetic.rs: tests/data/llama/phi3_synthetic.json.
Same weights scheme and tools as qwen3_synthetic.py (run the same way, with its arguments).

Phi-3 as transformers' modeling_phi3 defines it: one fused `qkv_proj` (query rows, then key,
then value), one fused `gate_up_proj` (gate rows first; SwiGLU), RMSNorm, grouped-query
attention, rotate-half RoPE over the first `partial_rotary_factor` of each head (0.75, as
Phi-4-mini; Phi-3-mini rotates all of it), an untied `lm_head`. llama.cpp keeps both fused
projections (`attn_qkv`, `ffn_up`).
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen3_synthetic import attend, make_references, rms, rope_fn, swiglu  # noqa: E402

H, I, LAYERS, HEADS, KV = 64, 160, 2, 4, 2
HD = H // HEADS
ROT = int(HD * 0.75)
THETA, EPS = 10_000.0, 1e-5
PROMPT = 'def fizzbuzz(n):\n    for i in range(1, n + 1):\n        print(i) # The quick brown fox.'


def tensors(vocab):
    """(name, shape, offset, scale) in index order (the index seeds the values)."""
    lin = lambda i: (0.0, math.sqrt(3.0 / i))
    out = [('model.embed_tokens.weight', (vocab, H), 0.0, 1.0)]
    for l in range(LAYERS):
        p = f'model.layers.{l}.'
        out += [
            (p + 'input_layernorm.weight', (H,), 1.0, 0.2),
            (p + 'self_attn.qkv_proj.weight', ((HEADS + 2 * KV) * HD, H)) + lin(H),
            (p + 'self_attn.o_proj.weight', (H, HEADS * HD)) + lin(HEADS * HD),
            (p + 'post_attention_layernorm.weight', (H,), 1.0, 0.2),
            (p + 'mlp.gate_up_proj.weight', (2 * I, H)) + lin(H),
            (p + 'mlp.down_proj.weight', (H, I)) + lin(I),
        ]
    out.append(('model.norm.weight', (H,), 1.0, 0.2))
    out.append(('lm_head.weight', (vocab, H), 0.0, math.sqrt(3.0 / H)))
    return out


def forward(W, ids):
    x = W['model.embed_tokens.weight'][ids].astype(np.float64)
    T = len(ids)
    rope = rope_fn(T, THETA ** (-np.arange(0, ROT, 2, dtype=np.float64) / ROT))
    for l in range(LAYERS):
        p = lambda n: W[f'model.layers.{l}.{n}'].astype(np.float64)
        h = rms(x, p('input_layernorm.weight'), EPS)
        qkv = h @ p('self_attn.qkv_proj.weight').T
        q = rope(qkv[:, :HEADS * HD].reshape(T, HEADS, HD))
        k = rope(qkv[:, HEADS * HD:(HEADS + KV) * HD].reshape(T, KV, HD))
        v = qkv[:, (HEADS + KV) * HD:].reshape(T, KV, HD)
        x = x + attend(q, k, v) @ p('self_attn.o_proj.weight').T
        h = rms(x, p('post_attention_layernorm.weight'), EPS)
        gu = h @ p('mlp.gate_up_proj.weight').T
        x = x + swiglu(gu[:, :I], gu[:, I:]) @ p('mlp.down_proj.weight').T
    x = rms(x, W['model.norm.weight'].astype(np.float64), EPS)
    return x @ W['lm_head.weight'].astype(np.float64).T


def main():
    make_references('phi3_synthetic', tensors, lambda vocab: {
        'architectures': ['Phi3ForCausalLM'], 'model_type': 'phi3', 'hidden_size': H, 'intermediate_size': I,
        'num_hidden_layers': LAYERS, 'num_attention_heads': HEADS, 'num_key_value_heads': KV,
        'partial_rotary_factor': 0.75, 'rms_norm_eps': EPS, 'rope_theta': THETA, 'rope_scaling': None,
        'max_position_embeddings': 4096, 'original_max_position_embeddings': 4096, 'sliding_window': None,
        'vocab_size': vocab, 'tie_word_embeddings': False, 'hidden_act': 'silu', 'torch_dtype': 'float32',
        'gguf_tokenizer_pre': 'qwen2',
    }, forward, PROMPT)


if __name__ == '__main__':
    main()
