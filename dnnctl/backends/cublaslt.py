"""cuBLASLt through ctypes: one matmul with a fused epilogue (bias, relu, gelu) per call.

Part of the CUDA seam (:mod:`dnnctl.backends.cuda` holds the launches, streams and the plain
cuBLAS handle). A :class:`LtPlan` is built once per problem: the matmul descriptor (fp32
compute and scale, transposes, epilogue), the four matrix layouts (batched by stride) and
the heuristic's algorithm, cached per pointer-alignment class. A call sets the bias pointer
and runs ``cublasLtMatmul`` on the call's stream with the seam's own handle and workspace
(one per device, made once), so nothing is allocated in the call and it can be captured in
a CUDA graph.

The library is found like libcublas: by soname once CuPy's cuBLAS (which links it) is
loaded, else in the NVIDIA wheels (``nvidia/cu13/lib``, ``nvidia/cublas/lib``) that torch
and CuPy install. :func:`available` says whether it loads, without touching a GPU.

Constants are the values of NVIDIA's ``cublasLt.h`` (and ``library_types.h`` /
``cublas_api.h`` for the data, compute and operation types, in :mod:`dnnctl.ops.codes`).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

from dnnctl.backends import cuda
from dnnctl.backends.cublas import load_library
from dnnctl.errors import KernelLaunchError

# cublasLt.h: cublasLtMatmulDescAttributes_t
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
# cublasLt.h: cublasLtMatrixLayoutAttribute_t
LAYOUT_BATCH_COUNT, LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
# cublasLt.h: cublasLtMatmulPreferenceAttributes_t
PREF_MAX_WORKSPACE_BYTES = 1
PREF_MIN_ALIGNMENT = (5, 6, 7, 8)  # A, B, C, D bytes
# cublasLt.h: cublasLtEpilogue_t
EPILOGUE = {"default": 1, "relu": 2, "bias": 4, "relu_bias": 6, "gelu": 32, "gelu_bias": 36}

_WORKSPACE = 32 << 20  # bytes per device (NVIDIA's recommendation for Hopper)
_HEUR_BYTES = 96  # sizeof(cublasLtMatmulHeuristicResult_t): algo (64), size_t, int, float, 4 int
_ALGO_BYTES = 64  # sizeof(cublasLtMatmulAlgo_t)


def epilogue_code(bias: bool, activation: str) -> int | None:
    """The cublasLtEpilogue_t of bias + activation, None where cuBLASLt has none (silu).

    cuBLASLt's GELU is the tanh form (torch's ``_addmm_activation`` documents the same);
    it differs from the erf form by at most 4.8e-4 in absolute value."""
    name = {"none": "bias" if bias else "default", "relu": "relu_bias" if bias else "relu",
            "gelu": "gelu_bias" if bias else "gelu"}.get(activation)
    return None if name is None else EPILOGUE[name]


@functools.cache
def _library() -> Any:
    """The loaded libcublasLt (:func:`dnnctl.backends.cublas.load_library`), or None."""
    return load_library("libcublasLt")


def available() -> bool:
    """True when libcublasLt loads in this process (no GPU work)."""
    return _library() is not None


class _Lt:
    """The library's entry points, typed once, and one handle + workspace per device."""

    def __init__(self, lib: Any) -> None:
        vp, i32, sz, u64, i64 = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                                 ctypes.c_uint64, ctypes.c_int64)
        self.lib = lib
        sig = {
            "cublasLtCreate": [vp],
            "cublasLtMatmulDescCreate": [vp, i32, i32],
            "cublasLtMatmulDescSetAttribute": [vp, i32, vp, sz],
            "cublasLtMatrixLayoutCreate": [vp, i32, u64, u64, i64],
            "cublasLtMatrixLayoutSetAttribute": [vp, i32, vp, sz],
            "cublasLtMatmulPreferenceCreate": [vp],
            "cublasLtMatmulPreferenceSetAttribute": [vp, i32, vp, sz],
            "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i32, vp, vp],
            "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz, vp],
        }
        for name, args in sig.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = i32, args
            setattr(self, name[len("cublasLt"):], fn)
        self.matmul_addr = ctypes.cast(self.Matmul, ctypes.c_void_p).value
        self.handles: dict[int, tuple[int, int, Any]] = {}
        self.lock = threading.Lock()

    def handle(self, device: int) -> tuple[int, int]:
        """(handle, workspace address) of ``device``, made on first use."""
        got = self.handles.get(device)
        if got is None:
            with self.lock:
                got = self.handles.get(device)
                if got is None:
                    h = ctypes.c_void_p()
                    _check(self.Create(ctypes.byref(h)), "cublasLtCreate")
                    ws = cuda.kept(_WORKSPACE, device)
                    got = self.handles[device] = (int(h.value or 0), int(ws.data.ptr), ws)
        return got[0], got[1]


