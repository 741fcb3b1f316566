#!/usr/bin/env python3
"""Infrastructure smoke test on a GPU machine: NVRTC compile via the backend, bf16 arrays,
DLPack with torch, the event timer. Prints one line per check."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import numpy as np

    from dnnctl.backends.registry import get_backend

    be = get_backend("cupy")
    print("availability", be.availability())
    dev = be.device(0)
    print("device", dev)
    import cupy as cp

    t0 = time.time()
    src = Path("kernels/_smoke.cu")
    src.write_text(r'''
#include <dnnctl/common.cuh>
extern "C" __global__ void scale(const dnnctl::elem_t* x, dnnctl::elem_t* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = dnnctl::from_float<dnnctl::elem_t>(2.f * dnnctl::to_float(x[i]));
}
''')
    try:
        for code, dt in ((0, np.float32), (1, np.float16), (2, "bfloat16")):
            mod = be.compile_module("_smoke.cu", defines={"DNNCTL_DTYPE": code})
            f = mod.get_function("scale")
            import ml_dtypes
            npdt = np.dtype(ml_dtypes.bfloat16) if dt == "bfloat16" else np.dtype(dt)
            x = cp.asarray(np.arange(1000).astype(npdt))
            y = cp.empty_like(x)
            f((4,), (256,), (x, y, np.int32(1000)))
            ok = np.allclose(cp.asnumpy(y).astype(np.float32), 2 * np.arange(1000), rtol=1e-2)
            print("compile+run", npdt, ok)
    finally:
        src.unlink()
    print("compile time s", round(time.time() - t0, 2))
    import torch

    tt = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    c = cp.from_dlpack(tt)
    print("dlpack torch bf16 -> cupy", c.dtype, c.shape)
    back = torch.from_dlpack(c)
    print("dlpack back", back.dtype, back.data_ptr() == tt.data_ptr())
    a = cp.ones((1 << 28,), dtype=cp.uint8)
    b = cp.empty_like(a)
    s = be.time(lambda: cp.copyto(b, a), budget_ms=50)
    print("timer copy 256MB median us", float(np.median(s)), "n", len(s),
          "GB/s", 2 * a.nbytes / np.median(s) / 1e3)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
