"""Host side of our tiled GEMM kernels (kernels/gemm/gemm.cu and the split-K finish in
kernels/gemm/epilogue.cu): tile configurations, compile-time defines, shared-memory sizes,
workspace sizes and launches. The matmul variants and the conv2d gemm_1x1 variant use it.

A :class:`GemmDesc` is one strided-batched product ``C[b] = epi(A[b] @ B[b])`` for
``b < batch`` with ``A[b] = A + b * sa`` (M x K, K contiguous when ``a_kmajor`` else M
contiguous, leading dimension ``lda``), likewise B (K x N; ``b_kmajor`` means stored N x K)
and row-major C. :func:`make_gemm` compiles the kernels for it and returns a launcher.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dnnctl.backends import cuda
from dnnctl.backends.base import DeviceInfo
from dnnctl.backends.cuda import ptr
from dnnctl.backends.registry import get_backend
from dnnctl.errors import KernelLaunchError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops import codes
from dnnctl.ops.base import dtype_name, np_dtype

MATH_MMA16, MATH_TF32, MATH_SIMT = 0, 1, 2
MATH_WGMMA = 3  # Hopper wgmma kernel (kernels/gemm/wgmma.cu): wm = 4 warps per warpgroup
BIAS_NONE, BIAS_COL, BIAS_ROW = (codes.BIAS_MODE[m] for m in ("none", "col", "row"))
OUT_STORE, OUT_PARTIAL, OUT_ATOMIC, OUT_FUSED = (codes.OUT_MODE[m] for m in ("store", "partial",
                                                                       "atomic", "fused"))
DTYPE_CODES = codes.DTYPE
ELEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
DEFAULT_SMEM_OPTIN = 227 * 1024  # H100 / H200 per-block opt-in limit
MAX_GRID_Z = 65535


def math_for(dtype: str, tf32: bool, simt: bool = False) -> int:
    """The math policy for a dtype: mma16 for fp16/bf16, tf32 mma or SIMT FFMA for fp32."""
    if dtype != "float32":
        return MATH_MMA16
    return MATH_SIMT if simt or not tf32 else MATH_TF32


def vec_for(extent: int, elem_bytes: int) -> int:
    """Elements per global load: the largest power of two <= 16 bytes dividing ``extent``."""
    v = 16 // elem_bytes
    while v > 1 and extent % v:
        v //= 2
    return v


def warp_layout(bm: int, bn: int, warps: int, math_kind: int) -> tuple[int, int] | None:
    """(warps along M, warps along N) giving the squarest legal warp tiles, or None.

    mma warp tiles are multiples of 16 x 16 (ldmatrix.x4 loads two n8 tiles of B); SIMT warp
    tiles are multiples of 4 x 8 (lanes as 4 x 8).
    """
    um, un = (4, 8) if math_kind == MATH_SIMT else (16, 16)
    best: tuple[float, int, int] | None = None
    wm = 1
    while wm <= warps:
        wn = warps // wm
        if wm * wn == warps and bm % (wm * um) == 0 and bn % (wn * un) == 0:
            skew = abs(math.log2((bm // wm) / (bn // wn)))
            if best is None or skew < best[0]:
                best = (skew, wm, wn)
        wm *= 2
    return None if best is None else (best[1], best[2])


@dataclass(frozen=True)
class TileConfig:
    """Block tile, warps and pipeline of one kernel instantiation."""

    math: int
    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int

    @property
    def threads(self) -> int:
        return self.wm * self.wn * 32

    @property
    def acc_per_thread(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn) // 32

    def smem_bytes(self, dtype: str) -> int:
        elem = 4 if self.math not in (MATH_MMA16, MATH_WGMMA) else ELEM_BYTES[dtype]
        ring = self.stages * (self.bm + self.bn) * self.bk * elem
        return ring + 1024 if self.math == MATH_WGMMA else ring  # 1 KB to align the atoms


def tile_config(params: Mapping[str, Any], math_kind: int) -> TileConfig | None:
    """The TileConfig of a variant's parameters (bm, bn, bk, warps, stages), or None."""
    layout = warp_layout(params["bm"], params["bn"], params["warps"], math_kind)
    if layout is None:
        return None
    return TileConfig(math_kind, params["bm"], params["bn"], params["bk"], layout[0],
                      layout[1], params["stages"])


