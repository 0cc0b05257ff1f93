#!/usr/bin/env python3
"""Validate constrained generations against their JSON Schemas with the `jsonschema`
package (Draft 2020-12), independently of SAPIENT's grammar.

Input: the JSONL written by `cargo xtask bench sample --validate N` (one object per line:
{"schema_name", "schema", "text", "finish"}). Prints per-schema counts and exits non-zero if
any completed generation fails to parse or validate.
"""
import collections
import json
import sys

import jsonschema

def depth(text):
    """How deeply brackets nest in the text (outside strings), for documents cut or not."""
    d = best = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            d += 1
            best = max(best, d)
        elif ch in "]}":
            d -= 1
    return best


def main(path):
    stats = collections.defaultdict(lambda: collections.Counter())
    bad = []
    for line in open(path, encoding="utf-8"):
        rec = json.loads(line)
        name = rec["schema_name"]
        stats[name]["documents"] += 1
        stats[name]["tokens"] += rec.get("tokens", 0)
        stats[name]["deepest"] = max(stats[name]["deepest"], depth(rec["text"]))
        if rec["finish"] != "Eos":
            stats[name]["cut"] += 1
            continue
        try:
            value = json.loads(rec["text"])
        except json.JSONDecodeError as e:
            stats[name]["unparsable"] += 1
            bad.append((name, str(e), rec["text"]))
            continue
        errors = list(jsonschema.Draft202012Validator(rec["schema"], format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).iter_errors(value))
        if errors:
            stats[name]["invalid"] += 1
            bad.append((name, errors[0].message, rec["text"]))
        else:
            stats[name]["valid"] += 1
    for name, c in stats.items():
        mean = c["tokens"] / max(c["documents"], 1)
        print(f"{name}: {c['documents']} documents, {c['valid']} valid, {c['invalid']} invalid, {c['unparsable']} unparsable, "
              f"{c['cut']} cut by the token limit, {mean:.0f} tokens on average, nesting up to {c['deepest']}")
    total = collections.Counter()
    for c in stats.values():
        total.update({k: c[k] for k in ("documents", "valid", "invalid", "unparsable", "cut")})
    print(f"total: {total['documents']} documents, {total['valid']} valid, {total['invalid']} invalid, "
          f"{total['unparsable']} unparsable, {total['cut']} cut by the token limit")
    for name, msg, text in bad[:10]:
        print(f"FAIL {name}: {msg}: {text!r}")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
