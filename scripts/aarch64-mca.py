#!/usr/bin/env python3
"""Cut the loops out of one function of an aarch64 assembly file and ask llvm-mca how many
cycles an iteration takes on the given CPU models.

usage: aarch64-mca.py FILE.s FUNCTION [CPU...]
(CPUs default: apple-m1 neoverse-n1 neoverse-v1 neoverse-v2; $LLVM_MCA, else llvm-mca-19 or llvm-mca)

A loop is the stretch from a label to the last branch back to it. Prints one line per loop:
its label, instructions, and cycles per iteration (llvm-mca's total cycles over 200
iterations, divided by 200) for each CPU. Inner loops appear on their own lines too.
"""
import os
import re
import shutil
import subprocess
import sys

MCA = os.environ.get("LLVM_MCA") or shutil.which("llvm-mca-19") or "llvm-mca"

BRANCH = re.compile(r"^\s*(b\.?(?:eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le|al)?|cbn?z|tbn?z)\s+(.*)$")


def function_lines(path, name):
    lines = open(path).read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith(name + ":"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(".Lfunc_end") or re.match(r"^\s*\.size\s+" + re.escape(name) + r"\b", lines[i]) or (lines[i] and not lines[i][0].isspace() and not lines[i].startswith(".") and lines[i].endswith(":") and i > start + 1 and not lines[i].startswith(".L")))
    return lines[start:end]


def loops(body):
    labels = {}
    for i, l in enumerate(body):
        m = re.match(r"^(\.?L?[\w.$]+):", l)
        if m:
            labels[m.group(1)] = i
    found = {}
    for i, l in enumerate(body):
        m = BRANCH.match(l)
        if not m:
            continue
        target = m.group(2).split(",")[-1].strip()
        if target in labels and labels[target] < i:
            found[target] = (labels[target], i)
    return sorted(found.items(), key=lambda kv: kv[1][0])


def instructions(body, a, b):
    out = []
    for l in body[a:b + 1]:
        s = l.split("//")[0].rstrip()
        if not s.strip() or s.strip().startswith(".") or re.match(r"^[\w.$]+:", s):
            continue
        out.append(s)
    return out


def mca(insts, cpu, iters=200):
    text = "\n".join(insts) + "\n"
    r = subprocess.run([MCA, "-mtriple=aarch64", f"-mcpu={cpu}", "-mattr=+dotprod,+i8mm", f"-iterations={iters}"], input=text, capture_output=True, text=True)
    m = re.search(r"Total Cycles:\s+(\d+)", r.stdout)
    if not m:
        return float("nan")
    return int(m.group(1)) / iters


def main():
    path, name = sys.argv[1], sys.argv[2]
    cpus = sys.argv[3:] or ["apple-m1", "neoverse-n1", "neoverse-v1", "neoverse-v2"]
    body = function_lines(path, name)
    for label, (a, b) in loops(body):
        insts = instructions(body, a, b)
        cyc = "  ".join(f"{c}={mca(insts, c):.1f}" for c in cpus)
        print(f"{name} {label}: {len(insts)} instructions, cycles/iteration {cyc}")


if __name__ == "__main__":
    main()
