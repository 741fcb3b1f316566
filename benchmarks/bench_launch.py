"""Host cost of the pieces of one run-time call, to choose the launch path (issue: measure first).

Each row is the median host wall time per call in microseconds over many back-to-back calls
(synchronized before and after each batch), on the GPU the script finds:

* torch ops of the probe shapes (what a user compares against);
* launching one small kernel (two pointers, two ints) through CuPy's RawKernel, CuPy's
  Function, ``cuLaunchKernel`` through ctypes with a parameter block built once, and
  ``cuLaunchKernel`` through cuda-bindings;
* the same kernel by ``cuLaunchCooperativeKernel`` (what a grid-barrier kernel such as
  batch_norm's ``train_persist`` needs), back to back, and once behind ~1 ms of queued GPU
  work (``torch.cuda._sleep``) against a plain launch there: whether the host waits for the
  GPU at a cooperative launch;
* the pieces of taking a torch tensor: data_ptr / shape / stride, the current raw stream,
  torch.empty for an output, a CuPy view made from the pointer, cupy.from_dlpack;
* kernels of 20 us and more called from torch, against the same kernel launched bare.

The probe ops' whole per-call cost against torch is benchmarks/bench_torch_overhead.py.

Run: ``PYTHONPATH=. python3 benchmarks/bench_launch.py``.
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def per_call_us(fn: Callable[[], object], sync: Callable[[], None], n: int = 2000,
                reps: int = 7) -> float:
    for _ in range(200):
        fn()
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


SRC = r"""
extern "C" __global__ void scale(const float* x, float* y, int n, int pad) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
"""


def main() -> int:
    import cupy as cp
    import torch

    rows: list[tuple[str, float]] = []
    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    x16 = torch.randn(64, 128, device=dev, dtype=torch.float16)
    ln_x = torch.randn(64, 768, device=dev, dtype=torch.float16)
    ln_w = torch.randn(768, device=dev, dtype=torch.float16)
    a = torch.randn(64, 64, device=dev, dtype=torch.float16)
    cx = torch.randn(8, 64, 28, 28, device=dev, dtype=torch.float16).to(
        memory_format=torch.channels_last)
    cw = torch.randn(64, 64, 3, 3, device=dev, dtype=torch.float16).to(
        memory_format=torch.channels_last)
    F = torch.nn.functional
    rows.append(("torch softmax 64x128", per_call_us(lambda: torch.softmax(x16, -1), sync)))
    rows.append(("torch layer_norm 64x768",
                 per_call_us(lambda: F.layer_norm(ln_x, (768,), ln_w, ln_w), sync)))
    rows.append(("torch matmul 64^3", per_call_us(lambda: a @ a, sync)))
    rows.append(("torch conv2d 8x64x28x28 NHWC",
                 per_call_us(lambda: F.conv2d(cx, cw, padding=1), sync)))
    rows.append(("torch relu 64x128", per_call_us(lambda: torch.relu(x16), sync)))

    n = 1 << 12
    xs = cp.random.standard_normal(n, dtype=cp.float32)
    ys = cp.empty_like(xs)
    mod = cp.RawModule(code=SRC)
    raw = mod.get_function("scale")
    args = (xs, ys, cp.int32(n), cp.int32(0))
    rows.append(("cupy RawKernel call", per_call_us(
        lambda: raw((n // 256,), (256,), args), cp.cuda.Device().synchronize)))

    fn_ptr = raw.ptr if hasattr(raw, "ptr") else raw.kernel.ptr
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch = libcuda.cuLaunchKernel
    launch.restype = ctypes.c_int
    launch.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                       ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    slots = (ctypes.c_uint64 * 2)(xs.data.ptr, ys.data.ptr)
    ints = (ctypes.c_int32 * 2)(n, 0)
    params = (ctypes.c_void_p * 4)(ctypes.addressof(slots), ctypes.addressof(slots) + 8,
                                   ctypes.addressof(ints), ctypes.addressof(ints) + 4)
    g = n // 256

    def ct() -> None:
        slots[0] = xs.data.ptr
        slots[1] = ys.data.ptr
        launch(fn_ptr, g, 1, 1, 256, 1, 1, 0, None, params, None)

    rows.append(("ctypes cuLaunchKernel (+2 ptr stores)",
                 per_call_us(ct, cp.cuda.Device().synchronize)))
    coop = libcuda.cuLaunchCooperativeKernel
    coop.restype = ctypes.c_int
    coop.argtypes = launch.argtypes[:-1]

    def cc() -> None:
        rc = coop(fn_ptr, g, 1, 1, 256, 1, 1, 0, None, params)
        if rc:
            raise RuntimeError(f"cuLaunchCooperativeKernel returned {rc}")

    rows.append(("ctypes cuLaunchCooperativeKernel", per_call_us(cc,
                                                               cp.cuda.Device().synchronize)))
    for name, fn in (("plain", ct), ("cooperative", cc)):
        took = []
        for _ in range(5):
            sync()
            torch.cuda._sleep(2_000_000)  # ~1 ms of GPU work queued ahead (null stream)
            t0 = time.perf_counter()
            fn()
            took.append((time.perf_counter() - t0) * 1e6)
        sync()
        rows.append((f"{name} launch behind ~1 ms of queued GPU work",
                     statistics.median(took)))
    try:
        from cuda.bindings import driver as cu

        cfn = cu.CUfunction(fn_ptr)
        stream0 = cu.CUstream(0)

        def cb() -> None:
            cu.cuLaunchKernel(cfn, g, 1, 1, 256, 1, 1, 0, stream0,
                              ((xs.data.ptr, ys.data.ptr, n, 0),
                               (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                ctypes.c_int)), 0)

        rows.append(("cuda-bindings cuLaunchKernel (packed)",
                     per_call_us(cb, cp.cuda.Device().synchronize)))
    except Exception as exc:  # noqa: BLE001
        print("cuda-bindings:", exc, file=sys.stderr)

    t = x16
    rows.append(("torch data_ptr+shape+stride+dtype", per_call_us(
        lambda: (t.data_ptr(), t.shape, t.stride(), t.dtype), sync)))
    raw_stream = torch._C._cuda_getCurrentRawStream
    rows.append(("torch._C._cuda_getCurrentRawStream", per_call_us(lambda: raw_stream(0), sync)))
    rows.append(("torch.cuda.current_stream().cuda_stream", per_call_us(
        lambda: torch.cuda.current_stream().cuda_stream, sync)))
    rows.append(("torch.empty((64,128), fp16, cuda)", per_call_us(
        lambda: torch.empty((64, 128), dtype=torch.float16, device=dev), sync)))
    rows.append(("torch.empty_like(x)", per_call_us(lambda: torch.empty_like(t), sync)))

    def view() -> None:
        mem = cp.cuda.UnownedMemory(t.data_ptr(), t.numel() * 2, None, 0)
        cp.ndarray((64, 128), cp.float16, cp.cuda.MemoryPointer(mem, 0))

    rows.append(("cupy view from pointer", per_call_us(view, sync)))
    rows.append(("cupy.from_dlpack(torch)", per_call_us(lambda: cp.from_dlpack(t), sync)))

    try:
        import dnnctl

        rows += _planned_big_rows(dnnctl, torch, cp, sync)
    except Exception as exc:  # noqa: BLE001
        print("dnnctl:", exc, file=sys.stderr)

    print("| piece | host us / call |\n|---|---:|")
    for name, us in rows:
        print(f"| {name} | {us:.2f} |")
    return 0


def _planned_big_rows(dnnctl: Any, torch: Any, cp: Any, sync: Callable[[], None]
                      ) -> list[tuple[str, float]]:
    """Kernels of 20 us and more: a call from torch (back to back, wall per call) against
    the same built kernel launched bare on CuPy arrays (CUDA events)."""
    from dnnctl.ops import dispatch

    dev = torch.device("cuda")
    x = torch.randn(4096, 8192, device=dev, dtype=torch.float16)
    w = torch.randn(8192, device=dev, dtype=torch.float16)
    cx = torch.randn(32, 56, 56, 64, device=dev, dtype=torch.float16)
    cw = torch.randn(64, 3, 3, 64, device=dev, dtype=torch.float16)
    cases = [("layer_norm 4096x8192", lambda: dnnctl.ops.layer_norm(x, w, w)),
             ("conv2d 32x64x56x56 NHWC 3x3",
              lambda: dnnctl.ops.conv2d(cx, cw, padding=1, layout="NHWC"))]
    rows = []
    for name, fn in cases:
        dispatch._SITES.clear()
        fn()
        site = next(iter(dispatch._SITES.values()))
        kern, _flat, adopts = site.kernel(None)
        back = tuple(None if a is None else cp.asarray(a) for a in
                     ((x, w, w) if name.startswith("layer") else (cx, cw)))
        names = [n for n, _i, _v in site.inputs]
        ins = {n: a for n, a in zip(names, back) if a is not None}
        # a kernel that adopts its outputs (a vendor library's) makes them, as in the call
        outs = {} if adopts else {n: cp.empty(shape, dtype) for n, shape, dtype, _ in
                                  site.outputs}
        start, end = cp.cuda.Event(), cp.cuda.Event()
        for _ in range(20):
            kern(ins, outs, site.attrs)
        start.record()
        for _ in range(200):
            kern(ins, outs, site.attrs)
        end.record()
        end.synchronize()
        bare = cp.cuda.get_elapsed_time(start, end) * 1e3 / 200
        wall = per_call_us(fn, sync, n=200, reps=5)
        rows.append((f"{name}: kernel alone (events)", bare))
        rows.append((f"{name}: dnnctl from torch, wall per call ({wall / bare - 1:+.1%})",
                     wall))
    return rows


if __name__ == "__main__":
    sys.exit(main())
