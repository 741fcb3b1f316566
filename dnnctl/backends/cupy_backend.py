"""The CUDA backend: CuPy arrays, NVRTC-compiled bundled kernels, CUDA-event timing.

Only this module imports CuPy, and only lazily: ``import dnnctl`` works without it.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dnnctl.backends.base import Backend, DeviceInfo
from dnnctl.errors import BackendUnavailableError, KernelBuildError
from dnnctl.resources import kernels_dir


def _cupy() -> Any:
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising on import
        raise BackendUnavailableError(
            f"CuPy cannot be imported ({type(exc).__name__}: {exc})",
            hint="pip install 'dnnctl[cuda13]' (driver >= 580) or 'dnnctl[cuda12]' (>= 525)",
        ) from None
    return cupy


def _version_text(v: int) -> str:
    """CUDA's 13000-style integer -> '13.0'."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def arch_flag(cc: tuple[int, int]) -> str:
    """NVRTC -arch for the device: arch-specific 'a' targets from Hopper on (wgmma etc.)."""
    major, minor = cc
    suffix = "a" if major >= 9 else ""
    return f"-arch=sm_{major}{minor}{suffix}"


def _driver_version_string() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            ver = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return ver.decode() if isinstance(ver, bytes) else str(ver)
    except Exception:
        try:
            cp = _cupy()
            return "cuda-driver-api " + _version_text(cp.cuda.runtime.driverGetVersion())
        except Exception:
            return ""


