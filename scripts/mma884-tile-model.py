#!/usr/bin/env python3
"""A lane-by-lane model of kernels/moe_gemm_mma.cu's index math (no GPU): which thread loads
which unit, where the input's B fragments are staged (xs_slot) and read, the m8n8k4 fragment
layouts of the PTX ISA (A row-major: row lane % 4 + 4 (lane >= 16), 4 consecutive K; B
column-major: the same for tokens; f32 C: row (lane & 1) + (i & 2) + 4 (lane >= 16), column
(i & 4) + (lane & 2) + (i & 1)), the quad pairs' shuffle sums and the output writes. For each
unit layout (32-column units, Q5_K, Q6_K) and 8 / 16 tokens, the modelled tile must equal W x^T
on random values, each output written once, and a half-warp's 16 B-fragment loads must fall on
distinct bank pairs. It checks the kernel's design as transcribed here, not the kernel: GPU
parity (tests/gpu_parity/moe_gemm.rs) does that.
    python3 scripts/mma884-tile-model.py"""
import random

def h(kg): return (((kg >> 2) ^ (kg >> 3)) & 1) | ((kg >> 3) & 2)
def xs_slot(jn, kg, n): return ((jn * 32 + kg) * 8 + n) ^ (h(kg) << 2)

STARTS = {  # F::start(u, r) (quant.cuh), units per 128 columns, runs
    "32-column units": (lambda u, r: 32 * u + 16 * r, 4, 2),
    "q5_k": (lambda u, r: 256 * (u >> 3) + 64 * ((u & 7) >> 1) + 16 * (u & 1) + 32 * r, 4, 2),
    "q6_k": (lambda u, r: 256 * (u >> 2) + 128 * ((u & 3) >> 1) + 16 * (u & 1) + 32 * r, 2, 4),
}

def c_pos(lane, i): return (lane & 1) + (i & 2) + 4 * (lane >> 4), (i & 4) + (lane & 2) + (i & 1)

def model(start, upc, runs, n8, cols=256):
    rnd = random.Random(1)
    bm, bn, s_n = 64, 8 * n8, upc // 2
    w = [[rnd.uniform(-1, 1) for _ in range(cols)] for _ in range(bm)]
    x = [[rnd.uniform(-1, 1) for _ in range(cols)] for _ in range(bn)]
    acc = {}
    for c in range(cols // 128):
        sx = {}
        for t in range(128):
            for i in range(n8):
                e = t + 128 * i
                tok, kg, base = e // 16, 2 * (e % 16), c * 128 + 8 * (e % 16)
                sx[xs_slot(tok // 8, kg, tok % 8)] = x[tok][base:base + 4]
                sx[xs_slot(tok // 8, kg + 1, tok % 8)] = x[tok][base + 4:base + 8]
        assert len(sx) == n8 * 256, "xs_slot is a bijection"
        for warp in range(4):
            for r in range(runs):
                for i in range(4):
                    for jn in range(n8):
                        banks = [{}, {}]
                        for s in range(s_n):
                            for q in range(4):
                                lanes = [4 * q + a for a in range(4)] + [16 + 4 * q + a for a in range(4)]
                                a_m, b_m = {}, {}
                                for lane in lanes:
                                    j, u = (lane & 3) | ((lane >> 4) << 2), c * upc + q % upc
                                    tr, col = 16 * warp + 8 * ((q + 4 * s) // upc) + j, start(u, r) + 4 * i
                                    a_m[j] = w[tr][col:col + 4]
                                    sl = xs_slot(jn, (start(u, r) - c * 128) // 4 + i, j)
                                    b_m[j] = sx[sl]
                                    banks[lane >> 4].setdefault(sl % 16, set()).add(sl)
                                for lane in lanes:
                                    a = acc.setdefault((warp, lane, s, jn), [0.0] * 8)
                                    for ci in range(8):
                                        row, tok = c_pos(lane, ci)
                                        a[ci] += sum(a_m[row][k] * b_m[tok][k] for k in range(4))
                        for half in banks:
                            assert all(len(v) == 1 for v in half.values()), "bank-pair conflict"
    out = {}
    for warp in range(4):
        for lane in range(32):
            q = (lane >> 2) & 3
            if q % upc:
                continue
            for s in range(s_n):
                for jn in range(n8):
                    v = [0.0] * 8
                    for dq in range(upc):  # the quad pairs of one row group: lanes ^ 4, ^ 8
                        for ci, t in enumerate(acc[(warp, lane ^ (4 * dq), s, jn)]):
                            v[ci] += t
                    for ci in range(8):
                        row, tok = c_pos(lane, ci)
                        key = (16 * warp + 8 * ((q + 4 * s) // upc) + row, 8 * jn + tok)
                        assert key not in out, "each output written once"
                        out[key] = v[ci]
    assert len(out) == bm * bn
    return max(abs(out[(r, t)] - sum(w[r][k] * x[t][k] for k in range(cols))) for r in range(bm) for t in range(bn))

for name, (start, upc, runs) in STARTS.items():
    for n8 in (1, 2):
        err = model(start, upc, runs, n8)
        assert err < 1e-9, (name, n8, err)
        print(f"{name}, {8 * n8} tokens: max |tile - W x^T| = {err:.1e}, no bank-pair conflicts")
