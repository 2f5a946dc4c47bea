"""Main-loop instruction counts of kernels in an nvdisasm listing (scripts/sass-loop.sh).

The loop: from the kernel's first barrier to its last tensor-core instruction. Fallback: the
instructions between an unconditional branch and the next BSYNC inside it (the code a guard
jumps over on the fast path: the generic staging). Per kernel: loop, fallback, their
difference (the fast path, what a thread issues per chunk) and the loop's mix by opcode."""
import collections
import re
import sys

INS = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T] )?([A-Z0-9_]+)")


def kernel_lines(lines, name):
    out, on = [], False
    for line in lines:
        if line.startswith(".text."):
            on = line.rstrip().rstrip(":") == ".text." + name
            continue
        if on:
            out.append(line)
    return out


def main():
    lines = open(sys.argv[1]).read().split("\n")
    for name in sys.argv[2:]:
        body = kernel_lines(lines, name)
        bars = [i for i, l in enumerate(body) if "BAR.SYNC" in l]
        mmas = [i for i, l in enumerate(body) if "HMMA" in l]
        if not bars or not mmas:
            print(f"{name}: no barrier/MMA loop found")
            continue
        loop = body[bars[0] : max(mmas) + 1]
        total, fallback, skipping = 0, 0, False
        mix = collections.Counter()
        for l in loop:
            m = INS.match(l)
            if "BSYNC" in l:
                skipping = False
            if not m:
                continue
            total += 1
            mix[m.group(1)] += 1
            if skipping:
                fallback += 1
            if re.match(r"^\s+/\*[0-9a-f]+\*/\s+BRA `", l):
                skipping = True
        top = " ".join(f"{k} {v}" for k, v in mix.most_common(12))
        print(f"{name}: loop {total}, fallback {fallback}, fast path {total - fallback} | {top}")


main()