class CupyBackend(Backend):
    name = "cupy"

    def __init__(self) -> None:
        self._avail: tuple[bool, str] | None = None
        self._flush: dict[int, Any] = {}

    def availability(self) -> tuple[bool, str]:
        if self._avail is None:
            self._avail = self._probe()
        return self._avail

    @staticmethod
    def _probe() -> tuple[bool, str]:
        try:
            cp = _cupy()
        except BackendUnavailableError as exc:
            return False, exc.message
        try:
            n = cp.cuda.runtime.getDeviceCount()
        except Exception as exc:
            return False, f"CUDA is not usable: {exc} (run 'dnnctl doctor' to see why)"
        if n < 1:
            return False, "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)"
        return True, ""

    @property
    def xp(self) -> Any:
        return _cupy()

    def device_count(self) -> int:
        ok, _ = self.availability()
        return _cupy().cuda.runtime.getDeviceCount() if ok else 0

    def use_device(self, index: int) -> None:
        _cupy().cuda.Device(index).use()

    @functools.cache  # noqa: B019 - one backend object per process
    def device(self, index: int = 0) -> DeviceInfo:
        cp = _cupy()
        props = cp.cuda.runtime.getDeviceProperties(index)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        return DeviceInfo(
            backend="cupy", index=index, name=name,
            compute_capability=f"{props['major']}.{props['minor']}",
            sm_count=int(props["multiProcessorCount"]),
            driver=_driver_version_string(),
            cuda_runtime=_version_text(cp.cuda.runtime.runtimeGetVersion()),
            memory_bytes=int(props["totalGlobalMem"]),
            l2_bytes=int(props.get("l2CacheSize", 0)),
            smem_per_block_optin=int(props.get("sharedMemPerBlockOptin", 0)),
        )

    def asarray(self, host: np.ndarray) -> Any:
        return _cupy().asarray(host)

    def to_numpy(self, arr: Any) -> np.ndarray:
        return _cupy().asnumpy(arr)

    def synchronize(self) -> None:
        _cupy().cuda.get_current_stream().synchronize()

    # ------------------------------------------------------------------ compilation

    def compile_module(self, source: str, *, defines: Mapping[str, Any] | None = None,
                       name_expressions: Sequence[str] = (), options: Sequence[str] = (),
                       device: int | None = None) -> Any:
        """Compile ``kernels/<source>`` with NVRTC for the current device (memoized).

        ``defines`` become ``-DNAME=VALUE``; headers in ``kernels/include`` are found with -I.
        CuPy additionally caches the binary on disk, keyed by source and options.
        """
        cp = _cupy()
        dev = cp.cuda.Device(device) if device is not None else cp.cuda.Device()
        text = dev.compute_capability  # "90", "100", "120"
        cc = (int(text[:-1]), int(text[-1]))
        defs = tuple(sorted((defines or {}).items()))
        return _compile(source, defs, tuple(name_expressions), tuple(options), cc, dev.id)

    def compile_code(self, code: str, *, device: int | None = None) -> Any:
        """Compile generated CUDA source (``code``, which may include the kernels' headers)
        with NVRTC for the current device (memoized by the source; CuPy caches on disk)."""
        cp = _cupy()
        dev = cp.cuda.Device(device) if device is not None else cp.cuda.Device()
        text = dev.compute_capability
        return _compile_code(code, (int(text[:-1]), int(text[-1])), dev.id)

    # ------------------------------------------------------------------ timing

    def _flush_buffer(self) -> Any:
        cp = _cupy()
        dev = cp.cuda.Device().id
        if dev not in self._flush:
            l2 = self.device(dev).l2_bytes or (64 << 20)
            n = max(2 * l2, 128 << 20) // 16 * 16
            self._flush[dev] = cp.zeros(n // 16, dtype=cp.uint32).reshape(-1, 4)
        return self._flush[dev]

    def flush_l2(self) -> None:
        """Evict the L2 by reading twice its size: what the timed call touched leaves it, and
        what it holds afterwards is clean. A flush that writes (a fill) would leave its own
        dirty lines, whose write-back would then take DRAM bandwidth from the timed call
        (tens of MB on Hopper: ~12 us of a 4 TB/s bus)."""
        buf = self._flush_buffer()
        n = buf.shape[0]
        _flush_kernel()((min(4096, -(-n // 256)),), (256,), (buf, np.int64(n)))

    def time(self, fn: Callable[[], None], *, warmup_ms: float = 25.0,
             budget_ms: float = 100.0, min_samples: int = 5, max_samples: int = 2000,
             flush_l2: bool = True, host_ahead: bool = False) -> np.ndarray:
        """Per-call times (us) from CUDA events around each call, the L2 flushed before it.

        By default a sample is what an eager caller waits for: where ``fn``'s host work
        (a vendor library's set-up, Python) outlasts its kernels, the GPU idles between the
        events and the sample includes that host time. With ``host_ahead`` a spin kernel
        longer than the host's work for one call runs before each start event, so the host
        has enqueued the call before the GPU reaches it: the sample is GPU time alone, what
        a CUDA-graph replay of the call costs."""
        cp = _cupy()
        stream = cp.cuda.get_current_stream()
        # time-based warm-up: module load, JIT, caches and clocks settle
        fn()
        stream.synchronize()
        t_end = time.perf_counter() + warmup_ms / 1e3
        calls = 0
        t0 = time.perf_counter()
        while calls < 3 or time.perf_counter() < t_end:
            fn()
            calls += 1
            if calls % 8 == 0:
                stream.synchronize()
        stream.synchronize()
        per_call_ms = max((time.perf_counter() - t0) * 1e3 / calls, 1e-3)
        flush_ms = 0.05 if flush_l2 else 0.0
        spin, ahead_ns = None, np.uint64(0)
        if host_ahead:  # longer than a call's wall time (>= its host time), 20 us to 2 ms
            spin = _spin_kernel()
            ahead_ns = np.uint64(min(2e6, max(2e4, 1.5e6 * per_call_ms)))
        n = int(budget_ms / (per_call_ms + flush_ms + float(ahead_ns) / 1e6))
        n = max(min_samples, min(max_samples, n))
        events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(n)]
        for start, end in events:
            if flush_l2:
                self.flush_l2()
            if spin is not None:
                spin((1,), (1,), (ahead_ns,), stream=stream)
            start.record(stream)
            fn()
            end.record(stream)
        stream.synchronize()
        return np.asarray([cp.cuda.get_elapsed_time(s, e) * 1e3 for s, e in events])


_SPIN = r"""
extern "C" __global__ void dnnctl_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"""


_FLUSH = r"""
extern "C" __global__ void dnnctl_l2_flush(uint4* buf, long long n) {
    // reads only: buf is zeros, so the store below never runs (the compiler cannot know)
    unsigned acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        uint4 v = __ldcg(buf + i);
        acc |= v.x | v.y | v.z | v.w;
    }
    if (acc == 0x5eedf00du) buf[0].x = acc;
}
"""


@functools.cache
def _flush_kernel() -> Any:
    """The read-only L2 eviction pass of ``flush_l2``."""
    return _cupy().RawKernel(_FLUSH, "dnnctl_l2_flush")


@functools.cache
def _spin_kernel() -> Any:
    """A one-thread kernel that busy-waits ``ns`` nanoseconds of the GPU's global timer."""
    return _cupy().RawKernel(_SPIN, "dnnctl_spin")


@functools.cache
def _compile(source: str, defines: tuple[tuple[str, Any], ...], names: tuple[str, ...],
             options: tuple[str, ...], cc: tuple[int, int], device_id: int) -> Any:
    path = kernels_dir() / source
    try:
        code = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KernelBuildError(f"kernel source {path} cannot be read: {exc}") from None
    return _build(code, f"kernels/{source}", defines, names, options, cc)


def _build(code: str, what: str, defines: tuple[tuple[str, Any], ...], names: tuple[str, ...],
           options: tuple[str, ...], cc: tuple[int, int]) -> Any:
    cp = _cupy()
    # CuPy's on-disk cache hashes the source and options but not included headers: put the
    # headers' digest into the options so a header change recompiles.
    opts = (arch_flag(cc), "--std=c++17", f"-I{kernels_dir() / 'include'}",
            f"-DDNNCTL_HEADERS={_headers_digest()}",
            *(f"-D{k}={_define_value(v)}" for k, v in defines), *options)
    try:
        mod = cp.RawModule(code=code, options=opts, name_expressions=names or None)
        mod.compile()
    except Exception as exc:
        raise KernelBuildError(
            f"NVRTC failed to compile {what} with {' '.join(opts)}:\n{exc}") from None
    return mod


@functools.cache
def _compile_code(code: str, cc: tuple[int, int], device_id: int) -> Any:
    return _build(code, "generated code", (), (), (), cc)


def _define_value(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


@functools.cache
def _headers_digest() -> str:
    h = hashlib.sha256()
    inc = kernels_dir() / "include"
    for f in sorted(inc.rglob("*")) if inc.is_dir() else ():
        if f.is_file():
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return "0x" + h.hexdigest()[:12]
