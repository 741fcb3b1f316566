"""Install commands for the snapshot's operating system: a CUDA toolkit, CUDA runtime
libraries, the NVIDIA driver, and a directory put first on the library search path.

Every fix command the doctor prints must run on the machine the snapshot describes:

- Linux (``ctx.os_kind`` "linux", or not given: hand-written snapshots keep the Linux
  defaults): NVIDIA's CUDA apt repository names one release's toolkit ``cuda-toolkit-X-Y`` and
  its runtime libraries ``cuda-libraries-X-Y``, installed under /usr/local/cuda-X.Y.
- WSL 2 is Linux, with one difference: the driver is the Windows one, stubbed inside WSL, so
  the toolkit comes from NVIDIA's WSL-Ubuntu repository and only as ``cuda-toolkit-X-Y``
  (the ``cuda`` / ``cuda-drivers`` meta-packages would install a Linux driver over it).
- Native Windows: no apt. A toolkit (or its runtime libraries) comes from NVIDIA's installer
  in the CUDA toolkit archive, installed under C:\\Program Files\\NVIDIA GPU Computing
  Toolkit\\CUDA\\vX.Y; from CUDA 11.3 also from NVIDIA's conda channel, one label per release.
  DLLs are found through PATH, set in PowerShell as ``$env:PATH``.
- macOS: CUDA 10.2 was the last release for macOS, and current macOS has no NVIDIA driver:
  no install command helps there.
"""

from __future__ import annotations

import re

from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context
from dnnctl.doctor.model import Finding

TOOLKIT_ARCHIVE = "https://developer.nvidia.com/cuda-toolkit-archive"
DRIVER_DOWNLOAD = "https://www.nvidia.com/Download/index.aspx"
WINDOWS_TOOLKIT_DIR = r"C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA\v{version}"
# NVIDIA's conda channel labels each CUDA release from 11.3.0 on (CUDA installation guides,
# Conda: 'conda install cuda -c nvidia/label/cuda-11.3.0')
CONDA_LABELS_FROM = Version.parse("11.3")
MACOS_NO_CUDA = (
    "macOS has no CUDA: CUDA 10.2 was the last toolkit for macOS and current macOS has no "
    "NVIDIA driver; use a Linux or Windows host (or WSL 2) for the NVIDIA GPU")
OS_FIX_SOURCE = (
    "CUDA 10.2 release notes ('CUDA 10.2 (Toolkit and NVIDIA driver) is the last release to "
    "support macOS'); https://docs.nvidia.com/cuda/wsl-user-guide/index.html (inside WSL 2 the "
    "Windows driver is stubbed as libcuda.so: install only the toolkit, cuda-toolkit-X-Y, from "
    "the WSL-Ubuntu repository, never a Linux driver); "
    "https://docs.nvidia.com/cuda/cuda-installation-guide-microsoft-windows/ (the installer, "
    "and Conda: 'conda install cuda -c nvidia/label/cuda-11.3.0')")


def _mm(v: Version) -> Version:
    return v.trunc(2)


def toolkit_install(ctx: Context, cuda: Version) -> str:
    """How to install the CUDA ``cuda`` toolkit here, ending with the nvcc to build with."""
    v = _mm(cuda)
    if ctx.os_kind == "macos":
        return MACOS_NO_CUDA
    if ctx.os_kind == "windows":
        nvcc = WINDOWS_TOOLKIT_DIR.format(version=v) + r"\bin\nvcc.exe"
        text = (f"NVIDIA's CUDA {v} installer for Windows ({TOOLKIT_ARCHIVE}; then build with "
                f"its nvcc, {nvcc})")
        if v >= CONDA_LABELS_FROM:
            text += f", or in a conda environment `conda install cuda -c nvidia/label/cuda-{v}.0`"
        return text
    where = ("NVIDIA's WSL-Ubuntu CUDA repository: only this package, not the cuda or "
             "cuda-drivers meta-packages, which would install a Linux driver over WSL's"
             if ctx.wsl is not None else "NVIDIA's CUDA apt repository")
    return (f"`sudo apt-get install cuda-toolkit-{v.major}-{v.minor}` (from {where}; then build "
            f"with its nvcc, {toolkit_nvcc(ctx, v)})")


