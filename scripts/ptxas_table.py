#!/usr/bin/env python3
"""Assembles every PTX file of a folder with several ptxas binaries for -arch=sm_70 -v, fails when
one rejects a kernel, and writes (or checks) the per-kernel resource table of a V100 SM.

Called by scripts/ptxas-check.sh (which fetches the ptxas binaries and makes the PTX).
Fails (exit 1) when: a ptxas rejects a file; a kernel's static shared memory exceeds the V100's
96 KB; a hot decode/GEMM kernel spills registers; with --check, the table differs from the file.
"""
import argparse
import concurrent.futures as cf
import hashlib
import os
import re
import subprocess
import sys

# A V100 SM (compute capability 7.0): CUDA occupancy calculator's figures.
SM_REGS = 65536
REG_UNIT = 256  # registers are allocated per warp in units of 256
SM_SMEM = 96 * 1024
SMEM_UNIT = 256
SM_THREADS = 2048
SM_WARPS = 64
SM_BLOCKS = 32

# The files whose kernels run every decode step or every GEMM: a spill there costs bandwidth
# on every token (tests/kernels_compute70.rs keeps a like list for local memory).
HOT = {
    "gemv_f16", "gemv_quant", "gemv_q8", "gemm_quant", "gemm_tc", "moe_gemm", "moe_gemm_n8", "dequant",
    "attention_decode", "attention_merge", "argmax", "moe", "deltanet", "hybrid_attn", "fused_norm",
    "moe_gemm_t128",
}

# Hot kernels that spilled when this check was introduced (issue 34; bytes per thread stored,
# loaded: the larger of CUDA 11.8's and 12.9's ptxas). A listed kernel may not spill more, any
# other hot kernel not at all, and a listed kernel that stops spilling must leave the list (so it
# only shrinks). Each is a few bytes at a register cap set by __launch_bounds__ for occupancy.
# The one exception added since: the 128-token MoE gate/up tile, whose cap (128 registers: two
# blocks an SM off sm_70) was measured 27% faster than the same tile uncapped on the lent H100
# (kernels/moe_gemm_t128.cu; on sm_90 its main loop has no local loads or stores, sass-loop.sh).
KNOWN_SPILLS = {
    "moe_gemm_t128.moe_gemm_gate_up_q4_0_t128": (32, 32),
    "moe_gemm_t128.moe_gemm_gate_up_q8_0_t128": (64, 64),
    "moe_gemm_t128.moe_gemm_gate_up_q4_k_t128": (56, 56),
    "moe_gemm_t128.moe_gemm_gate_up_q5_k_t128": (64, 64),
    "moe_gemm_t128.moe_gemm_gate_up_q6_k_t128": (64, 60),
    "moe.moe_down_sum_q5_0": (8, 8),
    "moe.moe_down_sum_q5_1": (12, 12),
    "moe.moe_gate_up_q6_k_g": (12, 28),
    "moe.moe_down_q5_0_g": (4, 8),
    "moe.moe_down_q5_1_g": (4, 8),
}


def run_ptxas(ptxas, arch, path, cache_dir):
    """ptxas -v's report for one file (cached by the file's and ptxas's hashes)."""
    with open(path, "rb") as f:
        ptx = f.read()
    with open(ptxas, "rb") as f:
        tool = hashlib.sha256(f.read()).hexdigest()[:16]
    key = hashlib.sha256(ptx + arch.encode() + tool.encode()).hexdigest()
    cached = os.path.join(cache_dir, key + ".txt") if cache_dir else None
    if cached and os.path.exists(cached):
        with open(cached) as f:
            return 0, f.read()
    r = subprocess.run([ptxas, f"-arch={arch}", "-v", path, "-o", os.devnull], capture_output=True, text=True)
    out = r.stdout + r.stderr
    if r.returncode == 0 and cached:
        os.makedirs(cache_dir, exist_ok=True)
        with open(cached + ".tmp", "w") as f:
            f.write(out)
        os.replace(cached + ".tmp", cached)
    return r.returncode, out


