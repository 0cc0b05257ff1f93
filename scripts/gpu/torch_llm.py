#!/usr/bin/env python3
"""PyTorch + transformers side of the CUDA comparison, for the GPU machine.

Loads a Hugging Face directory written by
`cargo xtask convert gguf-to-safetensors MODEL.gguf DIR --dtype f32` (the same weights as the
GGUF that `sapient --device cuda` runs) and prints one JSON object:

- prefill tokens/s for `--pp` tokens and decode tokens/s for `--tg` tokens, with the same
  synthetic prompt as `cargo xtask bench llm` (token i is (i * 7919 + 13) % vocab) and decode
  starting from token 1 on an empty cache, median of `--reps`;
- with `--greedy FILE` (tests/data/llama/llamacpp_greedy.json), the greedy continuation of
  each raw prompt (`--n` tokens: ids and text) and the first step's logits summary (top-5 ids
  and values), to compare with ours token for token and within a logits tolerance.

`MODEL` may also be a GGUF file, which transformers dequantizes (needs the `gguf` package).
Usage: python3 scripts/gpu/torch_llm.py DIR_OR_GGUF --dtype bf16 --greedy tests/data/llama/llamacpp_greedy.json
"""
import argparse
import json
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def where(model):
    """(directory, extra from_pretrained arguments) for a directory or a GGUF file."""
    if model.endswith(".gguf"):
        return os.path.dirname(os.path.abspath(model)), {"gguf_file": os.path.basename(model)}
    return model, {}


def load(model_dir, dtype):
    d, extra = where(model_dir)
    try:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, **extra)
    except TypeError:  # transformers < 4.56 calls it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=dtype, **extra)
    return model.to("cuda").eval()


def timed(f):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = f()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


@torch.inference_mode()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--greedy", help="JSON list of {prompt, ...} (raw prompts)")
    ap.add_argument("--n", type=int, default=64)
    a = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    model = load(a.model_dir, dtype)
    vocab = model.config.vocab_size
    res = {"model_dir": a.model_dir, "dtype": a.dtype, "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__}

    prompt = torch.tensor([[(i * 7919 + 13) % vocab for i in range(a.pp)]], device="cuda")
    start = torch.tensor([[1]], device="cuda")
    gen = dict(do_sample=False, max_new_tokens=a.tg, min_new_tokens=a.tg, pad_token_id=0)
    model(prompt)  # warm-up (kernel selection, allocator)
    model.generate(start, **gen)
    pp, tg = [], []
    for _ in range(a.reps):
        _, s = timed(lambda: model(prompt))
        pp.append(a.pp / s)
        out, s = timed(lambda: model.generate(start, **gen))
        assert out.shape[1] == a.tg + 1, out.shape
        tg.append(a.tg / s)
    res.update(pp=a.pp, tg=a.tg, pp_tok_s=statistics.median(pp), tg_tok_s=statistics.median(tg))

    if a.greedy:
        d, extra = where(a.model_dir)
        tok = AutoTokenizer.from_pretrained(d, **extra)
        cases = []
        for case in json.load(open(a.greedy)):
            ids = tok(case["prompt"], return_tensors="pt").input_ids.to("cuda")
            logits = model(ids).logits[0, -1].float()
            top = torch.topk(logits, 5)
            out = model.generate(ids, do_sample=False, max_new_tokens=a.n, min_new_tokens=a.n, pad_token_id=0)
            new = out[0, ids.shape[1]:].tolist()
            cases.append({"prompt": case["prompt"], "prompt_ids": ids[0].tolist(), "ids": new,
                          "text": tok.decode(new), "top5_ids": top.indices.tolist(),
                          "top5_logits": [round(v, 4) for v in top.values.tolist()]})
        res["greedy"] = cases
    print(json.dumps(res))


if __name__ == "__main__":
    main()
