#!/usr/bin/env python3
"""Instruction lines of PTX entry points (a SASS-free size of a kernel's instruction stream):
`scripts/ptx-entry-stats.py DIR/gemv_q8.ptx gemvq8_q4_k_n1 ...` prints, per entry, the count of
instruction lines and of a few opcodes (dp4a, cvt, ld). PTX from `dustoff kernels --out DIR`."""
import sys
from collections import Counter

text = open(sys.argv[1]).read()
for name in sys.argv[2:]:
    i = text.index(".entry " + name + "(")
    body = text[i:text.index("\n}\n", i)]
    ins = [l.strip() for l in body.split("\n")]
    ins = [l for l in ins if l and ";" in l and not l.startswith((".", "//", "{", "}")) and not l.endswith(":")]
    ops = Counter(l.split()[0].split(".")[0] for l in ins)
    print(f"{name}: {len(ins)} instructions, dp4a {ops['dp4a']}, cvt {ops['cvt']}, ld {ops['ld']}")
