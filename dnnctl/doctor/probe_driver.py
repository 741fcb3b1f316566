"""Driver and GPU detection: NVML, else ``libcuda.so.1`` via ctypes, else ``/proc``.

The result follows the convention agreed with the rules: ``driver.present`` is always set in a
detected snapshot (``False`` = looked, found no usable driver); an empty GPU list with a
present driver means the driver sees no GPU. Problems land in ``driver["error"]`` and in the
returned notes, never as exceptions.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import Any

from dnnctl.doctor import parse
from dnnctl.doctor.background import Task
from dnnctl.doctor.host import Host
from dnnctl.doctor.model import COMPUTE_MODES, FABRIC_STATES, Gpu, compute_mode
from dnnctl.doctor.native import SubprocessNvml, libcuda_query, libcuda_version

NVML_MISMATCH = 18  # NVML_ERROR_LIB_RM_VERSION_MISMATCH ("Driver/library version mismatch")
NVML_NO_PERMISSION = 4
NVML_DRIVER_NOT_LOADED = 9
NVML_LIBRARY_NOT_FOUND = 12


@dataclass
class DriverProbe:
    driver: dict[str, Any] = field(default_factory=dict)
    gpus: list[Gpu] = field(default_factory=list)
    gpus_known: bool = False
    notes: list[str] = field(default_factory=list)


def kernel_module(host: Host) -> tuple[str | None, str | None]:
    """(version of the loaded nvidia kernel module, why not) from /proc, else /sys."""
    text, err = host.read_text("/proc/driver/nvidia/version")
    version = parse.proc_driver_version(text)
    if version:
        return version, None
    text2, err2 = host.read_text("/sys/module/nvidia/version")
    version = parse.sys_module_version(text2)
    if version:
        return version, None
    if text is not None or text2 is not None:
        return None, "unrecognised kernel module version text"
    if "permission denied" in (err, err2):
        return None, "permission denied reading /proc/driver/nvidia/version"
    return None, None  # module not loaded


def library_candidates(host: Host, soname: str, ldconfig: dict[str, list[str]]) -> list[str]:
    """Where the dynamic loader looks for ``soname``: LD_LIBRARY_PATH, then the ld cache."""
    out = [os.path.join(d, soname) for d in host.env_paths("LD_LIBRARY_PATH")
           if host.exists(os.path.join(d, soname))]
    out += [p for p in ldconfig.get(soname, []) if p not in out]
    return out


def library_version(host: Host, path: str, stem: str) -> str | None:
    """The driver version a user-space library carries in its real file name."""
    return parse.soname_version(os.path.basename(host.realpath(path)), stem)


def _nvml_text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def probe_nvml(host: Host, out: DriverProbe) -> tuple[int, str] | None:
    """Fill driver + GPUs from NVML. None on success, else (NVML error code or -1, message)."""
    try:
        nvml = host.nvml() if host.nvml is not None else SubprocessNvml(host)
    except Exception as exc:  # ImportError, or a broken nvidia-ml-py
        return -1, f"cannot import pynvml (nvidia-ml-py): {exc}"
    error_cls = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error_cls as exc:
        code = getattr(exc, "value", -1)
        if _nvml_text(exc).startswith("probe failed:"):
            out.notes.append(_nvml_text(exc))
        return (code if isinstance(code, int) else -1), _nvml_text(exc)
    except Exception as exc:
        return -1, f"{type(exc).__name__}: {exc}"
    try:
        out.driver["version"] = _nvml_text(nvml.nvmlSystemGetDriverVersion())
        out.driver["source"] = "nvml"
        try:
            fn = getattr(nvml, "nvmlSystemGetCudaDriverVersion_v2", None) or \
                nvml.nvmlSystemGetCudaDriverVersion
            cuda = parse.cuda_int_version(fn())
            if cuda:
                out.driver["cuda"] = cuda
        except error_cls as exc:
            out.notes.append(f"NVML: CUDA driver version unavailable: {_nvml_text(exc)}")
        count = nvml.nvmlDeviceGetCount()
        out.gpus_known = True
        for i in range(int(count)):
            gpu, handle = _nvml_gpu(nvml, error_cls, i, out.notes)
            out.gpus.append(gpu)
            if handle is not None:
                out.gpus += _nvml_migs(nvml, error_cls, handle, gpu, out.notes)
    except error_cls as exc:
        out.driver["error"] = f"NVML: {_nvml_text(exc)}"
        out.notes.append(f"NVML query failed: {_nvml_text(exc)}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # shutting down cannot change what we learnt
            pass
    return None


def _nvml_gpu(nvml: Any, error_cls: type, index: int, notes: list[str]) -> tuple[Gpu, Any]:
    """One physical GPU and its NVML handle (None when it cannot be reached)."""
    gpu = Gpu(index=index)
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except error_cls as exc:  # e.g. a GPU that fell off the bus
        notes.append(f"NVML: GPU {index}: {_nvml_text(exc)}")
        return gpu, None
    for attr, call in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
        try:
            setattr(gpu, attr, _nvml_text(getattr(nvml, call)(handle)))
        except error_cls as exc:
            notes.append(f"NVML: GPU {index} {attr}: {_nvml_text(exc)}")
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        gpu.compute_capability = f"{int(major)}.{int(minor)}"
    except error_cls as exc:
        notes.append(f"NVML: GPU {index} compute capability: {_nvml_text(exc)}")
    try:
        gpu.memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20)
    except error_cls as exc:
        notes.append(f"NVML: GPU {index} memory: {_nvml_text(exc)}")
    gpu.fabric = _fabric(nvml, error_cls, handle)
    gpu.compute_mode = _compute_mode(nvml, error_cls, handle)
    gpu.display_active = _display_active(nvml, error_cls, handle)
    return gpu, handle


def _display_active(nvml: Any, error_cls: type, handle: Any) -> bool | None:
    """nvmlDeviceGetDisplayActive: whether a display is initialized on the GPU (None: not
    answered, e.g. NVML_ERROR_NOT_SUPPORTED)."""
    get = getattr(nvml, "nvmlDeviceGetDisplayActive", None)
    if get is None:
        return None
    try:
        return bool(int(get(handle)))
    except (error_cls, TypeError, ValueError):
        return None


def _compute_mode(nvml: Any, error_cls: type, handle: Any) -> str | None:
    """nvmlDeviceGetComputeMode as one of COMPUTE_MODES (None: not answered)."""
    get = getattr(nvml, "nvmlDeviceGetComputeMode", None)
    if get is None:
        return None
    try:
        mode = int(get(handle))
    except (error_cls, TypeError, ValueError):
        return None
    return COMPUTE_MODES[mode] if 0 <= mode < len(COMPUTE_MODES) else None


def _fabric(nvml: Any, error_cls: type, handle: Any) -> dict[str, Any] | None:
    """The GPU's NVLink fabric registration (nvmlDeviceGetGpuFabricInfo: Hopper and later;
    NVML_ERROR_NOT_SUPPORTED elsewhere, and older libraries lack the call)."""
    get = getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None)
    if get is None:
        return None
    try:
        info = get(handle)
        state = FABRIC_STATES[int(info.state)]
    except (error_cls, AttributeError, IndexError, TypeError, ValueError):
        return None
    status = int(getattr(info, "status", 0) or 0)
    text = getattr(info, "status_text", None) or f"NVML error {status}"
    return {"state": state, "status": "success" if status == 0 else text}


def _nvml_migs(nvml: Any, error_cls: type, handle: Any, parent: Gpu,
               notes: list[str]) -> list[Gpu]:
    """The MIG devices of a GPU in MIG mode (what CUDA enumerates instead of the GPU)."""
    get_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
    try:
        if get_mode is None or int(get_mode(handle)[0]) != 1:
            return []
    except error_cls:  # NVML_ERROR_NOT_SUPPORTED: a GPU without MIG
        return []
    parent.mig = {"mode": True}
    out: list[Gpu] = []
    try:
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except (error_cls, AttributeError) as exc:
        notes.append(f"NVML: GPU {parent.index} MIG devices: {_nvml_text(exc)}")
        return out
    for slot in range(slots):
        try:
            mig_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except error_cls:  # an empty slot
            continue
        dev = Gpu(compute_capability=parent.compute_capability,
                  mig={"parent": parent.uuid or str(parent.index)})
        for attr, call in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
            try:
                setattr(dev, attr, _nvml_text(getattr(nvml, call)(mig_handle)))
            except error_cls as exc:
                notes.append(f"NVML: GPU {parent.index} MIG device {slot} {attr}: "
                             f"{_nvml_text(exc)}")
        for key, call in (("gpu_instance", "nvmlDeviceGetGpuInstanceId"),
                          ("compute_instance", "nvmlDeviceGetComputeInstanceId")):
            try:
                dev.mig[key] = int(getattr(nvml, call)(mig_handle))
            except (error_cls, AttributeError):
                pass  # older bindings: the profile in the name still tells the slice
        try:
            dev.memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(mig_handle).total) // (1 << 20)
        except error_cls:
            pass
        profile = parse.mig_profile(dev.name)
        if profile:
            dev.mig["profile"] = profile
        out.append(dev)
    return out


def probe_libcuda(host: Host, path: str) -> str | None:
    """cuDriverGetVersion (needs no cuInit, hence no GPU access), asked in a child process
    unless a test injected ``host.load_library``."""
    if host.load_library is None:
        return parse.cuda_int_version(libcuda_version(host, path))
    return parse.cuda_int_version(_ask_in_process(host, path, init=False)["version"])


def ask_libcuda(host: Host, path: str) -> dict[str, Any]:
    """cuDriverGetVersion and cuInit(0) of the libcuda at ``path`` (in a child, which a hung
    GPU costs a timeout): ``version``, and ``init``, the CUresult (0: success), with its name
    ``init_name`` when it failed. LookupError when the library cannot be asked."""
    if host.load_library is None:
        return libcuda_query(host, path, init=True)
    return _ask_in_process(host, path, init=True)


def _ask_in_process(host: Host, path: str, *, init: bool) -> dict[str, Any]:
    """What the libcuda child asks, through a library a test injected."""
    try:
        lib = host.load_library(str(host.path(path)))  # type: ignore[misc]
        version = ctypes.c_int(0)
        rc = lib.cuDriverGetVersion(ctypes.byref(version))
        out: dict[str, Any] = {"version": version.value}
        cu_init = getattr(lib, "cuInit", None) if init else None
        if cu_init is not None:
            out["init"] = int(cu_init(0))
    except (OSError, AttributeError, TypeError) as exc:
        raise LookupError(f"{path}: {exc}") from None
    if rc != 0:
        raise LookupError(f"{path}: cuDriverGetVersion returned CUDA error {rc}")
    return out


def cuinit_record(answer: dict[str, Any]) -> dict[str, Any] | None:
    """driver.cuinit from the libcuda child's answer: {code, name} (code 0: cuInit worked)."""
    code = answer.get("init")
    if not isinstance(code, int):
        return None
    name = answer.get("init_name") or ("CUDA_SUCCESS" if code == 0 else None)
    return {"code": code, **({"name": name} if name else {})}


