#!/usr/bin/env python3
"""Checks a GGUF file written by `dustoff quantize` with llama.cpp's own Python reader (the
`gguf` package, gguf-py): the header, metadata and tensor table parse; `general.file_type` and
`general.quantization_version` are set; every tensor's data starts on the file's alignment; every
tensor type is one gguf-py knows. With --reference F16.gguf (the quantizer's source) every tensor
is decoded by gguf-py's numpy dequantizers and its relative error against the reference,
sum (x - x^)^2 / sum x^2, is compared with the `relative_error` dustoff wrote for it in
<file>.report.json (--report, default: the quantize report of the file): the two decoders must agree.

    python3 scripts/check-gguf.py OUT.gguf [--reference F16.gguf] [--report OUT.gguf.report.json]

Exit 0: all checks passed; 1: a check failed (each failure is printed); 2: gguf-py is missing
(pip install gguf). Not a CI dependency: tests/quantize.rs runs it where python3 has gguf.
"""

import argparse
import json
import os
import sys

try:
    import numpy as np
    from gguf import GGUFReader, GGMLQuantizationType
    from gguf.quants import dequantize
except ImportError as e:  # pragma: no cover - environment dependent
    print(f"gguf-py is not installed ({e}): pip install gguf", file=sys.stderr)
    sys.exit(2)


def field(reader, name):
    f = reader.get_field(name)
    return None if f is None else f.contents()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--reference", help="the F16/F32 GGUF the file was quantized from")
    ap.add_argument("--report", help="the quantize report (default: <file>.report.json)")
    ap.add_argument("--tolerance", type=float, default=1e-3,
                    help="largest relative difference of the two relative errors (default 1e-3)")
    a = ap.parse_args()
    failures = []
    r = GGUFReader(a.file)
    ftype, qv = field(r, "general.file_type"), field(r, "general.quantization_version")
    align = field(r, "general.alignment") or 32
    types = {}
    for t in r.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        if t.data_offset % align:
            failures.append(f"{t.name}: data at offset {t.data_offset}, not a multiple of {align}")
    if ftype is None:
        failures.append("general.file_type is missing")
    if qv is None:
        failures.append("general.quantization_version is missing")
    print(f"{a.file}: {len(r.tensors)} tensors, general.file_type {ftype}, quantization_version {qv}, "
          f"alignment {align}, types {dict(sorted(types.items()))}")

    if a.reference:
        report = a.report or os.path.abspath(a.file) + ".report.json"
        with open(report) as f:
            want = {t["name"]: t for t in json.load(f)["tensors"]}
        ref = {t.name: t for t in GGUFReader(a.reference).tensors}
        worst, checked = (0.0, ""), 0
        for t in r.tensors:
            if t.tensor_type in (GGMLQuantizationType.F32,) or t.name not in want:
                continue
            x = dequantize(ref[t.name].data, ref[t.name].tensor_type).astype(np.float64).ravel()
            y = dequantize(t.data, t.tensor_type).astype(np.float64).ravel()
            if x.shape != y.shape:
                failures.append(f"{t.name}: {y.size} values, the reference has {x.size}")
                continue
            den = float(np.sum(x * x))
            rel = float(np.sum((x - y) ** 2)) / den if den > 0 else 0.0
            theirs = want[t.name]["relative_error"]
            diff = abs(rel - theirs) / max(theirs, 1e-12) if theirs > 0 else rel
            checked += 1
            if diff > worst[0]:
                worst = (diff, t.name)
            if diff > a.tolerance and abs(rel - theirs) > 1e-9:
                failures.append(f"{t.name} ({t.tensor_type.name}): gguf-py relative error {rel:.6e}, "
                                f"dustoff's report {theirs:.6e}")
        print(f"decoded {checked} tensors with gguf-py against {a.reference}: relative errors agree with "
              f"{report} (largest relative difference {worst[0]:.2e}, {worst[1]})")
        if checked == 0:
            failures.append("no tensor was compared")
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