def toolkit_nvcc(ctx: Context, cuda: Version) -> str:
    """Where the CUDA ``cuda`` toolkit's nvcc is once installed as above, for a command line
    (the Windows installer sets CUDA_PATH_VX_Y to its folder)."""
    v = _mm(cuda)
    if ctx.os_kind == "windows":
        return f"$env:CUDA_PATH_V{v.major}_{v.minor}\\bin\\nvcc.exe"
    return f"/usr/local/cuda-{v}/bin/nvcc"


def runtime_install(ctx: Context, cuda: Version) -> str:
    """How to add one CUDA release's runtime libraries beside any other CUDA."""
    v = _mm(cuda)
    if ctx.os_kind == "macos":
        return MACOS_NO_CUDA
    if ctx.os_kind == "windows":
        return (f"install the CUDA {v} runtime libraries (the toolkit's installer, "
                f"{TOOLKIT_ARCHIVE})")
    return (f"`sudo apt-get install cuda-libraries-{v.major}-{v.minor}` (the CUDA {v} runtime "
            "libraries, beside any other CUDA)")


def set_env(ctx: Context, name: str, value: str) -> str:
    """One environment variable for the commands after it, in this OS's shell (PowerShell on
    Windows); ``value`` as the POSIX shell takes it (quoted where it needs to be)."""
    if ctx.os_kind == "windows":
        return f'$env:{name}="{value.strip(chr(34))}"'
    return f"export {name}={value}"


def library_path_first(ctx: Context, directory: str) -> str:
    """The command that puts ``directory`` first where the loader looks for libraries:
    LD_LIBRARY_PATH on Linux, PATH on Windows (DLLs are found through it)."""
    if ctx.os_kind == "windows":
        return f'$env:PATH="{directory};$env:PATH"'
    return f"export LD_LIBRARY_PATH={directory}:$LD_LIBRARY_PATH"


def library_path_var(ctx: Context) -> str:
    return "PATH" if ctx.os_kind == "windows" else "LD_LIBRARY_PATH"


def driver_install(ctx: Context) -> str:
    """Installing the NVIDIA driver on this OS (outside WSL and containers, which
    rules_platform.no_driver_fix covers)."""
    if ctx.os_kind == "macos":
        return MACOS_NO_CUDA
    if ctx.os_kind == "windows":
        return (f"install the NVIDIA driver for Windows (R580 or newer) from {DRIVER_DOWNLOAD} "
                "and reboot")
    if rpm_distro(ctx):
        return ("install the NVIDIA driver from RPM Fusion nonfree (`sudo dnf install "
                "akmod-nvidia xorg-x11-drv-nvidia-cuda`) and reboot; in a container run with "
                "`--gpus all` and the NVIDIA Container Toolkit")
    return ("install the NVIDIA driver (R580 LTSB or newer, e.g. `sudo apt install "
            "nvidia-driver-580` on Ubuntu) and reboot; in a container run with `--gpus all` "
            "and the NVIDIA Container Toolkit")


