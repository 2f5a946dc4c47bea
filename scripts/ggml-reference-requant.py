#!/usr/bin/env python3
"""The same file as llama-quantize (without an importance matrix) would write it, as far as
gguf-py can tell: copies a GGUF written by `dustoff quantize` and re-quantizes, from the F16
reference, every tensor of a 32-element type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) with gguf-py's port
of ggml's reference quantizers (`quantize_row_*_ref`, what llama-quantize runs for those types
when no imatrix is given). Same types, same layout, same metadata: only those blocks change, so
`dustoff eval` of both files compares the two quantizers on equal terms. K-quant tensors (Q4_K,
Q5_K, Q6_K) are kept as dustoff wrote them: gguf-py has no K-quant quantizer.

    python3 scripts/ggml-reference-requant.py DUSTOFF.gguf F16.gguf OUT.gguf
"""

import shutil
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.quants import dequantize, quantize

REFERENCE_TYPES = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, ref_path, out = sys.argv[1:]
    shutil.copyfile(src, out)
    q = GGUFReader(src)
    ref = {t.name: t for t in GGUFReader(ref_path).tensors}
    redone, kept = {}, {}
    with open(out, "r+b") as f:
        for t in q.tensors:
            if t.tensor_type not in REFERENCE_TYPES:
                kept[t.tensor_type.name] = kept.get(t.tensor_type.name, 0) + 1
                continue
            r = ref[t.name]
            x = dequantize(r.data, r.tensor_type).astype(np.float32)
            b = quantize(x, t.tensor_type).tobytes()
            if len(b) != t.n_bytes:
                sys.exit(f"{t.name}: {len(b)} bytes from gguf-py, {t.n_bytes} in the file")
            f.seek(t.data_offset)
            f.write(b)
            redone[t.tensor_type.name] = redone.get(t.tensor_type.name, 0) + 1
    print(f"{out}: re-quantized with ggml's reference quantizers {redone}; kept {kept}")


if __name__ == "__main__":
    main()
