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

def main(path):
    stats = collections.defaultdict(lambda: collections.Counter())
    bad = []
    for line in open(path, encoding="utf-8"):
        rec = json.loads(line)
        name = rec["schema_name"]
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
        print(f"{name}: {c['valid']} valid, {c['invalid']} invalid, {c['unparsable']} unparsable, {c['cut']} cut by the token limit")
    for name, msg, text in bad[:10]:
        print(f"FAIL {name}: {msg}: {text!r}")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