def tile_ok(cfg: TileConfig, dtype: str, device: DeviceInfo | None) -> bool:
    """Register and shared-memory budget of a configuration on ``device``."""
    if cfg.acc_per_thread > 128 or cfg.acc_per_thread < 8:
        return False
    if cfg.math == MATH_MMA16 and cfg.bk % 16:
        return False
    if cfg.math == MATH_TF32 and cfg.bk % 8:
        return False
    limit = (device.smem_per_block_optin if device is not None else 0) or DEFAULT_SMEM_OPTIN
    return cfg.smem_bytes(dtype) <= limit


def split_plan(k: int, bk: int, splitk: int) -> tuple[int, int]:
    """(kchunk, splits): K per split (a multiple of bk) and the number of non-empty splits."""
    ktiles = max(1, -(-k // bk))
    per = -(-ktiles // max(1, splitk))
    return per * bk, -(-ktiles // per)


@dataclass(frozen=True)
class GemmDesc:
    """One strided-batched GEMM with its fused epilogue (see the module docstring)."""

    dtype: str
    m: int
    n: int
    k: int
    batch: int
    a_kmajor: bool
    b_kmajor: bool
    lda: int
    ldb: int
    ldc: int
    sa: int
    sb: int
    sc: int
    act: int = 0
    bias_mode: int = BIAS_NONE
    s_bias: int = 0
    residual: int = 0  # EPI_RES: a ResMode (True / 1: added after the activation)

    def vecs(self) -> tuple[int, int]:
        """Load widths: each divides its operand's leading dimension, its contiguous extent
        (so a piece is wholly inside or outside the matrix) and its batch stride."""
        eb = ELEM_BYTES[self.dtype]
        ga = math.gcd(self.lda, self.k if self.a_kmajor else self.m)
        gb = math.gcd(self.ldb, self.k if self.b_kmajor else self.n)
        if self.batch > 1:
            ga, gb = math.gcd(ga, self.sa), math.gcd(gb, self.sb)
        return vec_for(ga, eb), vec_for(gb, eb)

    def pair_ok(self) -> bool:
        """Two adjacent outputs form one aligned store (ldc and batch stride even)."""
        return self.ldc % 2 == 0 and (self.batch == 1 or self.sc % 2 == 0)


def workspace_elems(desc: GemmDesc, bk: int, splitk: int, atomic: bool) -> int:
    """fp32 elements of split-K workspace (0 without split-K)."""
    if atomic:
        return desc.batch * desc.m * desc.n
    if splitk <= 1:
        return 0
    _, splits = split_plan(desc.k, bk, splitk)
    return 0 if splits <= 1 else splits * desc.batch * desc.m * desc.n


def counter_elems(desc: GemmDesc, cfg_bm: int, cfg_bn: int) -> int:
    """int32 tile counters of the fused split-K reduction (kept per stream, self-resetting)."""
    return -(-desc.m // cfg_bm) * -(-desc.n // cfg_bn) * desc.batch


def swapped(desc: GemmDesc) -> GemmDesc:
    """The descriptor of C^T = B^T A^T over the same stored operands (make_gemm swap=True):
    A' is b (N x K, K-major when b is stored (n, k)), B' is a (K x M, K-major when a is
    stored (m, k)); C keeps its ldc / sc (the kernel stores transposed)."""
    d = desc
    return GemmDesc(dtype=d.dtype, m=d.n, n=d.m, k=d.k, batch=d.batch, a_kmajor=d.b_kmajor,
                    b_kmajor=d.a_kmajor, lda=d.ldb, ldb=d.lda, ldc=d.ldc, sa=d.sb, sb=d.sa,
                    sc=d.sc, act=d.act, bias_mode=d.bias_mode, s_bias=d.s_bias,
                    residual=d.residual)


def aligned(x: Any, nbytes: int) -> Any:
    """``x`` itself when its address is a multiple of nbytes, else an aligned copy (call
    scratch, on the call's stream)."""
    if x is None or ptr(x) % nbytes == 0:
        return x
    y = cuda.scratch(tuple(x.shape), array_dtype(x))
    cuda.copy(y, x)
    return y


def array_dtype(x: Any) -> Any:
    dt = x.dtype
    if isinstance(dt, np.dtype):
        return dt
    return np_dtype(dtype_name(dt))


def load_kernel(source: str, name: str, defines: Mapping[str, int], smem: int) -> Any:
    """Compile (memoized by the backend) and fetch one kernel; opt in to its shared memory."""
    mod = get_backend("cupy").compile_module(source, defines=dict(defines))
    fn = mod.get_function(name)
    if smem > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = smem
    return fn


def finish_kernel(dtype: str, act: int, bias_mode: int, residual: int, layout: int) -> Any:
    """The split-K finish kernel (sums fp32 slabs, applies the epilogue, stores);
    ``residual`` is EPI_RES (a ResMode: True / 1 adds it after the activation)."""
    defines = {"DNNCTL_DTYPE": DTYPE_CODES[dtype], "EPI_ACT": act, "EPI_BIAS": bias_mode,
               "EPI_RES": int(residual), "EPI_LAYOUT": layout}
    return load_kernel("gemm/epilogue.cu", "splitk_finish", defines, 0)


def inplace_epilogue(dtype: str, act: int, bias_mode: int, *, m: int, n: int, batch: int,
                     s_bias: int, sm_count: int = 132) -> Callable[[Any, Any], None]:
    """``go(y, bias)``: y = act(y + bias) in place over ``batch`` dense row-major m x n
    products in ``dtype`` (gemm_epilogue_inplace, after a library GEMM that wrote y). 16-byte
    accesses where n and the pointers allow them, else narrower."""
    eb = np_dtype(dtype).itemsize
    total = m * n * batch
    launches: dict[int, Any] = {}
    i64 = np.int64
    tail = (i64(m * n), np.int32(n), i64(total), i64(s_bias))

    def launch(vec: int) -> Any:
        if vec not in launches:
            fn = load_kernel("gemm/epilogue.cu", "gemm_epilogue_inplace",
                             {"DNNCTL_DTYPE": DTYPE_CODES[dtype], "EPI_ACT": act,
                              "EPI_BIAS": bias_mode, "VEC": vec}, 0)
            blocks = max(1, min(-(-(total // vec) // 256), sm_count * 16))
            launches[vec] = mc.Launch(fn, (blocks, 1, 1), (256, 1, 1))
        return launches[vec]

    widest = 16 // eb
    while widest > 1 and n % widest:
        widest //= 2
    launch(widest)

    def go(y: Any, bias: Any) -> None:
        vec = widest
        while vec > 1 and (ptr(y) % (vec * eb) or (bias is not None and ptr(bias) % (vec * eb))
                           or (s_bias and s_bias % vec)):
            vec //= 2
        launch(vec)((y, bias, *tail))

    return go


def launch_finish(fn: Any, ws: Any, c: Any, bias: Any, res: Any, *, m: int, n: int,
                  batch: int, splits: int, ldc: int, sc: int, s_bias: int, pq: int = 1,
                  img_stride: int = 0, sm_count: int = 132) -> None:
    total = m * n * batch
    blocks = max(1, min(-(-total // 256), sm_count * 16))
    i32, i64 = np.int32, np.int64
    fn((blocks, 1, 1), (256, 1, 1),
       (ws, c, bias, res, i32(m), i32(n), i32(batch), i32(splits), i64(ldc), i64(sc),
        i64(s_bias), i64(pq), i64(img_stride)))


def finish_launch(fn: Any, *, m: int, n: int, batch: int, splits: int, ldc: int, sc: int,
                  s_bias: int, pq: int = 1, img_stride: int = 0,
                  sm_count: int = 132) -> Callable[[Any, Any, Any, Any], None]:
    """:func:`launch_finish` with its geometry and scalar arguments fixed at build time:
    returns ``go(ws, c, bias, res)``."""
    total = m * n * batch
    run = mc.Launch(fn, (max(1, min(-(-total // 256), sm_count * 16)), 1, 1), (256, 1, 1))
    i32, i64 = np.int32, np.int64
    tail = run.consts(i32(m), i32(n), i32(batch), i32(splits), i64(ldc), i64(sc),
                      i64(s_bias), i64(pq), i64(img_stride))

    def go(ws: Any, c: Any, bias: Any, res: Any) -> None:
        run((ws, c, bias, res, *tail))

    return go


class GemmKernel:
    """The Kernel of a :func:`make_gemm` launcher (inputs a, b, bias; output y). It reads
    only data pointers of C-contiguous arrays in their stored layouts (its alignment copies
    keep the layout), so the dispatcher may pass them in any shape of the right size."""

    __slots__ = ("run",)
    flat_io = True
    # make_gemm's run only launches (its copies, zero fills and per-stream counters refuse
    # a recording): the dispatcher may replay it from C++ (dnnctl.backends.replay)
    replayable = True

    def __init__(self, run: Callable[..., None]) -> None:
        self.run = run

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        self.run(inputs["a"], inputs["b"], outputs["y"], inputs.get("bias"), None)


def make_gemm(desc: GemmDesc, cfg: TileConfig, splitk: int, atomic: bool,
              device: DeviceInfo, fused: bool = False,
              overlap: bool = False, swap: bool = False) -> Callable[..., None]:
    """Compile the kernels of ``desc`` with ``cfg`` and return ``run(a, b, c, bias, res)``.

    ``splitk`` > 1 reduces K in slices into per-split fp32 slabs, summed in split order
    (deterministic) by a separate finish kernel, or, with ``fused``, inside the GEMM kernel
    by the last split to finish each tile; with ``atomic`` the splits add into one slab by
    fp32 atomics and the finish kernel applies the epilogue. ``overlap`` selects the mainloop
    whose fragment loads overlap the mma (gemm_core.cuh; fp16 / bf16 only). ``swap``
    (wgmma kernel only): ``desc`` describes C^T = B^T A^T (:func:`swapped`) while C stays
    row-major M x N: the kernel tiles C^T and stores transposed; the pairing rules and the
    finish kernel use C's own dims.
    """
    va, vb = desc.vecs()
    eb = ELEM_BYTES[desc.dtype]
    kchunk, splits = split_plan(desc.k, cfg.bk, splitk if not atomic else max(2, splitk))
    if not atomic and splits <= 1:
        kchunk, splits = desc.k, 1
    if desc.batch * splits > MAX_GRID_Z:
        raise KernelLaunchError(f"gemm: batch {desc.batch} x splits {splits} exceeds the "
                                f"grid limit {MAX_GRID_Z}", hint="use fewer splits")
    if atomic:
        out_mode = OUT_ATOMIC
    elif splits == 1:
        out_mode = OUT_STORE
    else:
        out_mode = OUT_FUSED if fused else OUT_PARTIAL
    epi_here = out_mode in (OUT_STORE, OUT_FUSED)  # the GEMM kernel runs the epilogue
    c_m, c_n = (desc.n, desc.m) if swap else (desc.m, desc.n)  # C's rows and columns
    pair = {OUT_STORE: desc.pair_ok(), OUT_FUSED: desc.pair_ok() and c_n % 2 == 0}.get(
        out_mode, c_n % 2 == 0)
    defines = {
        "DNNCTL_DTYPE": DTYPE_CODES[desc.dtype], "GEMM_MATH": cfg.math, "GEMM_BM": cfg.bm,
        "GEMM_BN": cfg.bn, "GEMM_BK": cfg.bk, "GEMM_WM": cfg.wm, "GEMM_WN": cfg.wn,
        "GEMM_STAGES": cfg.stages, "GEMM_A_KMAJOR": int(desc.a_kmajor),
        "GEMM_B_KMAJOR": int(desc.b_kmajor), "GEMM_VEC_A": va, "GEMM_VEC_B": vb,
        "EPI_ACT": desc.act if epi_here else 0,
        "EPI_BIAS": desc.bias_mode if epi_here else BIAS_NONE,
        "EPI_RES": int(desc.residual) if epi_here else 0,
        "EPI_OUT": out_mode, "EPI_PAIR": int(pair),
    }
    if overlap and cfg.math == MATH_MMA16:
        defines["GEMM_OVERLAP"] = 1
    if swap:
        if cfg.math != MATH_WGMMA:
            raise KernelLaunchError("gemm: swapped operands are a wgmma-kernel mode")
        defines["GEMM_SWAP"] = 1
    smem = cfg.smem_bytes(desc.dtype)
    source = "gemm/wgmma.cu" if cfg.math == MATH_WGMMA else "gemm/gemm.cu"
    main = load_kernel(source, "gemm_kernel", defines, smem)
    fin = None
    if out_mode in (OUT_PARTIAL, OUT_ATOMIC):
        fin = finish_kernel(desc.dtype, desc.act, desc.bias_mode, desc.residual, 0)
    tiles = -(-desc.m // cfg.bm) * -(-desc.n // cfg.bn)
    grid = (tiles, 1, desc.batch * splits)
    block = (cfg.threads, 1, 1)
    ws_elems = 0 if out_mode == OUT_STORE else desc.batch * desc.m * desc.n * (
        1 if atomic else splits)
    counters: dict[int, Any] = {}
    i32, i64 = np.int32, np.int64
    d = desc
    # launches with their geometry and scalar arguments fixed here: a call passes pointers
    main_run = mc.Launch(main, grid, block, smem)
    consts = main_run.consts(i32(d.m), i32(d.n), i32(d.k), i64(d.lda), i64(d.ldb), i64(d.ldc),
                             i64(d.sa), i64(d.sb), i64(d.sc), i64(d.s_bias), i32(d.batch),
                             i32(splits), i32(kchunk))
    fin_go = None if fin is None else finish_launch(
        fin, m=c_m, n=c_n, batch=d.batch, splits=1 if atomic else splits, ldc=d.ldc, sc=d.sc,
        s_bias=d.s_bias, sm_count=device.sm_count or 132)
    a_bytes, b_bytes, c_bytes = va * eb, vb * eb, 2 * eb

    def run(a: Any, b: Any, c: Any, bias: Any = None, res: Any = None) -> None:
        if swap:  # the kernel's A is the product's b, and its B the product's a
            a, b = b, a
        if ptr(a) % a_bytes:
            a = aligned(a, a_bytes)
        if ptr(b) % b_bytes:
            b = aligned(b, b_bytes)
        c_out = c if ptr(c) % c_bytes == 0 else cuda.scratch(tuple(c.shape), array_dtype(c))
        if res is not None:
            res = aligned(res, c_bytes)
        ws = cnt = None
        if ws_elems:
            ws = (cuda.scratch_zeros if atomic else cuda.scratch)((ws_elems,), np.float32)
        if out_mode == OUT_FUSED:
            # kept per stream: a replay on another stream would share them
            cuda.refuse("split-K tile counters kept per stream")
            key = cuda.current_stream()
            cnt = counters.get(key)
            if cnt is None and cuda.capturing():
                # a stream first seen inside a capture: counters of this call only, from the
                # graph's pool, zeroed by a captured memset (no cudaMalloc while capturing)
                cnt = cuda.scratch_zeros((tiles * d.batch,), np.int32)
            elif cnt is None:  # zero once per stream; each launch leaves them zero again
                # kept for good, so from CuPy's own pool: never the caller's allocator, whose
                # block may be a CUDA graph's private pool (torch.compile's cudagraph trees
                # reject a live tensor they did not hand out)
                cnt = mc.workspace(device, 4 * tiles * d.batch).view(np.int32)
                cnt.fill(0)
                counters[key] = cnt
        main_run((a, b, c_out, bias, res, ws, cnt, *consts))
        if fin_go is not None:
            fin_go(ws, c_out, bias, res)
        if c_out is not c:
            cuda.copy(c, c_out)

    return run
