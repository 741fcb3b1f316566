"""Native libraries are only ever loaded in a child process.

Loading ``libnvidia-ml`` / ``libcuda`` can hang (a GPU that fell off the bus, a wedged
driver) or crash (a broken install): that must cost a probe, never doctor itself. The NVML
probe runs one short Python child (no site, only ctypes) that asks NVML everything at once
and prints JSON; :class:`SubprocessNvml` then answers pynvml's calls from that answer, so
probe_driver (and the tests, which inject a fake pynvml) do not know the difference. ``cuDriverGetVersion``
goes through a child the same way.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing host costs ~20 ms; the command line imports this module first
    from dnnctl.doctor.host import Host

NVML_TIMEOUT = 2.0
NVML_NOT_SUPPORTED, NVML_NOT_FOUND = 3, 6
MARK = "DNNCTL_NVML "

# Runs as `python -I -S`: no site, nothing imported but ctypes/json (a fast start). The same
# C calls pynvml makes (nvmlInit_v2, nvmlDeviceGetCount_v2, ...), straight through ctypes.
NVML_QUERY = r"""
import ctypes, json, sys
def emit(d):
    print("DNNCTL_NVML " + json.dumps(d), flush=True)
try:
    L = ctypes.CDLL("libnvidia-ml.so.1")
except OSError as e:
    emit({"init_error": 12, "msg": "NVML Shared Library Not Found (%s)" % e}); sys.exit(0)
L.nvmlErrorString.restype = ctypes.c_char_p
def msg(rc):
    try:
        return L.nvmlErrorString(rc).decode(errors="replace")
    except Exception:
        return "NVML error %d" % rc
init = getattr(L, "nvmlInit_v2", None) or L.nvmlInit
rc = init()
if rc:
    emit({"init_error": rc, "msg": msg(rc)}); sys.exit(0)
out = {"errors": {}}
def call(key, fn, *args):
    rc = fn(*args)
    if rc:
        out["errors"][key] = [rc, msg(rc)]
    return rc == 0
buf = ctypes.create_string_buffer(96)
if call("driver", L.nvmlSystemGetDriverVersion, buf, 96):
    out["driver"] = buf.value.decode(errors="replace")
v = ctypes.c_int(0)
f = getattr(L, "nvmlSystemGetCudaDriverVersion_v2", None) or L.nvmlSystemGetCudaDriverVersion
if call("cuda", f, ctypes.byref(v)):
    out["cuda"] = v.value
n = ctypes.c_uint(0)
count = getattr(L, "nvmlDeviceGetCount_v2", None) or L.nvmlDeviceGetCount
out["count"] = n.value if call("count", count, ctypes.byref(n)) else None
class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]
class Fabric(ctypes.Structure):  # nvmlGpuFabricInfo_t (nvml.h)
    _fields_ = [("uuid", ctypes.c_char * 16), ("status", ctypes.c_int),
                ("clique", ctypes.c_uint), ("state", ctypes.c_ubyte)]
by_index = getattr(L, "nvmlDeviceGetHandleByIndex_v2", None) or L.nvmlDeviceGetHandleByIndex
def ask(name, h):  # an unsigned-int query that older libraries may not have
    f, v = getattr(L, name, None), ctypes.c_uint(0)
    return v.value if f is not None and f(h, ctypes.byref(v)) == 0 else None
def migs(h):  # the MIG devices of a GPU in MIG mode, by slot
    out, n = [], ask("nvmlDeviceGetMaxMigDeviceCount", h)
    by_slot = getattr(L, "nvmlDeviceGetMigDeviceHandleByIndex", None)
    for j in range(n or 0):
        m = ctypes.c_void_p()
        if by_slot is None or by_slot(h, ctypes.c_uint(j), ctypes.byref(m)):
            continue
        d = {"slot": j, "gi": ask("nvmlDeviceGetGpuInstanceId", m),
             "ci": ask("nvmlDeviceGetComputeInstanceId", m)}
        if L.nvmlDeviceGetName(m, buf, 96) == 0:
            d["name"] = buf.value.decode(errors="replace")
        if L.nvmlDeviceGetUUID(m, buf, 96) == 0:
            d["uuid"] = buf.value.decode(errors="replace")
        mem = Mem()
        if L.nvmlDeviceGetMemoryInfo(m, ctypes.byref(mem)) == 0:
            d["memory"] = mem.total
        out.append(d)
    return out
