"""cuInit failing while the driver lists GPUs (``driver.cuinit``, asked by the probe in a child).

NVML and nvidia-smi talk to the kernel driver without CUDA; cuInit(0) is what every CUDA
program does first. When NVML lists GPUs and cuInit fails with CUDA_ERROR_UNKNOWN (999) on
Linux, the known cause is a suspend/resume cycle that left nvidia_uvm (CUDA's unified memory
module) unusable: the default suspend path (the kernel driver callbacks) does not cover UVM,
NVIDIA's systemd suspend services with preserved video memory do. The fix is to reload
nvidia_uvm with nothing using CUDA, and to use those services from then on. Any other failing
cuInit code there is said as such, with the checks, where no other finding explains it.
"""

from __future__ import annotations

from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding

UNKNOWN = 999  # CUDA_ERROR_UNKNOWN
SOURCE = (
    "https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TYPES.html (CUresult: "
    "CUDA_ERROR_UNKNOWN = 999); https://download.nvidia.com/XFree86/Linux-x86_64/470.63.01/"
    "README/powermanagement.html (NVIDIA's Linux driver README, 'Configuring Power Management "
    "Support': unlike the default kernel driver callbacks, the systemd mechanism 'supports "
    "power management with advanced CUDA features (such as UVM)'; "
    "NVreg_PreserveVideoMemoryAllocations=1 with nvidia-suspend.service / "
    "nvidia-hibernate.service / nvidia-resume.service; the same chapter of the 595.45.04 "
    "README); pop-os/default-settings#64 ('CUDA "
    "fails to initialize after resuming from suspend ... until we reload the nvidia_uvm "
    "module'); pytorch/pytorch#88639 and #49081 ('CUDA unknown error' after suspend, fixed by "
    "`modprobe -r nvidia_uvm && modprobe nvidia_uvm`); gbionics/jaxsim#50 ('failed call to "
    "cuInit: CUDA_ERROR_UNKNOWN' after resuming)")
RELOAD = "`sudo rmmod nvidia_uvm && sudo modprobe nvidia_uvm`"
PRESERVE = ("`echo 'options nvidia NVreg_PreserveVideoMemoryAllocations=1' | sudo tee "
            "/etc/modprobe.d/nvidia-power-management.conf` and `sudo systemctl enable "
            "nvidia-suspend.service nvidia-hibernate.service nvidia-resume.service`")


def check(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """The cuInit result against the GPUs the driver lists."""
    init = (ctx.env.driver or {}).get("cuinit") or {}
    code, name = init.get("code"), init.get("name")
    listed = len(ctx.env.gpus) or _count(ctx)
    if not listed or (code in (None, 0) and name in (None, "CUDA_SUCCESS")):
        return []
    gpus = f"{listed} GPU{'s' * (listed != 1)}"
    if code == UNKNOWN or name == "CUDA_ERROR_UNKNOWN":
        if ctx.os_kind not in (None, "linux") or ctx.wsl is not None:
            return []  # nvidia_uvm and its suspend path are native Linux's
        return [finding(
            "cuda-init", "error", "driver",
            f"cuInit fails with CUDA_ERROR_UNKNOWN (999) although the driver lists {gpus}: "
            "every CUDA program here fails to start (torch: 'CUDA unknown error - this may be "
            "due to an incorrectly set up environment', torch.cuda.is_available() False; JAX: "
            "'failed call to cuInit: CUDA_ERROR_UNKNOWN'). The known cause is a suspend / "
            "resume that left nvidia_uvm, CUDA's unified-memory module, unusable: the default "
            "suspend path does not cover it",
            fix=f"with no CUDA program running, reload it: {RELOAD} (or reboot); so that it "
            f"survives the next suspend, use NVIDIA's suspend services: {PRESERVE}, then "
            "reboot", source=SOURCE, cuinit=code if code is not None else name,
            gpus_listed=listed)]
    if any(f.severity == "error" and f.component in ("driver", "gpu", "cuda")
           for f in findings):
        return []  # a finding above already says why CUDA does not start
    shown = f"{name} ({code})" if name and code is not None else name or f"CUDA error {code}"
    return [finding(
        "cuda-init", "warning", "driver",
        f"cuInit fails with {shown} although the driver lists {gpus}: CUDA programs here fail "
        "to start", fix="read the driver's own account (`sudo dmesg | grep -i nvrm`) and "
        "check CUDA_VISIBLE_DEVICES and /dev/nvidia-uvm; the CUresult's meaning is in the "
        "CUDA driver API's error list", source=SOURCE.split("; ")[0],
        cuinit=code if code is not None else name, gpus_listed=listed)]


def _count(ctx: Context) -> int:
    count = (ctx.env.driver or {}).get("gpu_count")
    return count if isinstance(count, int) and count > 0 else 0