def _check(rc: int, what: str) -> None:
    if rc:
        raise KernelLaunchError(f"{what} failed (cublasStatus {rc})",
                                hint="run 'dnnctl doctor' to check the CUDA libraries")


@functools.cache
def _lt() -> _Lt:
    lib = _library()
    if lib is None:
        raise KernelLaunchError("libcublasLt cannot be loaded",
                                hint="install the CUDA runtime wheels CuPy / torch need")
    return _Lt(lib)


def _set(fn: Any, obj: int, attr: int, value: Any) -> None:
    _check(fn(obj, attr, ctypes.byref(value), ctypes.sizeof(value)), "cuBLASLt set attribute")


def _alignment(address: int) -> int:
    """The largest power of two up to 256 dividing ``address`` (256 for null)."""
    return 256 if address == 0 else min(256, address & -address)


class LtPlan:
    """One row-major y = epilogue(a @ b + bias) as a column-major cuBLASLt matmul
    (y^T = b^T a^T: cuBLASLt's A is our b). Descriptors live as long as the plan."""

    def __init__(self, *, m: int, n: int, k: int, batch: int, trans_a: bool, trans_b: bool,
                 data_type: int, compute: int, epilogue: int) -> None:
        lt = _lt()
        self.lt = lt
        vp = ctypes.c_void_p
        self.desc = vp()
        _check(lt.MatmulDescCreate(ctypes.byref(self.desc), compute, 0), "MatmulDescCreate")
        d = self.desc.value
        _set(lt.MatmulDescSetAttribute, d, DESC_TRANSA, ctypes.c_int32(int(trans_b)))
        _set(lt.MatmulDescSetAttribute, d, DESC_TRANSB, ctypes.c_int32(int(trans_a)))
        _set(lt.MatmulDescSetAttribute, d, DESC_EPILOGUE, ctypes.c_uint32(epilogue))
        self.has_bias = epilogue in (EPILOGUE["bias"], EPILOGUE["relu_bias"],
                                     EPILOGUE["gelu_bias"])
        # stored (rows, cols, ld) in column-major terms, and the batch stride
        shapes = [(k, n, k, n * k) if trans_b else (n, k, n, n * k),   # A = b
                  (m, k, m, m * k) if trans_a else (k, m, k, m * k),   # B = a
                  (n, m, n, m * n), (n, m, n, m * n)]                  # C, D = y
        self.layouts = []
        for rows, cols, ld, stride in shapes:
            lay = vp()
            _check(lt.MatrixLayoutCreate(ctypes.byref(lay), data_type, rows, cols, ld),
                   "MatrixLayoutCreate")
            if batch > 1:
                _set(lt.MatrixLayoutSetAttribute, lay.value, LAYOUT_BATCH_COUNT,
                     ctypes.c_int32(batch))
                _set(lt.MatrixLayoutSetAttribute, lay.value, LAYOUT_STRIDED_BATCH_OFFSET,
                     ctypes.c_int64(stride))
            self.layouts.append(lay)
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        # the addresses a native call passes as plain integers (see __call__)
        self.ints = (d, ctypes.addressof(self.alpha), ctypes.addressof(self.beta),
                     *(x.value for x in self.layouts))
        self.algos: dict[tuple[int, ...], Any] = {}
        self.bias_arg = ctypes.c_void_p(0)
        self.lock = threading.Lock()  # the bias pointer lives in the shared descriptor
        self.what = f"cublasLtMatmul m={m} n={n} k={k} batch={batch} epilogue={epilogue}"

    def algo(self, handle: int, aligns: tuple[int, ...]) -> Any:
        """The heuristic's best algorithm for these pointer alignments (cached)."""
        got = self.algos.get(aligns)
        if got is not None:
            return got
        lt = self.lt
        pref = ctypes.c_void_p()
        _check(lt.MatmulPreferenceCreate(ctypes.byref(pref)), "MatmulPreferenceCreate")
        _set(lt.MatmulPreferenceSetAttribute, pref.value, PREF_MAX_WORKSPACE_BYTES,
             ctypes.c_uint64(_WORKSPACE))
        for attr, align in zip(PREF_MIN_ALIGNMENT, aligns):
            _set(lt.MatmulPreferenceSetAttribute, pref.value, attr, ctypes.c_uint32(align))
        result = (ctypes.c_char * _HEUR_BYTES)()
        count = ctypes.c_int(0)
        lay = [x.value for x in self.layouts]
        rc = lt.MatmulAlgoGetHeuristic(handle, self.desc.value, *lay, pref.value, 1,
                                       ctypes.byref(result), ctypes.byref(count))
        lt.lib.cublasLtMatmulPreferenceDestroy(pref)
        if rc or count.value < 1:
            raise KernelLaunchError(f"cublasLtMatmulAlgoGetHeuristic found no algorithm "
                                    f"(status {rc}) for {self.what}",
                                    hint="use the 'cublas' matmul variant for this problem")
        algo = (ctypes.c_char * _ALGO_BYTES).from_buffer_copy(bytes(result)[:_ALGO_BYTES])
        if len(self.algos) < 16:
            self.algos[aligns] = algo
        return algo

    def prepare(self, device: int) -> None:
        """Handle, workspace and the algorithm for 256-byte aligned operands, ahead of the
        first call (so that a captured call only queries for unusual alignments)."""
        handle, _ = self.lt.handle(device)
        self.algo(handle, (256, 256, 256, 256))

    def __call__(self, device: int, stream: int, a: int, b: int, y: int, bias: int) -> None:
        lt = self.lt
        handle, ws = lt.handle(device)
        aligns = (_alignment(b), _alignment(a), _alignment(y), _alignment(y))
        algo = self.algo(handle, aligns)
        lay = self.layouts
        nat = cuda.native()
        with self.lock:
            if self.has_bias and bias != self.bias_arg.value:
                self.bias_arg.value = bias
                _set(lt.MatmulDescSetAttribute, self.desc.value, DESC_BIAS_POINTER,
                     self.bias_arg)
            if nat is not None and cuda.INT_ABI:
                # one C call of integers: ctypes converting 16 arguments cost ~8 us of host
                # time a call (an H100 host), a third of the call
                d, alpha, beta, l0, l1, l2, l3 = self.ints
                rc = nat.call_ints(lt.matmul_addr, handle, d, alpha, b, l0, a, l1, beta, y,
                                   l2, y, l3, ctypes.addressof(algo), ws, _WORKSPACE,
                                   stream or 0)
            else:
                rc = lt.Matmul(handle, self.desc.value, ctypes.byref(self.alpha), b,
                               lay[0].value, a, lay[1].value, ctypes.byref(self.beta), y,
                               lay[2].value, y, lay[3].value, ctypes.byref(algo), ws,
                               _WORKSPACE, stream or None)
        _check(rc, self.what)
