"""Forward compatibility (cuda-compat): the driver branches and GPU classes it runs on, and
GPUs whose architecture the compat package's driver branch dropped."""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, GpuInfo, cite, finding, unknown
from dnnctl.doctor.model import Finding


def check(ctx: Context) -> list[Finding]:
    """cuda-compat (forward compatibility) in use: its driver branch, the GPUs it supports."""
    if ctx.forward_compat is None:
        return []
    row = ctx.matrix.forward_compat()
    if row is None:
        return []
    out: list[Finding] = []
    branch = next((r for r in ctx.matrix.rows("driver_branches")
                   if r["branch"] == ctx.driver_major), None)
    allowed = row.get("branch_types") or []
    if branch is not None and allowed and branch["type"] not in allowed:
        out.append(finding(
            "forward-compat", "error", "driver",
            f"cuda-compat {ctx.forward_compat} (forward compatibility) is in use on driver "
            f"{ctx.driver_label}, an R{branch['branch']} {branch['type']} (new feature branch): "
            f"forward compatibility is supported on {' and '.join(allowed)} branches only",
            fix="install a long-term (LTSB) or production (PB) data-center driver branch, e.g. "
            "R580, or upgrade the driver to the CUDA version needed instead",
            row=row, driver=ctx.driver, branch_type=branch["type"]))
    too_new = dict((g.label, last) for g, last in ctx.fc_too_new(ctx.forward_compat))
    for gpu in ctx.gpus:
        if gpu.label in too_new:
            out.append(_fc_too_new(ctx, row, gpu, too_new[gpu.label]))
        elif gpu.gpu_class is None:
            out.append(unknown("driver", f"cuda-compat {ctx.forward_compat} is in use and the class "
                               f"of {gpu.label} is unknown", row=row))
        elif gpu.gpu_class not in row["gpu_classes"]:
            out.append(finding(
                "forward-compat", "error", "driver",
                f"cuda-compat {ctx.forward_compat} (forward compatibility) is in use, but "
                f"{gpu.label} is a {gpu.gpu_class} GPU: it fails with '{row['error']}'",
                fix="remove the cuda-compat libraries from LD_LIBRARY_PATH (e.g. "
                "/usr/local/cuda/compat) and upgrade the driver instead",
                row=row, gpu=gpu.label, gpu_class=gpu.gpu_class))
        else:
            out.append(finding("forward-compat", "info", "driver",
                               f"cuda-compat {ctx.forward_compat} extends driver {ctx.driver_label} to "
                               f"CUDA {ctx.forward_compat} on {gpu.label}", row=row))
    return out


def gpus_unknown(ctx: Context, cuda: Version, found: Finding) -> Finding:
    """A driver-too-old finding for ``cuda`` while cuda-compat is in use and the snapshot names
    no GPU: the package extends the driver on data-center GPUs only, so whether the driver is
    too old depends on the GPU; said as a warning with the condition, never as certain."""
    row = ctx.matrix.forward_compat()
    fc = ctx.forward_compat
    if fc is None or row is None or ctx.gpus or (fc.major != 0 and fc.trunc(2) < cuda.trunc(2)):
        return found
    classes = ", ".join(row["gpu_classes"])
    found.severity = "warning"
    found.message += (f"; cuda-compat {'' if fc.major == 0 else fc} (forward compatibility) "
                      f"is in use and extends it to that CUDA on {classes} GPUs only (elsewhere "
                      f"'{row['error']}'): the snapshot names no GPU, so which applies is not "
                      "known")
    found.fix = ("check the GPU (`nvidia-smi -L`): on a data-center GPU with a driver branch "
                 f"cuda-compat supports, nothing to change; otherwise {found.fix}")
    found.source = f"{found.source}; {cite(row)}"
    return found


FC_BRANCH_SOURCE = (
    "https://gitlab.com/nvidia/container-images/cuda/-/issues/182 ('Tesla K80 supports up to "
    "CUDA 11.5 Forward Compatibility packages according to the table ... While we can start "
    "CUDA images with a version >= 11.5, they fail in action with a cudaErrorNoDevice error. "
    "Therefore, Kepler devices can only successfully run CUDA images <=11.4'); "
    "https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html (the package "
    "'is generated from the NVIDIA driver that matches with the CUDA release'); "
    "NVIDIA/nvidia-docker#1704 (K80 on R470: the 11.7.1 image fails, 11.4.3 works)")


def compat_libcuda(ctx: Context, kmod: Version | None, lib: Version | None) -> bool:
    """A user-space driver newer than the kernel module that is cuda-compat's libcuda (of the
    compat package's branch, or any newer one when that branch is unknown)."""
    if ctx.forward_compat is None or kmod is None or lib is None or lib <= kmod:
        return False
    branch = ctx.fc_branch(ctx.forward_compat)
    return branch is None or lib.major == branch


def _fc_too_new(ctx: Context, row: Row, gpu: GpuInfo, last: int) -> Finding:
    """cuda-compat's libcuda comes from a driver branch that dropped this GPU's architecture."""
    branch = ctx.fc_branch(ctx.forward_compat)
    newest = ctx.newest_cuda_of_branch(last)
    name = gpu.arch["name"]
    kmod = Version.maybe((ctx.env.driver or {}).get("kernel_module")) or ctx.driver
    return finding(
        "forward-compat", "error", "driver",
        f"cuda-compat {ctx.forward_compat} is in use: its libcuda is the R{branch} driver's, "
        f"which does not support {name} GPUs ({gpu.label}; R{last} is their last branch), so "
        f"cuInit fails with CUDA_ERROR_NO_DEVICE ('kernel version {kmod or 'R' + str(last)} "
        f"does not match DSO version {branch}...'); a reboot does not help",
        fix=f"use a CUDA <= {newest} image or runtime (the newest CUDA R{last} fully supports) "
        f"with builds that still carry {name} code, or remove the cuda-compat libraries (e.g. "
        f"/usr/local/cuda/compat) so the host's R{last} libcuda loads",
        source=FC_BRANCH_SOURCE, row=row, gpu=gpu.label, compat_branch=branch,
        last_branch=last, cuda_max=newest)