def parse_report(text):
    """{kernel: {regs, smem, stack, spill_st, spill_ld}} from ptxas -v."""
    kernels, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur = kernels.setdefault(m.group(1), {"regs": 0, "smem": 0, "stack": 0, "spill_st": 0, "spill_ld": 0})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["stack"], cur["spill_st"], cur["spill_ld"] = (int(g) for g in m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    return kernels


def launch_bounds(ptx_text):
    """{kernel: threads per block} from `.maxntid x, y, z` (kernels without it: absent)."""
    out = {}
    for m in re.finditer(r"\.entry\s+(\w+)\s*\((.*?)\)\s*(.*?)\{", ptx_text, re.S):
        b = re.search(r"\.maxntid\s+(\d+)\s*,\s*(\d+)\s*,\s*(\d+)", m.group(3))
        if b:
            out[m.group(1)] = int(b.group(1)) * int(b.group(2)) * int(b.group(3))
    return out


def occupancy(threads, regs, smem):
    """(blocks per SM, resident warps of 64) on a V100 SM."""
    warps = -(-threads // 32)
    by_threads = SM_THREADS // (warps * 32)
    regs_per_warp = -(-max(regs, 1) * 32 // REG_UNIT) * REG_UNIT
    by_regs = (SM_REGS // regs_per_warp) // warps
    by_smem = SM_SMEM // (-(-smem // SMEM_UNIT) * SMEM_UNIT) if smem else SM_BLOCKS
    blocks = min(by_threads, by_regs, by_smem, SM_BLOCKS)
    return blocks, min(blocks * warps, SM_WARPS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptxas", action="append", required=True, help="VERSION=PATH")
    ap.add_argument("--ptx-dir", required=True)
    ap.add_argument("--out", required=True, help="the markdown table")
    ap.add_argument("--check", action="store_true", help="fail when --out differs instead of writing it")
    ap.add_argument("--extra-arch", action="append", default=[], help="also assemble for this arch (no table)")
    ap.add_argument("--cache", default=None)
    ap.add_argument("--source", default="", help="a line naming how the PTX was made")
    a = ap.parse_args()
    tools = [t.split("=", 1) for t in a.ptxas]
    files = sorted(f for f in os.listdir(a.ptx_dir) if f.endswith(".ptx"))
    if not files:
        sys.exit(f"ptxas-check: no .ptx files in {a.ptx_dir}")
    jobs = {}
    with cf.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        for f in files:
            for ver, tool in tools:
                for arch in ["sm_70"] + a.extra_arch:
                    jobs[(f, ver, arch)] = ex.submit(run_ptxas, tool, arch, os.path.join(a.ptx_dir, f), a.cache)
    failures, reports = [], {}
    for (f, ver, arch), job in jobs.items():
        rc, out = job.result()
        if rc != 0:
            errs = [l for l in out.splitlines() if "error" in l or "fatal" in l][:5]
            failures.append(f"ptxas {ver} -arch={arch} rejects {f}:\n    " + "\n    ".join(errs))
        elif arch == "sm_70":
            reports[(f, ver)] = parse_report(out)
    rows = []
    for f in files:
        with open(os.path.join(a.ptx_dir, f)) as fh:
            bounds = launch_bounds(fh.read())
        stem = f[:-4]
        per = [reports.get((f, ver), {}) for ver, _ in tools]
        for k in sorted(set().union(*[r.keys() for r in per])):
            r = [p.get(k, {"regs": 0, "smem": 0, "stack": 0, "spill_st": 0, "spill_ld": 0}) for p in per]
            smem = max(x["smem"] for x in r)
            regs = max(x["regs"] for x in r)
            spills = [x["spill_st"] + x["spill_ld"] for x in r]
            if smem > SM_SMEM:
                failures.append(f"{stem}.{k}: {smem} bytes of static shared memory, more than a V100 SM's {SM_SMEM}")
            name = f"{stem}.{k}"
            st, ld = max(x["spill_st"] for x in r), max(x["spill_ld"] for x in r)
            if stem in HOT:
                cap = KNOWN_SPILLS.get(name, (0, 0))
                if st > cap[0] or ld > cap[1]:
                    detail = ", ".join(f"{ver}: {x['spill_st']} B stored / {x['spill_ld']} B loaded" for (ver, _), x in zip(tools, r))
                    known = f" (listed at {cap[0]}/{cap[1]} B)" if name in KNOWN_SPILLS else ""
                    failures.append(f"{name} (a hot decode/GEMM kernel) spills registers{known}: {detail}")
                elif name in KNOWN_SPILLS and st == 0 and ld == 0:
                    failures.append(f"{name} no longer spills: remove it from KNOWN_SPILLS in scripts/ptxas_table.py")
            t = bounds.get(k)
            if t:
                blocks, warps = occupancy(t, regs, smem)
                occ = f"{blocks} | {100 * warps // SM_WARPS}%"
            else:
                # Block size set at launch: the register file's bound on resident warps.
                per_warp = -(-max(regs, 1) * 32 // REG_UNIT) * REG_UNIT
                occ = f"- | <= {100 * min(SM_WARPS, SM_REGS // per_warp) // SM_WARPS}%"
            cols = [stem, f"`{k}`", str(t or "-")]
            cols += [str(x["regs"]) for x in r]
            cols += [str(smem), str(max(x["stack"] for x in r))]
            cols += [f"{x['spill_st']}/{x['spill_ld']}" for x in r]
            rows.append("| " + " | ".join(cols) + f" | {occ} |")
    vers = [v for v, _ in tools]
    head = (
        "# compute_70 kernels on a V100 SM: resources per kernel\n\n"
        "Generated by `scripts/ptxas-check.sh --write` (do not edit; CI fails when it is not current): "
        f"{a.source}, assembled by the ptxas of CUDA {' and '.join(vers)} with `-arch=sm_70 -v`.\n\n"
        "- threads: the block size the kernel declares (`__launch_bounds__`, PTX `.maxntid`); `-`: set at launch.\n"
        "- smem: static shared memory in bytes (dynamic shared memory is sized at launch by the launchers, "
        "which check it: `src/backend/cuda/ops/attention.rs`, `prefill.rs`).\n"
        "- stack: local memory per thread (stack frame), bytes; spills: bytes stored/loaded per thread. "
        "A hot decode/GEMM kernel (`HOT` in scripts/ptxas_table.py) may not spill, except the few listed "
        "in `KNOWN_SPILLS` there, which may not spill more.\n"
        f"- blocks/SM and occupancy (resident warps of {SM_WARPS}) on one V100 SM: {SM_REGS:,} registers "
        f"(allocated per warp in units of {REG_UNIT}), 96 KB shared memory, {SM_THREADS:,} threads, "
        f"at most {SM_BLOCKS} blocks; from the larger register count of the two ptxas (`<= N%`: block "
        "size set at launch, the bound the registers alone set).\n\n"
    )
    cols = ["file", "kernel", "threads"] + [f"regs {v}" for v in vers] + ["smem", "stack"]
    cols += [f"spills {v}" for v in vers] + ["blocks/SM", "occupancy"]
    table = head + "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n" + "\n".join(rows) + "\n"
    if a.check:
        try:
            with open(a.out) as fh:
                current = fh.read()
        except FileNotFoundError:
            current = ""
        if current != table:
            failures.append(f"{a.out} is not current: run scripts/ptxas-check.sh --write and commit it")
    else:
        with open(a.out, "w") as fh:
            fh.write(table)
    n = len(rows)
    if failures:
        print("ptxas-check: FAILED\n" + "\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"ptxas-check: {len(files)} files, {n} kernels accepted by ptxas {', '.join(vers)} for sm_70"
          + (f" (and {', '.join(a.extra_arch)})" if a.extra_arch else "")
          + f"; {a.out} {'is current' if a.check else 'written'}")


if __name__ == "__main__":
    main()