def probe_smi_gpus(host: Host, out: DriverProbe) -> None:
    """GPUs from nvidia-smi (used when the Python NVML binding itself is the problem)."""
    smi = host.which("nvidia-smi")
    if not smi:
        return
    res = host.run([smi, "--query-gpu=index,name,compute_cap,memory.total,driver_version,uuid,"
                    "compute_mode,display_active", "--format=csv,noheader"])
    if res is None or not res.ok:
        return
    rows = parse.nvidia_smi_query(res.stdout)
    if not rows:
        return
    out.gpus_known = True
    for row in rows:
        out.gpus.append(Gpu(index=row["index"], name=row["name"],
                            compute_capability=row["compute_capability"],
                            memory_mib=row["memory_mib"], uuid=row["uuid"],
                            compute_mode=compute_mode(row.get("compute_mode") or ""),
                            display_active=row.get("display_active")))
    listed = host.run([smi, "-L"])  # MIG devices appear only in this listing
    out.gpus = _with_smi_migs(out.gpus, parse.nvidia_smi_list(listed.stdout if listed and
                                                                listed.ok else None))
    if rows[0]["driver"] and "version" not in out.driver:
        out.driver["version"] = rows[0]["driver"]
        out.driver["source"] = "nvidia-smi"


def _with_smi_migs(gpus: list[Gpu], listing: list[dict[str, Any]]) -> list[Gpu]:
    """Each GPU followed by the MIG devices ``nvidia-smi -L`` lists under it."""
    migs = {g["index"]: g["migs"] for g in listing if g["migs"]}
    out: list[Gpu] = []
    for gpu in gpus:
        out.append(gpu)
        if gpu.index not in migs:
            continue
        gpu.mig = {"mode": True}
        out += [Gpu(name=f"{gpu.name} MIG {m['profile']}" if gpu.name else None, uuid=m["uuid"],
                    compute_capability=gpu.compute_capability,
                    mig={"profile": m["profile"], "parent": gpu.uuid or str(gpu.index)})
                for m in migs[gpu.index]]
    return out