gpus = []
for i in range(out["count"] or 0):
    g = {}
    h = ctypes.c_void_p()
    if call("gpu%d" % i, by_index, ctypes.c_uint(i), ctypes.byref(h)):
        if call("gpu%d.name" % i, L.nvmlDeviceGetName, h, buf, 96):
            g["name"] = buf.value.decode(errors="replace")
        if call("gpu%d.uuid" % i, L.nvmlDeviceGetUUID, h, buf, 96):
            g["uuid"] = buf.value.decode(errors="replace")
        a, b = ctypes.c_int(0), ctypes.c_int(0)
        if call("gpu%d.cc" % i, L.nvmlDeviceGetCudaComputeCapability, h, ctypes.byref(a),
                ctypes.byref(b)):
            g["cc"] = [a.value, b.value]
        m = Mem()
        if call("gpu%d.memory" % i, L.nvmlDeviceGetMemoryInfo, h, ctypes.byref(m)):
            g["memory"] = m.total
        v = ask("nvmlDeviceGetComputeMode", h)  # nvmlComputeMode_t: 0 default ... 3
        if v is not None:
            g["compute_mode"] = v
        v = ask("nvmlDeviceGetDisplayActive", h)  # nvmlEnableState_t: 1 a display is up
        if v is not None:
            g["display_active"] = v
        fab = getattr(L, "nvmlDeviceGetGpuFabricInfo", None)  # Hopper on, R525 on
        fi = Fabric()
        if fab is not None and fab(h, ctypes.byref(fi)) == 0:
            g["fabric"] = [fi.state, fi.status, msg(fi.status) if fi.status else "success"]
        mode = getattr(L, "nvmlDeviceGetMigMode", None)
        cur, pend = ctypes.c_uint(0), ctypes.c_uint(0)
        if mode is not None and mode(h, ctypes.byref(cur), ctypes.byref(pend)) == 0:
            g["mig_mode"] = cur.value
            if cur.value == 1:
                g["migs"] = migs(h)
    gpus.append(g)
out["gpus"] = gpus
L.nvmlShutdown()
emit(out)
"""

LIBCUDA_QUERY = r"""
import ctypes, json, sys
try:
    lib = ctypes.CDLL(sys.argv[1])
    v = ctypes.c_int(0)
    rc = lib.cuDriverGetVersion(ctypes.byref(v))
    out = {"rc": rc, "version": v.value}
    init = getattr(lib, "cuInit", None) if sys.argv[2:] == ["init"] else None
    if init is not None:
        out["init"] = init(0)
        name = ctypes.c_char_p()
        get_name = getattr(lib, "cuGetErrorName", None)
        if out["init"] and get_name is not None and get_name(out["init"], ctypes.byref(name)) == 0:
            out["init_name"] = (name.value or b"").decode(errors="replace")
    print(json.dumps(out))
except Exception as e:
    print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}))
"""


def nvml_argv(python: str | None = None) -> list[str]:
    """The NVML child's command line (the command line prestarts exactly this)."""
    return [python or sys.executable, "-I", "-S", "-c", NVML_QUERY]


class NVMLError(Exception):
    """Raised like pynvml's error: ``value`` is the NVML return code (-1: the probe failed)."""

    def __init__(self, value: int, message: str) -> None:
        super().__init__(message)
        self.value = value

    def __str__(self) -> str:
        return self.args[0]