# An installed driver whose kernel module does not load: with UEFI Secure Boot on, the kernel
# loads only signed modules, and a module built on the machine (akmods, DKMS) is signed with a
# machine owner key that must be enrolled (mokutil); meanwhile nouveau keeps the GPU.
SECURE_BOOT_SOURCE = (
    "https://docs.redhat.com/en/documentation/red_hat_enterprise_linux/8/html/"
    "managing_monitoring_and_updating_the_kernel/signing-a-kernel-and-modules-for-secure-boot_"
    "managing-monitoring-and-updating-the-kernel (with Secure Boot enabled every kernel module "
    "must be signed and its public key enrolled; mokutil enrolls it); akmods README.secureboot "
    "(Fedora: third-party modules such as NVIDIA's are signed with akmods' key, "
    "/etc/pki/akmods/certs/public_key.der, enrolled with `mokutil --import`; "
    "copr.fedorainfracloud.org/coprs/egeretto/akmods-secureboot); canonical/"
    "nvidia-graphics-drivers#62 (Secure Boot on: `modprobe nvidia` 'Key was rejected by "
    "service', nvidia-smi 'couldn't communicate with the NVIDIA driver'); "
    "gridhead/nvidia-auto-installer-for-fedora-linux#75 (Fedora 34, RPM Fusion driver "
    "installed, nouveau in use: Secure Boot off and a reinstall fixed it); rpmfusion-users "
    "list ('Fedora ships nouveau ... RPMFusion repackages [the driver] as (a)kmod-nvidia')")
NO_DRIVER_SOURCE = SECURE_BOOT_SOURCE
_RPM_DISTROS = ("fedora", "rhel", "red hat", "centos", "rocky", "alma")


def rpm_distro(ctx: Context) -> bool:
    """Fedora and the RHEL family: dnf and RPM Fusion / NVIDIA's rpm repository, never apt."""
    text = (ctx.env.os or "").lower()
    return ctx.os_kind in (None, "linux") and any(d in text for d in _RPM_DISTROS)


def module_not_loaded(ctx: Context) -> str:
    """What to check, in this distribution's commands, when the GPU is there and no NVIDIA
    kernel module is loaded."""
    check = ("check `mokutil --sb-state` and `lsmod | grep -e nvidia -e nouveau`; if Secure Boot "
             "is enabled, the unsigned or unenrolled NVIDIA module is refused (`sudo modprobe "
             "nvidia`: 'Key was rejected by service') and nouveau keeps the GPU")
    if rpm_distro(ctx):
        return (f"{check}: enroll akmods' signing key with `sudo kmodgenca -a` and `sudo "
                "mokutil --import /etc/pki/akmods/certs/public_key.der`, reboot and choose "
                "Enroll MOK, then rebuild the module with `sudo akmods --force` and reboot "
                "(or turn Secure Boot off in the firmware); if the driver is not installed: "
                "`sudo dnf install akmod-nvidia xorg-x11-drv-nvidia-cuda` (RPM Fusion "
                "nonfree) and reboot")
    return (f"{check}: enroll the key the driver's module was signed with (`sudo mokutil "
            "--import <its .der key>`, reboot, Enroll MOK) or turn Secure Boot off in the "
            "firmware; if the driver is not installed: " + driver_install(ctx))


def os_source(ctx: Context) -> str | None:
    """The citation for an OS-specific fix (None on Linux, where the fix cites its own)."""
    return OS_FIX_SOURCE if ctx.os_kind in ("windows", "macos") or ctx.wsl is not None else None


_EXPORT = re.compile(r"`export (\w+)=(\"[^\"`]*\"|'[^'`]*'|[^\s`]*)`")
_UNSET = re.compile(r"`unset (\w+)`")


def for_shell(ctx: Context, findings: list[Finding]) -> None:
    """On native Windows, the POSIX shell's environment commands that rules write into a fix
    (`export NAME=value`, `unset NAME`) in PowerShell's form. A search-path variable is not
    translated: its Windows meaning differs, and the rules that name one pick it per OS."""
    if ctx.os_kind != "windows":
        return
    for f in findings:
        if not f.fix:
            continue
        f.fix = _EXPORT.sub(lambda m: m.group(0) if m.group(1).endswith("LIBRARY_PATH") else
                            f"`{set_env(ctx, m.group(1), m.group(2).strip(chr(39)))}`", f.fix)
        f.fix = _UNSET.sub(lambda m: f"`Remove-Item Env:{m.group(1)}`", f.fix)
