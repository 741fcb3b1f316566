"""Row-kernel variants shared by softmax, layer_norm and rms_norm (rows x cols, reduce a row).

The row strategies are mixins over :class:`RowVariant`; an op's base class gives its defines,
how its arrays are passed and its scalars, and :func:`register_strategies` registers a variant
per strategy (its .cu file and kernel template):

* ``warp_row``  — TPR threads (part of a warp) per row, row in registers (cols <= 2048)
* ``block_row`` — a block per row, row in registers (cols <= 16384)
* ``block_smem`` — a block per row staged in shared memory (cols * itemsize <= opt-in smem)
* ``async_smem`` — block_smem with the row staged by cp.async (all copies in flight at once)
* ``online``    — a block per row, single-pass statistics, second read (any length)
* ``split_row`` — few long rows: chunks of a row on separate blocks, partials, then apply

Every kernel has the signature ``k(arrays..., int rows, int cols, scalars...)``. A built
kernel holds two launch programs: the VEC one, and a VEC = 1 one run when a pointer is not
aligned to VEC elements.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import DTYPES, SUPPORTED, Choice, Field, Kernel, Problem, Support, unsupported

Program = Callable[[tuple, Mapping[str, Any]], None]

# the key fields of a row op (softmax, layer_norm, rms_norm): a (rows, cols) view, cols reduced
ROW_FIELDS = {
    "rows": Field("int", minimum=1, doc="product of all but the last axis"),
    "cols": Field("int", minimum=1, doc="length of the last (reduced) axis"),
    "dtype": Field("str", choices=DTYPES),
}


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


SPLIT_CHUNKS: tuple[int, ...] = (2048, 4096, 16384, 65536)  # split_row: elements per block


class RowKernel(mc.VecKernel):
    """Runs ``fast`` when every array is aligned to ``align`` bytes, else ``safe``."""

    __slots__ = ("arrays",)

    def __init__(self, fast: Program, safe: Program, align: int,
                 arrays: Callable[[Mapping[str, Any], Mapping[str, Any]], tuple]) -> None:
        super().__init__(fast, safe, align)
        self.arrays = arrays

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        arrs = self.arrays(inputs, outputs)
        (self.fast if mc.aligned(self.align, *arrs) else self.safe)(arrs, attrs)


class RowVariant(mc.CudaVariant):
    """A CUDA row kernel: subclasses set ``kernel``, ``source`` and the three hooks below."""

    kernel: ClassVar[str] = ""
    params: ClassVar[dict[str, tuple[Any, ...]]] = {"block": (128, 256, 512, 1024),
                                                    "vec": mc.VECS}

    # -- hooks
    def defines(self, problem: Problem) -> dict[str, Any]:
        raise NotImplementedError

    def arrays(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple:
        raise NotImplementedError

    def scalars(self, attrs: Mapping[str, Any], run: mc.Launch | None = None) -> tuple:
        """Per-call scalar arguments from ``attrs`` (converted through ``run`` if given)."""
        return ()

    # -- strategy (mixins)
    def instance(self, problem: Problem, params: Mapping[str, Any], vec: int) -> str:
        return f"{self.kernel}<{params['block']},{vec}>"

    def grid(self, problem: Problem, params: Mapping[str, Any]) -> Any:
        return problem["rows"]

    def smem(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 0

    # -- common
    def vec_valid(self, problem: Problem, vec: int) -> bool:
        return mc.vec_fits(problem["dtype"], vec) and problem["cols"] % vec == 0

    def busy(self, problem: Problem, params: Mapping[str, Any]) -> bool:
        """No half-idle blocks: a smaller block would not also cover the row in one sweep."""
        return params["block"] == 128 or (params["block"] // 2) * params["vec"] < problem["cols"]

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return self.vec_valid(problem, params["vec"]) and self.busy(problem, params)

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["rows"] >= 2**31:
            return unsupported("2^31 rows or more")
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        vec = params["vec"] if self.vec_valid(problem, params["vec"]) else 1
        names = [self.instance(problem, params, vec), self.instance(problem, params, 1)]
        mod = mc.compile_cuda(self.source, self.defines(problem), names, device)
        fast = self._program(mod, problem, params, vec)
        safe = self._program(mod, problem, params, 1)
        return RowKernel(fast, safe, vec * mc.dtype_size(problem["dtype"]), self.arrays)

    def _program(self, mod: Any, problem: Problem, params: Mapping[str, Any],
                 vec: int) -> Program:
        run = mc.launch(mod, self.instance(problem, params, vec), self.grid(problem, params),
                        params["block"], self.smem(problem, params))
        dims = run.consts(np.int32(problem["rows"]), np.int32(problem["cols"]))
        if type(self).scalars is RowVariant.scalars:  # no per-call scalars (softmax)

            def go(arrs: tuple, attrs: Mapping[str, Any]) -> None:
                run((*arrs, *dims))

            return go
        scalars = self.scalars

        def go_attrs(arrs: tuple, attrs: Mapping[str, Any]) -> None:
            run((*arrs, *dims, *scalars(attrs, run)))

        return go_attrs


class WarpRowMixin(RowVariant):
    params = {"block": (128, 256), "tpr": (1, 2, 4, 8, 16, 32), "vec": mc.VECS}
    MAX_ELEMS = 64  # floats per thread kept in registers

    def nv(self, problem: Problem, params: Mapping[str, Any], vec: int) -> int:
        return mc.cdiv(problem["cols"], params["tpr"] * vec)

    def instance(self, problem: Problem, params: Mapping[str, Any], vec: int) -> str:
        nv = self.nv(problem, params, vec)
        return f"{self.kernel}<{params['block']},{params['tpr']},{vec},{nv}>"

    def grid(self, problem: Problem, params: Mapping[str, Any]) -> Any:
        return mc.cdiv(problem["rows"], params["block"] // params["tpr"])

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["cols"] > 32 * self.MAX_ELEMS:
            return unsupported(f"rows longer than {32 * self.MAX_ELEMS} do not fit a warp's "
                               "registers: use block_row, block_smem or online")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        vec, tpr = params["vec"], params["tpr"]
        return (self.vec_valid(problem, vec)
                and self.nv(problem, params, vec) * vec <= self.MAX_ELEMS
                and (tpr == 1 or (tpr // 2) * vec < problem["cols"]))


class BlockRowMixin(RowVariant):
    MAX_COLS = 16384

    @staticmethod
    def cap(block: int) -> int:
        return 16 if block == 1024 else 32  # floats per thread (1024 threads: <= 64 registers)

    def nv(self, problem: Problem, params: Mapping[str, Any], vec: int) -> int:
        return mc.cdiv(problem["cols"], params["block"] * vec)

    def instance(self, problem: Problem, params: Mapping[str, Any], vec: int) -> str:
        return f"{self.kernel}<{params['block']},{vec},{self.nv(problem, params, vec)}>"

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["cols"] > self.MAX_COLS:
            return unsupported(f"rows longer than {self.MAX_COLS} do not fit a block's "
                               "registers: use block_smem or online")
        return RowVariant.supports(self, problem, device)

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        vec = params["vec"]
        return (self.vec_valid(problem, vec) and self.busy(problem, params)
                and self.nv(problem, params, vec) * vec <= self.cap(params["block"]))


class BlockSmemMixin(RowVariant):
    def smem(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return -(-problem["cols"] * mc.dtype_size(problem["dtype"]) // 16) * 16

    def supports(self, problem: Problem, device: Any) -> Support:
        need = self.smem(problem, {}) + 1024
        if need > mc.smem_limit(device):
            return unsupported(f"a row needs {need} bytes of shared memory, the device allows "
                               f"{mc.smem_limit(device)}: use online")
        return RowVariant.supports(self, problem, device)


class AsyncSmemMixin(BlockSmemMixin):
    """block_smem whose row is staged by cp.async: every copy of a thread in flight at once."""


class OnlineMixin(BlockSmemMixin):
    def smem(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 0

    def supports(self, problem: Problem, device: Any) -> Support:
        return RowVariant.supports(self, problem, device)


class SplitRowMixin(RowVariant):
    """Few, very long rows: chunks of a row on separate blocks, partials in a workspace.

    Subclasses set ``partial_bytes`` (workspace bytes per row chunk) and ``any_length`` (the
    op's single-pass variant named when there are too many rows)."""

    params: ClassVar[dict[str, tuple[Any, ...]]] = {"block": (256, 512, 1024), "vec": mc.VECS,
                                                    "chunk": SPLIT_CHUNKS}
    partial_bytes: ClassVar[int] = 0
    any_length: ClassVar[str] = ""

    def splits(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return mc.cdiv(problem["cols"], params["chunk"])

    def supports(self, problem: Problem, device: Any) -> Support:
        if problem["rows"] > 65535:
            return unsupported(f"more than 65535 rows (grid y): use {self.any_length} or "
                               "block_smem")
        if problem["cols"] < 8192:
            return unsupported("rows shorter than 8192 gain nothing from splitting")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        return (self.vec_valid(problem, params["vec"]) and 2 <= self.splits(problem, params)
                <= 4096 and params["chunk"] >= params["block"] * params["vec"])

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return self.partial_bytes * problem["rows"] * self.splits(problem, params)

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        """``<kernel>_stats`` writes each chunk's partials, ``<kernel>_apply`` combines them
        and writes the chunk: ``apply(x, partials, <the other arrays>, dims, scalars)``."""
        rows, cols = problem["rows"], problem["cols"]
        block, chunk = params["block"], params["chunk"]
        vec = params["vec"] if self.vec_valid(problem, params["vec"]) else 1
        splits = mc.cdiv(cols, chunk)
        names = [f"{self.kernel}_{k}<{block},{v}>" for k in ("stats", "apply")
                 for v in dict.fromkeys((vec, 1))]
        mod = mc.compile_cuda(self.source, self.defines(problem), names, device)
        part = mc.workspace(device, self.workspace_bytes(problem, params))
        scalars = self.scalars

        def program(v: int) -> Program:
            stats = mc.launch(mod, f"{self.kernel}_stats<{block},{v}>", (splits, rows), block)
            apply = mc.launch(mod, f"{self.kernel}_apply<{block},{v}>", (splits, rows), block)
            dims = stats.consts(np.int32(rows), np.int32(cols), np.int32(chunk))

            def go(arrs: tuple, attrs: Mapping[str, Any]) -> None:
                stats((arrs[0], part, *dims))
                apply((arrs[0], part, *arrs[1:], *dims, *scalars(attrs, apply)))

            return go

        return RowKernel(program(vec), program(1), vec * mc.dtype_size(problem["dtype"]),
                         self.arrays)


# a row strategy: (variant name, mixin, suffix of its kernel template, doc)
Strategy = tuple[str, type[RowVariant], str, str]

# the strategies every row op has (the op adds its any-length and split_row ones)
COMMON: tuple[Strategy, ...] = (
    ("warp_row", WarpRowMixin, "warp",
     "tpr threads per row (shuffles only), the row in registers; cols <= 2048"),
    ("block_row", BlockRowMixin, "block",
     "a block per row, the row in registers; cols <= 16384"),
    ("block_smem", BlockSmemMixin, "smem",
     "a block per row staged in shared memory; cols * itemsize <= opt-in shared memory"),
    ("async_smem", AsyncSmemMixin, "async",
     "a block per row staged in shared memory by cp.async (all copies in flight at once)"),
)


def register_strategies(op: str, base: type[RowVariant], folder: str,
                        own: tuple[Strategy, ...], **attrs: Any) -> None:
    """Register a variant of ``op`` per strategy of :data:`COMMON`, then of ``own``: the
    mixin over ``base`` (the op's defines / arrays / scalars), its kernel template
    ``<folder>_<suffix>`` in kernels/<folder>/<name>.cu; ``attrs``: more class attributes."""
    from dnnctl.ops.registry import register_variant

    title = "".join(p.title() for p in op.split("_"))
    for name, mixin, suffix, doc in (*COMMON, *own):
        register_variant(type(f"{title}{name.title().replace('_', '')}", (mixin, base), {
            "op": op, "name": name, "source": f"{folder}/{name}.cu",
            "kernel": f"{folder}_{suffix}", "doc": doc, "__module__": base.__module__,
            **attrs}))


def default_row_choice(problem: Problem, backend: str, device: Any, op: str,
                       online: str = "online") -> Choice:
    """numpy: cache-sized blocks of rows. cupy: warp per short row, block per medium row,
    split / smem / online for long rows.

    ``online`` names the op's single-pass any-length variant (softmax: online, norms: welford).
    """
    from dnnctl.ops.registry import get_variant

    if backend == "numpy":
        return Choice.of("numpy_rows", {"chunk_rows": 256})

    rows, cols, dtype = problem["rows"], problem["cols"], problem["dtype"]
    vec = max(v for v in mc.VECS if mc.vec_fits(dtype, v) and cols % v == 0)
    sms = mc.sm_count(device)
    cands: list[tuple[str, dict[str, Any]]] = []
    if rows < 2 * sms and cols >= 16384:  # few long rows: split them across blocks
        # the largest chunk that still gives ~4 blocks per SM (few rows hold little data:
        # parallelism, not per-block overhead, decides)
        chunk = next((c for c in SPLIT_CHUNKS[::-1] if rows * mc.cdiv(cols, c) >= 4 * sms),
                     SPLIT_CHUNKS[0])
        cands.append(("split_row", {"block": 512 if chunk >= 512 * vec else 256, "vec": vec,
                                    "chunk": chunk}))
    cands.append(("warp_row", {"block": 128, "vec": vec,
                               "tpr": min(32, next_pow2(mc.cdiv(cols, vec * 4)))}))
    block = min(1024, max(128, next_pow2(mc.cdiv(cols, vec * 4))))
    if cols * mc.dtype_size(dtype) >= 8192:
        # rows of 8 KB+: staged in shared memory beat rows in registers on the H200 (round 1:
        # 8192 fp16 columns, block_smem 72 us vs block_row 82 us); cp.async staging keeps
        # every copy of a block in flight
        cands.append(("async_smem", {"block": block, "vec": vec}))
    cands.append(("block_row", {"block": block, "vec": vec}))
    cands.append(("block_smem", {"block": 512 if cols * mc.dtype_size(dtype) > 8192 else 128,
                                 "vec": vec}))
    cands.append((online, {"block": 1024 if cols >= 8192 else 256, "vec": vec}))
    for name, params in cands:
        v = get_variant(op, "cupy", name)
        if v.supports(problem, device) and v.valid_params(problem, params, device):
            return Choice.of(name, params)
    return Choice.of(online, {"block": 128, "vec": 1})