class SubprocessNvml:
    """The subset of pynvml that probe_driver uses, answered from one child process."""

    NVMLError = NVMLError

    def __init__(self, host: Host, timeout: float = NVML_TIMEOUT) -> None:
        self._host = host
        self._timeout = timeout
        self._data: dict[str, Any] | None = None

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        res = self._host.run(nvml_argv(self._host.python), timeout=self._timeout,
                             label="NVML child (python -I -S)")
        if res is None:
            raise NVMLError(-1, f"probe failed: cannot run {self._host.python}")
        data = None
        for line in res.stdout.splitlines():
            if line.startswith(MARK):
                try:
                    data = json.loads(line[len(MARK):])
                except ValueError:
                    data = None
        if not isinstance(data, dict):
            why = res.error or (f"crashed (exit status {res.returncode})" if res.returncode
                                else "no answer")
            raise NVMLError(-1, f"probe failed: NVML (libnvidia-ml) {why}")
        if "init_error" in data:
            code = data["init_error"]
            raise NVMLError(code if isinstance(code, int) else -1, str(data.get("msg")))
        self._data = data

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._data = None

    def _get(self, key: str, value: Any) -> Any:
        err = ((self._data or {}).get("errors") or {}).get(key)
        if err:
            raise NVMLError(int(err[0]) if isinstance(err[0], int) else -1, str(err[1]))
        return value

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self._get("driver", (self._data or {}).get("driver"))

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:  # noqa: N802
        return self._get("cuda", (self._data or {}).get("cuda"))

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return self._get("count", (self._data or {}).get("count") or 0)

    def _gpu(self, i: int | tuple[int, int]) -> dict[str, Any]:
        """A GPU's answer, or a MIG device's for a (GPU, MIG) handle."""
        if isinstance(i, tuple):
            migs = self._gpu(i[0]).get("migs") or []
            return migs[i[1]] if i[1] < len(migs) and isinstance(migs[i[1]], dict) else {}
        gpus = (self._data or {}).get("gpus") or []
        return gpus[i] if i < len(gpus) and isinstance(gpus[i], dict) else {}

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        return self._get(f"gpu{i}", i)

    def nvmlDeviceGetName(self, h: int) -> str:  # noqa: N802
        return self._get(f"gpu{h}.name", self._gpu(h).get("name"))

    def nvmlDeviceGetUUID(self, h: int) -> str:  # noqa: N802
        return self._get(f"gpu{h}.uuid", self._gpu(h).get("uuid"))

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:  # noqa: N802
        cc = self._get(f"gpu{h}.cc", self._gpu(h).get("cc"))
        if not (isinstance(cc, list) and len(cc) == 2):
            raise NVMLError(-1, "no compute capability in the answer")
        return int(cc[0]), int(cc[1])

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:  # noqa: N802
        from types import SimpleNamespace

        return SimpleNamespace(total=self._get(f"gpu{h}.memory", self._gpu(h).get("memory")))

    def nvmlDeviceGetComputeMode(self, h: int) -> int:  # noqa: N802
        mode = self._gpu(h).get("compute_mode")
        if not isinstance(mode, int):
            raise NVMLError(NVML_NOT_SUPPORTED, "Not Supported")
        return mode

    def nvmlDeviceGetDisplayActive(self, h: int) -> int:  # noqa: N802
        active = self._gpu(h).get("display_active")
        if not isinstance(active, int):
            raise NVMLError(NVML_NOT_SUPPORTED, "Not Supported")
        return active

    def nvmlDeviceGetGpuFabricInfo(self, h: int) -> Any:  # noqa: N802
        """pynvml's answer: ``state`` and ``status`` (nvmlReturn_t), with NVML's text of it."""
        from types import SimpleNamespace

        fab = self._gpu(h).get("fabric")
        if not (isinstance(fab, list) and len(fab) == 3):
            raise NVMLError(NVML_NOT_SUPPORTED, "Not Supported")
        return SimpleNamespace(state=fab[0], status=fab[1], status_text=str(fab[2]))

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:  # noqa: N802
        mode = self._gpu(h).get("mig_mode")
        if not isinstance(mode, int):
            raise NVMLError(NVML_NOT_SUPPORTED, "Not Supported")
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:  # noqa: N802
        slots = [m.get("slot") for m in self._gpu(h).get("migs") or [] if isinstance(m, dict)]
        return max((s for s in slots if isinstance(s, int)), default=-1) + 1

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, slot: int) -> tuple[int, int]:  # noqa: N802
        for k, m in enumerate(self._gpu(h).get("migs") or []):
            if isinstance(m, dict) and m.get("slot") == slot:
                return (h, k)
        raise NVMLError(NVML_NOT_FOUND, "Not Found")

    def _mig_id(self, h: tuple[int, int], key: str) -> int:
        value = self._gpu(h).get(key)
        if not isinstance(value, int):
            raise NVMLError(NVML_NOT_SUPPORTED, "Not Supported")
        return value

    def nvmlDeviceGetGpuInstanceId(self, h: tuple[int, int]) -> int:  # noqa: N802
        return self._mig_id(h, "gi")

    def nvmlDeviceGetComputeInstanceId(self, h: tuple[int, int]) -> int:  # noqa: N802
        return self._mig_id(h, "ci")


def libcuda_version(host: Host, path: str, timeout: float = NVML_TIMEOUT) -> int:
    """cuDriverGetVersion of the libcuda at ``path``, asked in a child; LookupError if not."""
    return int(libcuda_query(host, path, timeout).get("version") or 0)


def libcuda_query(host: Host, path: str, timeout: float | None = None, *,
                  init: bool = False) -> dict[str, Any]:
    """The libcuda child's answer: ``version`` (cuDriverGetVersion) and, with ``init``, the
    CUresult of cuInit(0) as ``init`` (0: success) with its name (``init_name``, from
    cuGetErrorName) when it failed; LookupError when the library cannot be asked. The child
    runs under ``timeout``, else the host's limit for one command."""
    res = host.run([host.python, "-I", "-S", "-c", LIBCUDA_QUERY, str(host.path(path)),
                    *(["init"] if init else [])],
                   timeout=timeout, label="libcuda child (python -I -S)")
    if res is None:
        raise LookupError(f"{path}: cannot run {host.python}")
    try:
        data = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = res.error or f"crashed (exit status {res.returncode})"
        raise LookupError(f"probe failed: {path}: {why}") from None
    if not isinstance(data, dict) or "error" in data:
        raise LookupError(f"{path}: {data.get('error') if isinstance(data, dict) else data}")
    if data.get("rc") != 0:
        raise LookupError(f"{path}: cuDriverGetVersion returned CUDA error {data.get('rc')}")
    return data
