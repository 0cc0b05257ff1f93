#!/usr/bin/env python3
"""llguidance (PyPI `llguidance`) on a corpus of JSON schemas, as the reference of
`cargo xtask bench sample --schemas --vs-llguidance PYTHON`.

Usage: llguidance_schemas.py TOKENIZER.json EOS_IDS

A worker: it loads the tokenizer, prints {"ready": version}, then reads one job per line
on stdin and answers one JSON line per job on stdout. The bench kills and restarts it when
a job runs past the per-schema time limit.

Job: {"schema": ..., "docs": [[compact JSON text, valid], ...], "tokens": [ids], "walk": n}
  - compiled as SAPIENT's default writes JSON (compact: `whitespace_flexible` off);
    refused when llguidance reports an error;
  - time to first mask: grammar_from_json_schema + LLMatcher(...) + the first
    fill_next_token_bitmask (the call inference engines use);
  - documents: each one tokenized (tokenize_str) and consumed from the start state; right
    when (all tokens consumed and accepting) equals `valid`;
  - mask times: the same token ids SAPIENT walked (`tokens`), replayed until one is not in
    llguidance's mask; without them, a seeded random walk of `walk` tokens.
Answer: {"compile_us", "first_mask_us", "docs_right", "masks_us": [...]} or
{"refused": message} or {"error": message}.
"""
import json
import random
import sys
import time

import llguidance
import llguidance.numpy
import numpy as np


def allowed_ids(bitmask, vocab_size):
    bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)


def is_allowed(bitmask, token):
    return (int(bitmask[0, token // 32]) >> (token % 32)) & 1


def measure(tok, eos, bitmask, job):
    t = time.perf_counter_ns()
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(job["schema"], defaults={"whitespace_flexible": False})
    except Exception as e:  # noqa: BLE001 - llguidance raises plain exceptions for bad schemas
        return {"refused": str(e).splitlines()[0][:160] if str(e) else type(e).__name__}
    m = llguidance.LLMatcher(tok, grammar, log_level=0)
    compile_us = (time.perf_counter_ns() - t) / 1e3
    if m.is_error():
        return {"refused": m.get_error().splitlines()[0][:160]}
    llguidance.numpy.fill_next_token_bitmask(m, bitmask, 0)
    first_mask_us = (time.perf_counter_ns() - t) / 1e3
    if m.is_error():
        return {"refused": m.get_error().splitlines()[0][:160]}
    right = 0
    # An error sticks to a matcher (reset() keeps it): each document gets a copy.
    for doc, valid in job["docs"]:
        d = m.deep_copy()
        ok = all(d.consume_token(t) for t in tok.tokenize_str(doc)) and d.is_accepting() and not d.is_error()
        right += ok == valid
    rng = random.Random(0)
    times = []
    replay = job.get("tokens") or []
    steps = len(replay) if replay else job.get("walk", 0)
    for i in range(steps):
        t = time.perf_counter_ns()
        llguidance.numpy.fill_next_token_bitmask(m, bitmask, 0)
        if i > 0:  # the first mask is timed above
            times.append((time.perf_counter_ns() - t) / 1e3)
        if replay:
            token = replay[i]
            if not is_allowed(bitmask, token):
                break
        else:
            ids = [int(x) for x in allowed_ids(bitmask, tok.vocab_size) if int(x) not in eos]
            if not ids:
                break
            token = rng.choice(ids)
        if not m.consume_token(token) or m.is_stopped():
            break
    return {"compile_us": compile_us, "first_mask_us": first_mask_us, "docs_right": right, "masks_us": times}


def main(tokenizer, eos_ids):
    eos = [int(x) for x in eos_ids.split(",") if x]
    tok = llguidance.LLTokenizer(tokenizer, eos_token=eos)
    bitmask = llguidance.numpy.allocate_token_bitmask(1, tok.vocab_size)
    print(json.dumps({"ready": llguidance.__version__}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        try:
            r = measure(tok, set(eos), bitmask, job)
        except Exception as e:  # noqa: BLE001 - reported per schema, the run goes on
            r = {"error": f"{type(e).__name__}: {e}"[:200]}
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