def probe_proc_gpus(host: Host, out: DriverProbe) -> None:
    """GPU names from /proc/driver/nvidia/gpus/*/information (no compute capability there)."""
    for info in host.glob("/proc/driver/nvidia/gpus/*/information"):
        text, _ = host.read_text(info)
        data = parse.proc_gpu_information(text)
        if data.get("name"):
            out.gpus_known = True
            out.gpus.append(Gpu(index=data.get("minor"), name=data["name"]))


def probe_driver(host: Host, ldconfig: dict[str, list[str]]) -> DriverProbe:
    """Everything about the driver and the GPUs it exposes."""
    out = DriverProbe(driver={"present": None})  # decided below; first key in the file
    drv = out.driver
    kmod, kmod_err = kernel_module(host)
    if kmod:
        drv["kernel_module"] = kmod
    if kmod_err:
        out.notes.append(f"kernel module: {kmod_err}")
    nodes = host.glob("/dev/nvidia[0-9]*")
    drv["device_nodes"] = len(nodes)

    libcuda = library_candidates(host, "libcuda.so.1", ldconfig)
    libnvml = library_candidates(host, "libnvidia-ml.so.1", ldconfig)
    compat = bool(libcuda) and "/compat" in libcuda[0]  # cuda-compat's libcuda loads first
    if libcuda:
        drv["libcuda"] = libcuda[0]
        lib_version = library_version(host, libcuda[0], "libcuda")
        if lib_version and not compat:
            drv["library"] = lib_version
    if compat:
        try:
            fc = probe_libcuda(host, libcuda[0])
        except LookupError as exc:
            fc = None
            out.notes.append(f"forward compatibility library: {exc}")
        if fc:
            drv["forward_compat"] = fc
    if "library" not in drv and libnvml:
        lib_version = library_version(host, libnvml[0], "libnvidia-ml")
        if lib_version:
            drv["library"] = lib_version
    # cuInit beside NVML: NVML can list GPUs that CUDA cannot initialize (999 after a resume)
    ask = Task(_asked, host, libcuda[0]) if libcuda and not compat else None

    failed = probe_nvml(host, out)
    if failed is None:
        drv["present"] = True
        answer, _ = ask.result() if ask is not None else ({}, None)
        if out.gpus and cuinit_record(answer):
            drv["cuinit"] = cuinit_record(answer)
    elif failed[0] == NVML_MISMATCH:
        drv.update(present=True, mismatch=True, error=f"NVML: {failed[1]}")
        if kmod:
            drv.update(version=kmod, source="proc")
    else:
        _fallbacks(host, out, failed, libcuda, kmod,
                   ask.result() if ask is not None else ({}, None))

    if kmod and drv.get("library") and drv["library"] != kmod:
        drv["mismatch"] = True
    if drv.get("mismatch"):
        out.notes.append(
            f"driver: kernel module {kmod or '?'} but user-space library "
            f"{drv.get('library') or '?'} (\"Driver/library version mismatch\"; reboot or "
            "reload the nvidia module after a driver upgrade)")
    if drv.get("present") and not out.gpus_known:
        probe_smi_gpus(host, out)
        if not out.gpus_known:
            probe_proc_gpus(host, out)
        if not out.gpus_known:
            out.notes.append("GPUs: the driver is present but the GPUs could not be listed")
    return out


