"""``detect()``: probe this machine into an :class:`EnvSnapshot`, fast and without raising.

Plain detection imports no framework: it reads metadata, files (compiled extensions' ELF
headers too) and NVML, and starts two
short subprocesses (``ldconfig -p`` and the cuDNN version helper) that run while the
in-process probes work. ``deep=True`` then asks each framework itself (dnnctl.doctor.deep).
"""

from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Callable
from typing import Any, TypeVar

from dnnctl.doctor import parse, spawn, timing
from dnnctl.doctor.background import Task
from dnnctl.doctor.deep import ask_all, deep_names, merge_deep, resolve_deep_timeout
from dnnctl.doctor.host import Host, Runner, run_command
from dnnctl.doctor.model import ENVIRONMENT_FIELDS, Component, EnvSnapshot
from dnnctl.doctor.native import nvml_argv
from dnnctl.doctor.probe_cuda import pip_cuda_runtimes, probe_cudnn, system_cuda_runtimes
from dnnctl.doctor.probe_driver import probe_driver
from dnnctl.doctor.probe_extensions import probe_extensions
from dnnctl.doctor.probe_fabric import probe_fabric
from dnnctl.doctor.probe_libs import probe_libraries
from dnnctl.doctor.probe_pci import probe_pci
from dnnctl.doctor.probe_python import probe_python, requires_of
from dnnctl.doctor.probe_system import probe_system
from dnnctl.doctor.probe_toolchain import probe_toolchain

T = TypeVar("T")
BUDGET = 3.0  # seconds for every plain probe together (doctor's promise: done within 5 s)


def detect(runner: Runner | None = None, deep: bool = False, timeout: float | None = None,
           *, host: Host | None = None, deep_timeout: float | None = None,
           budget: float = BUDGET) -> EnvSnapshot:
    """Detect driver, GPUs, CUDA runtimes, cuDNN copies, frameworks and packages.

    ``runner`` replaces the command runner (argv lists, never a shell); ``host`` replaces
    everything else the probes touch (see dnnctl.doctor.host.Host). ``timeout`` bounds each
    quick subprocess, ``deep_timeout`` each framework asked with ``deep=True`` (default
    ``$DNNCTL_DEEP_TIMEOUT`` or dnnctl.doctor.deep.DEEP_TIMEOUT; the children start as soon
    as the installed frameworks are known and run alongside the plain probes), and
    ``budget`` all plain probes together: a probe still running then is cut off and noted
    ("probe failed: ..."). Problems become ``notes`` (and ``driver["error"]``), never
    exceptions. Native libraries are loaded in child processes only (dnnctl.doctor.native).
    """
    host = host or Host()
    if runner is not None:
        host = dataclasses.replace(host, runner=runner)
    if timeout is not None:
        host = dataclasses.replace(host, timeout=timeout)

    if host.deadline is None:
        host = dataclasses.replace(host, deadline=time.monotonic() + budget)

    limit = resolve_deep_timeout(deep_timeout) if deep else 0.0
    if host.runner is run_command and host.nvml is None and str(host.root) == "/":
        spawn.prestart(nvml_argv(host.python))  # the slowest probe on a GPU host: start it now
    ld_task = Task(_timed, "probe: ldconfig cache", ldconfig_cache, host)
    tool_task = Task(_timed, "probe: compilers and Python.h", probe_toolchain, host)
    ext_task = Task(_timed, "probe: compiled torch extensions", probe_extensions, host)
    env = EnvSnapshot(os=_timed("probe: os", os_name, host), python=platform.python_version())
    frameworks, packages, dists, py_notes = _timed(
        "probe: Python packages (dist-info)", probe_python, host)
    deep_task = Task(ask_all, host, deep_names(frameworks), limit) if deep else None
    ldconfig, ld_note = ld_task.result()
    cudnn_task = Task(_timed, "probe: cuDNN copies", probe_cudnn, host, dists, ldconfig)
    drv_task = Task(_timed, "probe: driver and GPUs", probe_driver, host, ldconfig)
    fabric_task = Task(_timed, "probe: fabric manager and NVSwitches", probe_fabric, host)
    libs_task = Task(_timed, "probe: cuBLAS/NCCL/... copies", probe_libraries, host, dists,
                     ldconfig)
    system = _timed("probe: system CUDA toolkits", system_cuda_runtimes, host, ldconfig)
    runtimes = _timed("probe: pip CUDA runtimes", pip_cuda_runtimes, dists) + system
    drv = drv_task.result()
    cudnn, cudnn_notes = cudnn_task.result()
    libraries = libs_task.result()
    env.extensions, ext_notes = ext_task.result()

    env.driver = drv.driver
    env.gpus = drv.gpus
    fabric, fabric_notes = fabric_task.result()
    if env.driver.get("present"):
        env.driver.update(fabric)
    if drv.gpus_known:  # physical GPUs: a MIG device is listed beside its GPU
        env.driver["gpu_count"] = sum(not (g.mig or {}).get("profile") for g in drv.gpus)
    env.driver.update(_timed("probe: PCI bus GPUs and kernel module flavor", probe_pci, host))
    env.toolchain = tool_task.result()
    env.system = _timed("probe: container and /dev/shm", probe_system, host)
    env.environment = {k: host.environ[k] for k in ENVIRONMENT_FIELDS
                       if host.environ.get(k) is not None}
    env.frameworks = frameworks
    env.packages = packages
    env.requires = _timed("probe: declared requirements", requires_of, dists)
    cupy = frameworks.get("cupy")
    if cupy and cupy.get("cuda"):  # CuPy carries its own (static) CUDA runtime
        runtimes.append(Component(version=cupy["cuda"], source=f"pip:{cupy['package']}"))
    env.cuda_runtimes = runtimes
    env.cudnn = cudnn
    env.libraries = libraries
    torch = frameworks.get("torch")
    if torch and "cudnn" not in torch:  # no pinned wheel: a copy inside torch/lib says it
        bundled = next((c for c in cudnn if c.source == "torch:bundled" and c.version), None)
        if bundled:
            torch["cudnn"] = bundled.version
    env.notes = [*([ld_note] if ld_note else []), *drv.notes, *fabric_notes, *py_notes,
                 *cudnn_notes, *ext_notes]
    if deep_task is not None:
        with timing.span("--deep: waiting for the framework children"):
            results = deep_task.result()
        merge_deep(env, results)
    return env


