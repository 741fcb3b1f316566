"""The CUDA variants of the memory-bound ops, run on the CPU emulator (tools/cuda_emu).

Every sampled candidate is built through its variant's own ``build()`` (the same launch code
as on the GPU: grids, template instances, argument tuples, alignment fallbacks) and verified
by ``dnnctl.ops.check`` on fresh inputs with poisoned outputs. The emulator runs each CUDA
thread as a fiber and checks every vector access (alignment, global bounds, shared-memory
races), the barriers / shuffles (a lane that skips one deadlocks) and each launch's argument
list against the kernel signature.

Opt-in (g++ builds one library per kernel instance: minutes on a first run, cached under
$DNNCTL_EMU_CACHE afterwards): ``DNNCTL_EMU_TESTS=1 pytest tests/unit/test_ops_memory_emu.py``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import random
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.environ.get("DNNCTL_EMU_TESTS") != "1" or shutil.which("g++") is None
    or platform.machine() != "x86_64",
    reason="CPU-emulator kernel tests are opt-in: DNNCTL_EMU_TESTS=1 (needs g++, x86-64)")


# ----------------------------------------------------------------------------- harness


# CUDA intrinsics for the emulator, force-included after tools/cuda_emu/emu_prelude.h, so that
# kernels/include/dnnctl/memory.cuh runs its GPU code (only DNNCTL_DYN_SMEM / DNNCTL_DEREF_*
# take emulator hooks): every access through them is checked for alignment and bounds.
SHIM = r"""
#pragma once
#include <vector_functions.h>
inline void emu_access(const void* p, size_t bytes, bool write) {
  if ((uintptr_t)p % bytes) emu::fail(write ? "store not aligned" : "load not aligned");
  const unsigned char* q = static_cast<const unsigned char*>(p);
  if (emu::g_smem && q >= emu::g_smem && q < emu::g_smem + emu::g_smem_bytes) {
    if (write) emu::smem_write(p, bytes, "shared store");
    else emu::smem_read(p, bytes, "shared load");
  } else {
    emu::check_global(p, bytes, write ? "global store" : "global load");
  }
}
template <class T> inline T emu_deref_load(const T* p) {
  emu_access(p, sizeof(T), false);
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T> inline void emu_deref_store(T* p, T v) {
  emu_access(p, sizeof(T), true);
  std::memcpy(p, &v, sizeof(T));
}
template <class T> inline T __ldg(const T* p) { return emu_deref_load(p); }
template <class T> inline T __ldcs(const T* p) { return emu_deref_load(p); }
template <class T> inline T __ldcg(const T* p) { return emu_deref_load(p); }
inline int atomicAdd(int* p, int v) {  // blocks run one after another on the emulator
  emu_access(p, 4, true);
  const int old = *p;
  *p = old + v;
  return old;
}
inline void __threadfence() {}
template <class T> inline void __stcs(T* p, T v) { emu_deref_store(p, v); }
inline void __syncthreads() { emu::block_barrier(); }
inline float __shfl_xor_sync(unsigned mask, float v, int o) {
  if (mask != 0xffffffffu) emu::fail("shuffle with a partial mask");
  const int lane = emu::cur->lane;
  *static_cast<float*>(emu::warp_slot(lane)) = v;
  emu::warp_barrier();
  const float r = *static_cast<const float*>(emu::warp_slot(lane ^ o));
  emu::warp_barrier();
  return r;
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __frcp_rn(float x) { return 1.f / x; }
"""


@functools.cache
def _instance(source: str, defines: tuple[tuple[str, Any], ...], expr: str) -> Any:
    """g++-build one template instance of kernels/<source> for the emulator (cached)."""
    sys.path.insert(0, str(ROOT))
    from dnnctl.resources import kernels_dir
    from tools.cuda_emu import emu as E

    path = kernels_dir() / source
    defs = [f"-D{k}={int(v) if isinstance(v, bool) else v}" for k, v in defines]
    digest = hashlib.sha256(" ".join([*defs, expr, SHIM]).encode())
    for f in [path, *sorted((kernels_dir() / "include").rglob("*")), *sorted(
            (ROOT / "tools" / "cuda_emu").glob("*.h"))]:
        if f.is_file():
            digest.update(f.name.encode() + f.read_bytes())
    E.CACHE.mkdir(parents=True, exist_ok=True)
    shim = E.CACHE / f"mem-shim-{hashlib.sha256(SHIM.encode()).hexdigest()[:12]}.h"
    if not shim.exists():
        shim.write_text(SHIM)
    so = E.CACHE / f"mem-{path.stem}-{digest.hexdigest()[:20]}.so"
    if not so.exists():
        tmp = f"{so}.{os.getpid()}.tmp"  # (concurrent runs build the same library)
        harness = so.with_suffix(f".{os.getpid()}.cpp")
        harness.write_text(
            f'#include "{path}"\n#include "emu_runtime.h"\n'
            'extern "C" int emu_launch_k(const unsigned* g, const unsigned* b, size_t smem, '
            "void** args, const size_t* sizes, int nargs, const void* const* bufs, "
            "const size_t* bb, int nb, unsigned seed, char* err, size_t errlen) { return "
            f"emu::launch(&{expr}, g, b, smem, args, sizes, nargs, bufs, bb, nb, seed, err, "
            "errlen); }\n")
        cmd = ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-include",
               str(E.HERE / "emu_prelude.h"), "-include", str(shim), "-DDNNCTL_EMU",
               "-DDNNCTL_HEADERS=0",
               f"-I{kernels_dir() / 'include'}", f"-I{E.HERE}", f"-I{E.CUDA_INC}", *defs,
               str(harness), "-o", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise E.EmuError(f"g++ failed for {source} {expr} {defs}:\n{res.stderr[-5000:]}")
        os.replace(tmp, so)
    return E.EmuFunction(ctypes.CDLL(str(so)), "k")


class _LazyFunction:
    """A template instance compiled on its first launch (modules name many instances)."""

    def __init__(self, source: str, defines: tuple, expr: str) -> None:
        self.source, self.defines, self.expr = source, defines, expr
        self.max_dynamic_shared_size_bytes = 0
        self.launches: list[tuple] = []

    def __call__(self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any],
                 shared_mem: int = 0, stream: Any = None, cooperative: bool = False) -> None:
        fn = _instance(self.source, self.defines, self.expr)
        fn.max_dynamic_shared_size_bytes = self.max_dynamic_shared_size_bytes
        self.launches.append((tuple(grid), tuple(block), shared_mem))
        fn(grid, block, args, shared_mem=shared_mem, cooperative=cooperative)


class _TemplateModule:
    def __init__(self, source: str, defines: tuple, names: tuple[str, ...]) -> None:
        self.source, self.defines, self.names = source, defines, names

    def get_function(self, name: str) -> _LazyFunction:
        assert name in self.names, f"{name} was not among the module's name expressions"
        return _LazyFunction(self.source, self.defines, name)


@pytest.fixture(scope="module")
def emu() -> Any:
    sys.path.insert(0, str(ROOT))
    from dnnctl.backends import registry as base
    from tools.cuda_emu import emu as E

    class MemoryEmuBackend(E.EmuBackend):
        def compile_module(self, source: str, *, defines: Mapping[str, Any] | None = None,
                           name_expressions: Sequence[str] = (), options: Sequence[str] = (),
                           device: int | None = None) -> _TemplateModule:
            return _TemplateModule(source, tuple(sorted((defines or {}).items())),
                                   tuple(name_expressions))

    saved = base._BACKENDS.get("cupy")
    be = MemoryEmuBackend()
    base._BACKENDS["cupy"] = be
    yield be
    if saved is None:
        base._BACKENDS.pop("cupy", None)
    else:
        base._BACKENDS["cupy"] = saved


# ----------------------------------------------------------------------------- problems

DT = ("float32", "float16", "bfloat16")
PROBLEMS: dict[str, list[dict[str, Any]]] = {
    "activation": [
        dict(fn="gelu", shape=(3, 5, 7), dtype="float16"),
        dict(fn="silu", shape=(2, 6, 4, 4), dtype="bfloat16", bias="channel", inplace=True),
        dict(fn="leaky_relu", shape=(2, 3, 3, 8), dtype="float32", bias="channel",
             layout="NHWC"),
        dict(fn="relu", shape=(1,), dtype="float32"),
        dict(fn="gelu_tanh", shape=(2, 5, 3), dtype="bfloat16", bias="channel"),
        dict(fn="tanh", shape=(1037,), dtype="float16"),
        dict(fn="sigmoid", shape=(4, 16), dtype="float16", bias="channel", layout="NHWC"),
        dict(fn="relu6", shape=(2, 6, 4, 4), dtype="float16", bias="channel"),
        dict(fn="hardswish", shape=(3, 40), dtype="bfloat16"),
        dict(fn="hardsigmoid", shape=(2, 3, 3, 8), dtype="float32", bias="channel",
             layout="NHWC"),
        {"fn": "gelu", "shape": (3, 5, 7), "dtype": "float16", "pass": "backward"},
        {"fn": "relu", "shape": (1,), "dtype": "float32", "pass": "backward"},
        {"fn": "silu", "shape": (2, 6, 4, 4), "dtype": "bfloat16", "bias": "channel",
         "pass": "backward"},
        {"fn": "gelu_tanh", "shape": (2, 3, 3, 8), "dtype": "float32", "bias": "channel",
         "layout": "NHWC", "pass": "backward"},
        {"fn": "leaky_relu", "shape": (5, 24), "dtype": "float16", "bias": "channel",
         "layout": "NHWC", "pass": "backward"},
        {"fn": "tanh", "shape": (1037,), "dtype": "float16", "pass": "backward"},
        {"fn": "sigmoid", "shape": (2, 3, 5), "dtype": "float32", "bias": "channel",
         "pass": "backward"},
        {"fn": "relu6", "shape": (5, 24), "dtype": "float16", "bias": "channel",
         "layout": "NHWC", "pass": "backward"},
        {"fn": "hardswish", "shape": (2, 6, 4, 4), "dtype": "float32", "bias": "channel",
         "pass": "backward"},
        {"fn": "hardsigmoid", "shape": (1037,), "dtype": "bfloat16", "pass": "backward"},
    ],
    "softmax": [
        dict(rows=5, cols=1, dtype="float32"),
        dict(rows=7, cols=33, dtype="float16"),
        dict(rows=3, cols=300, dtype="bfloat16", log=True),
        dict(rows=2, cols=1000, dtype="float32"),
        dict(rows=2, cols=8200, dtype="float16"),
        dict(rows=1, cols=9000, dtype="float32", log=True),
        # backward (pass: backward): y, dy -> dx
        {"rows": 5, "cols": 1, "dtype": "float32", "pass": "backward"},
        {"rows": 7, "cols": 33, "dtype": "float16", "pass": "backward"},
        {"rows": 3, "cols": 300, "dtype": "bfloat16", "log": True, "pass": "backward"},
        {"rows": 2, "cols": 2000, "dtype": "float32", "pass": "backward"},
        {"rows": 1, "cols": 9000, "dtype": "float16", "log": True, "pass": "backward"},
    ],
    "layer_norm": [
        dict(rows=4, cols=1, dtype="float32"),
        dict(rows=6, cols=100, dtype="float16"),
        dict(rows=3, cols=257, dtype="bfloat16", bias=False),
        dict(rows=2, cols=2048, dtype="float32", weight=False, bias=False),
        dict(rows=2, cols=8200, dtype="float16"),
        {"rows": 5, "cols": 1, "dtype": "float32", "pass": "backward"},
        {"rows": 7, "cols": 100, "dtype": "float16", "pass": "backward"},
        {"rows": 3, "cols": 257, "dtype": "bfloat16", "bias": False, "pass": "backward"},
        {"rows": 1, "cols": 2048, "dtype": "float32", "weight": False, "pass": "backward"},
    ],
    "rms_norm": [
        dict(rows=5, cols=64, dtype="bfloat16"),
        dict(rows=3, cols=129, dtype="float32", weight=False),
        dict(rows=1, cols=9000, dtype="bfloat16"),
        {"rows": 9, "cols": 64, "dtype": "bfloat16", "pass": "backward"},
        {"rows": 3, "cols": 129, "dtype": "float32", "weight": False, "pass": "backward"},
    ],
    "batch_norm": [
        dict(n=2, c=3, h=5, w=5, dtype="float16", layout="NCHW"),
        dict(n=2, c=8, h=3, w=3, dtype="bfloat16", layout="NHWC", affine=False),
        dict(n=2, c=5, h=3, w=4, dtype="float32", layout="NHWC", training=True),
        dict(n=3, c=8, h=4, w=4, dtype="bfloat16", layout="NHWC", training=True,
             affine=False),
        dict(n=2, c=4, h=1, w=9, dtype="float16", layout="NCHW", training=True),
        dict(n=2, c=3, h=4, w=8, dtype="float32", layout="NCHW", training=True),
        # 24 channels do not divide BLOCK * VEC: infer_exact reads parameters per vector
        dict(n=2, c=24, h=3, w=5, dtype="float16", layout="NHWC"),
        dict(n=3, c=24, h=5, w=3, dtype="float16", layout="NHWC", training=True),
        {"n": 2, "c": 3, "h": 5, "w": 5, "dtype": "float16", "layout": "NCHW",
         "training": True, "pass": "backward"},
        {"n": 1, "c": 8, "h": 3, "w": 3, "dtype": "bfloat16", "layout": "NHWC",
         "training": True, "affine": False, "pass": "backward"},
        {"n": 3, "c": 24, "h": 5, "w": 3, "dtype": "float32", "layout": "NHWC",
         "training": True, "pass": "backward"},
        {"n": 2, "c": 4, "h": 1, "w": 9, "dtype": "float32", "layout": "NCHW",
         "training": True, "pass": "backward"},
        # training statistics over several splits (train_lastblock: the last block folds)
        dict(n=8, c=8, h=16, w=16, dtype="float16", layout="NHWC", training=True),
        dict(n=8, c=2, h=32, w=32, dtype="float32", layout="NCHW", training=True),
        # channel tiles of 128 bytes with a partial last tile, over two splits
        dict(n=4, c=136, h=4, w=4, dtype="float16", layout="NHWC", training=True),
        # more channel vectors than a block's threads at vec 1 and 2 (train_persist: channel
        # tiles along the grid's y)
        dict(n=3, c=4096, h=1, w=1, dtype="float32", layout="NHWC", training=True,
             activation="relu"),
        {"n": 4, "c": 136, "h": 4, "w": 4, "dtype": "float16", "layout": "NHWC",
         "training": True, "pass": "backward"},
        # relu(batch_norm(x)): the fused ReLU forward, and its backward's recomputed mask
        dict(n=2, c=16, h=3, w=5, dtype="float16", layout="NHWC", activation="relu"),
        dict(n=4, c=24, h=4, w=4, dtype="bfloat16", layout="NHWC", training=True,
             activation="relu"),
        dict(n=2, c=3, h=4, w=8, dtype="float32", layout="NCHW", training=True,
             activation="relu"),
        {"n": 4, "c": 136, "h": 4, "w": 4, "dtype": "float16", "layout": "NHWC",
         "training": True, "activation": "relu", "pass": "backward"},
        {"n": 2, "c": 3, "h": 5, "w": 5, "dtype": "float32", "layout": "NCHW",
         "training": True, "activation": "relu", "pass": "backward"},
        {"n": 2, "c": 8, "h": 3, "w": 3, "dtype": "bfloat16", "layout": "NHWC",
         "training": True, "affine": False, "activation": "relu", "pass": "backward"},
        # relu(batch_norm(x) + residual): a ResNet block's end
        dict(n=2, c=16, h=3, w=5, dtype="float16", layout="NHWC", activation="relu",
             residual=True),
        dict(n=4, c=24, h=4, w=4, dtype="bfloat16", layout="NHWC", training=True,
             activation="relu", residual=True),
        dict(n=2, c=3, h=4, w=8, dtype="float32", layout="NCHW", training=True,
             residual=True),
        {"n": 4, "c": 136, "h": 4, "w": 4, "dtype": "float16", "layout": "NHWC",
         "training": True, "activation": "relu", "residual": True, "pass": "backward"},
        {"n": 2, "c": 3, "h": 5, "w": 5, "dtype": "float32", "layout": "NCHW",
         "training": True, "activation": "relu", "residual": True, "pass": "backward"},
    ],
    "group_norm": [
        dict(n=2, c=6, h=5, w=5, groups=3, dtype="float16", layout="NCHW"),
        dict(n=2, c=8, h=3, w=3, groups=2, dtype="float32", layout="NHWC"),
        dict(n=1, c=16, h=32, w=16, groups=2, dtype="float16", layout="NHWC", affine=False),
        dict(n=1, c=4, h=48, w=48, groups=2, dtype="bfloat16", layout="NCHW"),
        {"n": 2, "c": 6, "h": 5, "w": 5, "groups": 3, "dtype": "float16", "layout": "NCHW",
         "pass": "backward"},
        {"n": 2, "c": 8, "h": 3, "w": 3, "groups": 2, "dtype": "float32", "layout": "NHWC",
         "pass": "backward"},
        {"n": 1, "c": 40, "h": 3, "w": 5, "groups": 5, "dtype": "bfloat16", "layout": "NHWC",
         "affine": False, "pass": "backward"},
    ],
    "pool2d": [
        dict(n=2, c=4, h=7, w=7, mode="max", kernel=3, stride=2, pad=1, dtype="float16",
             layout="NCHW"),
        dict(n=2, c=3, h=8, w=9, mode="avg", kernel=(3, 2), stride=(1, 2), pad=(1, 0),
             ceil_mode=True, count_include_pad=False, dtype="float32", layout="NHWC"),
        dict(n=1, c=8, h=6, w=6, mode="max", kernel=2, stride=1, pad=1, dilation=2,
             dtype="bfloat16", layout="NHWC"),
        dict(n=1, c=16, h=9, w=10, mode="avg", kernel=3, stride=2, pad=1, ceil_mode=True,
             dtype="float16", layout="NCHW"),
        # nhwc_tile: 2-byte vectors (no cp.async), and channel tiles with a partial last one
        dict(n=1, c=5, h=7, w=7, mode="max", kernel=3, stride=2, pad=1, dtype="float16",
             layout="NHWC"),
        dict(n=2, c=48, h=9, w=7, mode="avg", kernel=3, stride=2, pad=1, ceil_mode=True,
             dtype="float32", layout="NHWC"),
        # max with indices, and backward (stride 2 overlapping windows, odd sizes, N=1)
        dict(n=2, c=4, h=7, w=7, mode="max", kernel=3, stride=2, pad=1, dtype="float16",
             layout="NCHW", indices=True),
        dict(n=1, c=5, h=6, w=6, mode="max", kernel=2, stride=1, pad=1, dilation=2,
             dtype="bfloat16", layout="NHWC", indices=True),
        {"n": 2, "c": 4, "h": 7, "w": 7, "mode": "max", "kernel": 3, "stride": 2, "pad": 1,
         "dtype": "float16", "layout": "NCHW", "pass": "backward"},
        {"n": 1, "c": 5, "h": 6, "w": 6, "mode": "max", "kernel": 2, "stride": 1, "pad": 1,
         "dilation": 2, "dtype": "bfloat16", "layout": "NHWC", "pass": "backward"},
        {"n": 2, "c": 3, "h": 8, "w": 9, "mode": "avg", "kernel": (3, 2), "stride": (1, 2),
         "pad": (1, 0), "ceil_mode": True, "count_include_pad": False, "dtype": "float32",
         "layout": "NHWC", "pass": "backward"},
        {"n": 1, "c": 16, "h": 9, "w": 10, "mode": "avg", "kernel": 3, "stride": 2, "pad": 1,
         "ceil_mode": True, "dtype": "float16", "layout": "NCHW", "pass": "backward"},
    ],
    "global_avg_pool2d": [
        dict(n=2, c=5, h=3, w=3, dtype="float16", layout="NCHW"),
        dict(n=2, c=16, h=4, w=4, dtype="float32", layout="NHWC"),
        dict(n=1, c=8, h=48, w=48, dtype="float16", layout="NHWC"),
        dict(n=1, c=2, h=64, w=64, dtype="bfloat16", layout="NCHW"),
        {"n": 2, "c": 5, "h": 3, "w": 3, "dtype": "float16", "layout": "NCHW",
         "pass": "backward"},
        {"n": 1, "c": 16, "h": 4, "w": 4, "dtype": "bfloat16", "layout": "NHWC",
         "pass": "backward"},
    ],
}

SAMPLES = int(os.environ.get("DNNCTL_EMU_SAMPLES", "2"))


def _cases() -> list[tuple[str, int, str]]:
    from dnnctl.ops.registry import variants

    out = []
    for op, keys in PROBLEMS.items():
        for i in range(len(keys)):
            for v in variants(op, "cupy"):
                out.append((op, i, v.name))
    return out


@pytest.mark.parametrize("op_name,index,variant_name", _cases())
def test_cuda_variant_on_emulator(emu: Any, op_name: str, index: int,
                                  variant_name: str) -> None:
    from dnnctl.ops.check import check_variant
    from dnnctl.ops.registry import get_op, get_variant

    op = get_op(op_name)
    problem = op.problem(PROBLEMS[op_name][index])
    variant = get_variant(op_name, "cupy", variant_name)
    device = emu.device(0)
    if not variant.supports(problem, device):
        pytest.skip(variant.supports(problem, device).reason)
    space = list(variant.param_space(problem, device))
    assert space, f"{variant_name} supports {problem.short()} but has no valid parameters"
    default = op.default_choice(problem, "cupy", device)
    picks = [default.param_dict] if default.variant == variant_name else []
    rng = random.Random(f"{op_name}{index}{variant_name}")
    picks += rng.sample(space, min(SAMPLES, len(space)))
    for params in picks:
        res = check_variant(op, problem, variant, params, emu, device, seed=index)
        assert res.ok, f"{problem.short()} {variant_name}{params}: {res.detail}"


def test_misaligned_pointers_take_the_scalar_path(emu: Any) -> None:
    """Views 2 bytes off a 16-byte boundary must run (VEC = 1 path) and be right."""
    from dnnctl.ops.registry import get_op, get_variant

    cases = [("activation", dict(fn="relu", shape=(64,), dtype="float16"), "grid_stride",
              {"block": 128, "vec": 8, "unroll": 2, "blocks_per_sm": 2}),
             ("softmax", dict(rows=4, cols=64, dtype="float16"), "warp_row",
              {"block": 128, "tpr": 8, "vec": 8}),
             ("layer_norm", dict(rows=4, cols=64, dtype="float16"), "block_row",
              {"block": 128, "vec": 8})]
    dev = emu.device(0)
    for op_name, key, vname, params in cases:
        op = get_op(op_name)
        problem = op.problem(key)
        kernel = get_variant(op_name, "cupy", vname).build(problem, params, dev)
        rng = np.random.default_rng(0)
        ins = op.make_inputs(problem, rng)
        moved = {}
        for k, v in ins.items():
            buf = np.empty(v.size + 1, v.dtype)
            view = buf[1:].reshape(v.shape)
            view[...] = v
            moved[k] = view
        out_buf = np.full(ins["x"].size + 1, np.nan, ins["x"].dtype)
        out = {"y": out_buf[1:].reshape(op.output_specs(problem)["y"].shape)}
        kernel(moved, out, op.default_attrs(problem))
        ref = op.reference(problem, {k: v.astype(np.float64) for k, v in ins.items()},
                           op.default_attrs(problem))["y"]
        from dnnctl.ops.base import rel_norm_error

        assert rel_norm_error(out["y"], ref) <= op.tolerance(problem, "y"), (op_name, vname)


@pytest.mark.parametrize("op_name,key,vname", [
    ("softmax", dict(rows=3, cols=40, dtype="float16"), "warp_row"),
    ("softmax", dict(rows=3, cols=40, dtype="float32", log=True), "online"),
    ("activation", dict(fn="relu", shape=(40,), dtype="float32"), "exact_grid"),
    ("pool2d", dict(n=1, c=8, h=5, w=5, mode="max", kernel=3, stride=2, pad=1,
                    dtype="float16", layout="NHWC"), "nhwc_vector"),
    ("layer_norm", dict(rows=3, cols=40, dtype="bfloat16"), "welford"),
])
def test_nan_and_inf_propagate_like_the_reference(emu: Any, op_name: str, key: dict,
                                                  vname: str) -> None:
    from dnnctl.ops.base import rel_norm_error
    from dnnctl.ops.registry import get_op, get_variant

    op = get_op(op_name)
    problem = op.problem(key)
    dev = emu.device(0)
    variant = get_variant(op_name, "cupy", vname)
    params = next(iter(variant.param_space(problem, dev)))
    kernel = variant.build(problem, params, dev)
    ins = op.make_inputs(problem, np.random.default_rng(1))
    flat = ins["x"].reshape(-1)
    flat[1] = np.nan
    flat[7] = np.inf
    flat[-2] = -np.inf
    out = {k: np.full(s.shape, 7.0, np.dtype(ins["x"].dtype))
           for k, s in op.output_specs(problem).items()}
    kernel(ins, out, op.default_attrs(problem))
    ref = op.reference(problem, {k: v.astype(np.float64) for k, v in ins.items()},
                       op.default_attrs(problem))["y"]
    assert np.isnan(ref).any() or np.isinf(ref).any()
    assert rel_norm_error(out["y"], ref) <= op.tolerance(problem, "y")


@pytest.mark.parametrize("op_name,key", [
    ("batch_norm", {"n": 3, "c": 24, "h": 5, "w": 3, "dtype": "float32", "layout": "NHWC",
                    "training": True, "pass": "backward"}),
    ("group_norm", {"n": 2, "c": 8, "h": 3, "w": 3, "groups": 2, "dtype": "float32",
                    "layout": "NHWC", "pass": "backward"}),
])
def test_norm_backward_dx_keeps_an_offset_channel_accurate(emu: Any, op_name: str,
                                                            key: dict) -> None:
    """x = 1e3 + N(0, 1): dx subtracts the mean per element (a folded b x + (c0 - b mean)
    cancels b x against b mean and loses ~10 bits)."""
    from dnnctl.ops.base import rel_norm_error
    from dnnctl.ops.registry import get_op

    op = get_op(op_name)
    problem = op.problem(key)
    dev = emu.device(0)
    choice = op.default_choice(problem, "cupy", dev)
    from dnnctl.ops.registry import get_variant

    kernel = get_variant(op_name, "cupy", choice.variant).build(problem, choice.param_dict,
                                                               dev)
    rng = np.random.default_rng(3)
    ins = op.make_inputs(problem, rng)
    ins["x"] = (ins["x"] + np.float32(1e3)).astype(np.float32)
    stats = ("save_mean", "save_invstd") if op_name == "batch_norm" else ("mean", "rstd")
    if op_name == "batch_norm":
        from dnnctl.ops import _spatial_norm as sp

        xf = ins["x"].astype(np.float64)
        axes = sp.reduce_axes(problem)
        mean = xf.mean(axis=axes)
        var = np.square(xf - mean.reshape(sp.channel_shape(problem))).mean(axis=axes)
    else:
        from dnnctl.ops.group_norm.backward import gn_stats

        mean, rstd = gn_stats(problem, ins["x"], op.attrs["eps"])
        var = 1 / rstd**2 - op.attrs["eps"]
    ins[stats[0]] = mean.astype(np.float32)
    ins[stats[1]] = (1 / np.sqrt(var + op.attrs["eps"])).astype(np.float32)
    out = {k: np.full(s.shape, np.nan, np.float32) for k, s in op.output_specs(problem).items()}
    kernel(ins, out, op.default_attrs(problem))
    ref = op.reference(problem, {k: v.astype(np.float64) for k, v in ins.items()}, {})["dx"]
    assert rel_norm_error(out["dx"], ref) < 1e-6