def _asked(host: Host, path: str) -> tuple[dict[str, Any], str | None]:
    """ask_libcuda's answer, or ({}, why not): never raises (it runs on its own thread)."""
    try:
        return ask_libcuda(host, path), None
    except LookupError as exc:
        return {}, str(exc)


def _fallbacks(host: Host, out: DriverProbe, failed: tuple[int, str], libcuda: list[str],
               kmod: str | None, asked: tuple[dict[str, Any], str | None]) -> None:
    """NVML failed: ask libcuda, then the kernel module, and explain what is missing.

    A present driver that NVML could not read is a probe problem (``driver.error``); NVML
    failing because there is no driver at all is the ordinary no-driver case (``reason``).
    """
    drv = out.driver
    nvml_error, nvml_msg = failed
    answer, why = asked
    cuda = parse.cuda_int_version(answer.get("version")) if answer else None
    if why:
        out.notes.append(f"probe failed: libcuda: {why.removeprefix('probe failed: ')}"
                         if "probe failed" in why else f"libcuda: {why}")
    if cuda:
        drv["cuda"] = cuda
    if cuinit_record(answer):
        drv["cuinit"] = cuinit_record(answer)
    if kmod and "version" not in drv:
        drv["version"] = kmod
        drv["source"] = "proc"
    elif cuda and drv.get("library") and "version" not in drv:
        drv["version"] = drv["library"]
        drv["source"] = "libcuda"
    if nvml_error == NVML_NO_PERMISSION:
        drv["present"] = bool(kmod or cuda)
        drv["error"] = f"NVML: {nvml_msg} (may this user open /dev/nvidia*?)"
        out.notes.append(drv["error"])
        return
    # Usable only when the kernel side is there *and* this process can reach it.
    drv["present"] = bool(kmod and (cuda or libcuda) and drv["device_nodes"])
    if drv["present"]:
        drv["error"] = f"NVML: {nvml_msg}"
        out.notes.append(f"NVML unusable ({nvml_msg}); driver read from libcuda and the "
                         "kernel module")
    elif kmod and not drv["device_nodes"]:
        drv["reason"] = (
            f"the nvidia kernel module {kmod} is loaded on the host but this environment has "
            "no /dev/nvidia* device nodes"
            + ("" if libcuda else " and no user-space driver (libcuda.so.1)")
            + ": a container started without --gpus / the NVIDIA Container Toolkit?")
    elif kmod:
        drv["reason"] = (f"the nvidia kernel module {kmod} is loaded but the user-space driver "
                         "library libcuda.so.1 is missing")
    elif libcuda:
        drv["reason"] = (f"{libcuda[0]} is installed but the nvidia kernel module is not "
                         "loaded")
    else:
        drv["reason"] = "no nvidia kernel module is loaded and no libcuda.so.1 was found"
    if not drv["present"] and nvml_error not in (NVML_LIBRARY_NOT_FOUND,
                                                 NVML_DRIVER_NOT_LOADED, -1):
        drv["error"] = f"NVML: {nvml_msg}"
