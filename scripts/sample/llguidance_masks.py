#!/usr/bin/env python3
"""Token-mask timings of llguidance (PyPI `llguidance`) on the documents of
`cargo xtask bench sample`, as the reference the bench compares against.

Usage: llguidance_masks.py IN.json OUT.json

IN.json (written by `cargo xtask bench sample --vs-llguidance PYTHON`):
  {"tokenizer": "path/to/tokenizer.json", "eos": [ids], "workloads": [
     {"name": ..., "kind": "json_schema" | "regex" | "json", "grammar": schema or regex,
      "tokens": [the document's token ids]}]}

For each workload: the grammar is compiled (`LLMatcher(...)`, compact JSON: no
whitespace, as SAPIENT's default), then the document is replayed token by token; at each
step the mask is computed into a preallocated bitmask (`fill_next_token_bitmask`, the
call inference engines use), timed with perf_counter_ns, checked to hold the document's
token, and the token consumed. OUT.json gets per workload the compile time and the mask
times in microseconds (median, p99, max, mean), one thread.
"""
import json
import sys
import time

import llguidance
import llguidance.numpy
import numpy as np


def q(v, p):
    s = sorted(v)
    return s[round((len(s) - 1) * p)]


def main(inp, out):
    cfg = json.load(open(inp, encoding="utf-8"))
    t = time.perf_counter()
    tok = llguidance.LLTokenizer(cfg["tokenizer"], eos_token=cfg["eos"])
    tok_ms = (time.perf_counter() - t) * 1e3
    results = []
    for w in cfg["workloads"]:
        if w["kind"] == "json_schema":
            grammar = llguidance.LLMatcher.grammar_from_json_schema(w["grammar"], defaults={"whitespace_flexible": False})
        elif w["kind"] == "json":
            grammar = llguidance.LLMatcher.grammar_from_json_schema({}, defaults={"whitespace_flexible": False})
        else:
            grammar = llguidance.LLMatcher.grammar_from_regex(w["grammar"])
        t = time.perf_counter_ns()
        m = llguidance.LLMatcher(tok, grammar, log_level=1)
        compile_us = (time.perf_counter_ns() - t) / 1e3
        if m.is_error():
            raise SystemExit(f"{w['name']}: llguidance error: {m.get_error()}")
        bitmask = llguidance.numpy.allocate_token_bitmask(1, tok.vocab_size)
        times = []
        for i, token in enumerate(w["tokens"]):
            t = time.perf_counter_ns()
            llguidance.numpy.fill_next_token_bitmask(m, bitmask, 0)
            times.append((time.perf_counter_ns() - t) / 1e3)
            allowed = (int(bitmask[0, token // 32]) >> (token % 32)) & 1
            if not allowed:
                raise SystemExit(f"{w['name']}: token {i} ({token}) of the document is not in llguidance's mask")
            if not m.consume_token(token):
                raise SystemExit(f"{w['name']}: llguidance rejected token {i} ({token}): {m.get_error()}")
        results.append({
            "name": w["name"],
            "tokens": len(w["tokens"]),
            "compile_us": compile_us,
            "accepting": m.is_accepting(),
            "mask_us": {"median": q(times, 0.5), "p99": q(times, 0.99), "max": max(times), "mean": sum(times) / len(times)},
        })
    json.dump({"llguidance": llguidance.__version__, "tokenizer_ms": tok_ms, "workloads": results}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