def _timed(name: str, fn: Callable[..., T], *args: Any) -> T:
    with timing.span(name):
        return fn(*args)


def ldconfig_cache(host: Host) -> tuple[dict[str, list[str]], str | None]:
    """The dynamic linker cache (``ldconfig -p``), and a note when it cannot be read."""
    prog = host.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if host.exists(p)), None)
    if prog is None:
        return {}, "ldconfig not found: libraries in the system cache were not listed"
    res = host.run([prog, "-p"])
    if res is None or not res.ok:
        why = (res.error or f"exit status {res.returncode}") if res else "not runnable"
        failed = "probe failed: " if res is not None and res.error else ""
        return {}, f"{failed}ldconfig -p failed ({why}): system libraries were not listed"
    return parse.ldconfig_libs(res.stdout), None


def os_name(host: Host) -> str | None:
    """"Ubuntu 24.04.1 LTS; Linux 6.8.0-49-generic x86_64", plus WSL / container markers."""
    text, _ = host.read_text("/etc/os-release")
    name = parse.os_release_name(text)
    kernel_text, _ = host.read_text("/proc/sys/kernel/osrelease")
    kernel = (kernel_text or "").strip() or platform.release()
    parts = [p for p in (name, f"{platform.system()} {kernel} {platform.machine()}".strip())
             if p]
    wsl = parse.wsl_version(kernel)  # WSL 1's kernel is "4.4.0-19041-Microsoft": no GPU there
    if wsl is not None:
        parts.append(f"WSL{wsl or ''}")
    if host.exists("/.dockerenv") or host.exists("/run/.containerenv"):
        parts.append("container")
    return "; ".join(parts) or None
