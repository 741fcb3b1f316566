"""A GPU that drives a display runs kernels under a watchdog.

On a GPU with a display (an X server on Linux, the WDDM desktop on Windows) the driver stops a
kernel that runs longer than a few seconds: "the launch timed out and was terminated"
(cudaErrorLaunchTimeout / CUDA_ERROR_LAUNCH_TIMEOUT, 702), which leaves the process unable to
use CUDA. ``gpus[].watchdog`` (cudaDevAttrKernelExecTimeout, deviceQuery's "Run time limit on
kernels", numba's cuda.detect() "Watchdog: Enabled") says it is on: a warning; ``display_active``
(NVML) says a display is up on the GPU, which on Linux turns it on: a conditional warning.
"""

from __future__ import annotations

from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding, Gpu

SOURCE = (
    "CUDA Runtime API, cudaErrorLaunchTimeout = 702 ('This indicates that the device kernel took "
    "too long to execute. This can only occur if timeouts are enabled - see the device property "
    "kernelExecTimeoutEnabled ... To continue using CUDA, the process must be terminated and "
    "relaunched'), https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html; "
    "NVML nvmlDeviceGetDisplayActive ('whether a display is initialized on the device. For "
    "example whether X Server is attached to this device'); NVIDIA answer 3029 'Using CUDA and "
    "X' (https://nvidia.custhelp.com/app/answers/detail/a_id/3029: a run-time limit for CUDA "
    "kernels on a GPU that X uses); gmarkall (numba) in numba/numba#9381 (a GTX 980 driving "
    "the display, 'Watchdog: Enabled': 'ideally you will need to use another GPU for the "
    "display, or disable X when running')")
WINDOWS = ("on Windows the limit is WDDM's Timeout Detection and Recovery: a GPU that supports "
           "it can run in TCC mode (`nvidia-smi -i {i} -dm 1`, no display then), or raise "
           "TdrDelay under HKLM\\SYSTEM\\CurrentControlSet\\Control\\GraphicsDrivers")


def check(ctx: Context) -> list[Finding]:
    """One finding per GPU whose watchdog is on, or that drives a display."""
    out = []
    others = [g for g in ctx.env.gpus if not (g.mig or {}).get("profile")]
    for i, g in enumerate(ctx.env.gpus):
        if (g.mig or {}).get("profile") or not (g.watchdog or g.display_active):
            continue
        if g.watchdog is False:
            continue  # a display with the watchdog known to be off
        idx = g.index if g.index is not None else i
        name = f"GPU {idx} ({g.name})" if g.name else f"GPU {idx}"
        spare = [o for o in others if o is not g and not o.watchdog and not o.display_active]
        if g.watchdog:
            what = (f"{name} runs kernels under the display watchdog (its kernel run-time "
                    "limit is on)")
        else:
            what = (f"{name} drives a display, so kernels on it run under the display watchdog "
                    "(on Linux while an X server uses it)")
        out.append(finding(
            "kernel-timeout", "warning", "gpu",
            f"{what}: a single kernel that runs longer than a few seconds is stopped with 'the "
            "launch timed out and was terminated' (CUDA_ERROR_LAUNCH_TIMEOUT, 702), and the "
            "process cannot use CUDA after it", fix=_fix(ctx, idx, spare), source=SOURCE,
            gpu=g.name, watchdog=g.watchdog, display_active=g.display_active,
            conditional=None if g.watchdog else True))
    return out


def _fix(ctx: Context, idx: int, spare: list[Gpu]) -> str:
    other = ""
    if spare:
        o = spare[0]
        other = (f"run the long kernels on GPU {o.index if o.index is not None else '?'}, "
                 "which drives no display (CUDA_VISIBLE_DEVICES), or ")
    fix = (f"{other}drive the display from another GPU (or the integrated one), stop the "
           "display server for the run (`sudo systemctl isolate multi-user.target`, back with "
           "graphical.target), or split the work into shorter kernel launches")
    if ctx.os_kind == "windows":
        fix = (f"{other}split the work into shorter kernel launches; " +
               WINDOWS.format(i=idx))
    return fix
