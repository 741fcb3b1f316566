"""Driver, GPU and CUDA-runtime rules (the driver against one CUDA runtime: rules_runtime)."""

from __future__ import annotations

from dnnctl.compat.drivers import driver_need
from dnnctl.compat.versions import Version
from dnnctl.doctor import (
    fixcheck,
    os_fixes,
    rules_extensions,
    rules_fabric,
    rules_forward_compat,
    rules_platform,
)
from dnnctl.doctor.context import Context, GpuInfo, finding, flag, unknown
from dnnctl.doctor.model import Component, Finding
from dnnctl.doctor.rules_runtime import BRANCH_FIX, driver_fix, runtime_findings

NO_DRIVER_MSG = (
    "no NVIDIA driver is loaded: no kernel module, no libcuda.so.1 and no NVML were found. "
    "CUDA libraries report this as 'CUDA driver version is insufficient for CUDA runtime "
    "version', but nothing is too old here: the driver is missing (or, in a container, the "
    "GPU was not passed in)")

# the driver of a container is the host's (the NVIDIA Container Toolkit mounts its user-space
# libraries into the container); a driver installed into the image shadows them
CONTAINER_DRIVER_SOURCE = (
    "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/"
    "install-guide.html (the driver is installed on the host); "
    "https://docs.nvidia.com/cuda/cuda-installation-guide-linux/ (the cuda-toolkit "
    "packages install no driver, cuda / cuda-drivers do); hpc-admin-sist/DockerMonitor#42")


def probe_failures(ctx: Context) -> list[Finding]:
    """A probe that hung, crashed or was cut off: what it could not read is unknown."""
    return [finding("probe-failed", "warning", "doctor", note.removeprefix("probe failed: "),
                    fix="run `dnnctl doctor --json` again; if it repeats, the library or tool "
                    "named here hangs or crashes on this machine (check `dmesg`, reinstall it)")
            for note in ctx.env.notes if note.startswith("probe failed:")]


def check(ctx: Context) -> list[Finding]:
    """no-driver / no-gpu / driver-mismatch, each GPU against the driver, CUDA runtimes."""
    return probe_failures(ctx) + _check(ctx)


def _check(ctx: Context) -> list[Finding]:
    driver = ctx.env.driver or {}
    wsl1 = rules_platform.wsl1(ctx)
    if wsl1:
        return wsl1
    if ctx.driver_present is False:
        fix, source = rules_platform.no_driver_fix(ctx) or (
            os_fixes.driver_install(ctx), os_fixes.os_source(ctx) or os_fixes.NO_DRIVER_SOURCE)
        message = NO_DRIVER_MSG
        if ctx.gpus and ctx.os_kind in (None, "linux") and source == os_fixes.NO_DRIVER_SOURCE:
            # the GPU is on the bus: an installed driver whose module did not load is as
            # likely as no driver (Secure Boot refusing it, nouveau holding the GPU)
            message = NO_DRIVER_MSG.replace("the driver is missing", "the driver is missing or "
                                            "its kernel module did not load")
            fix = os_fixes.module_not_loaded(ctx)
        return [finding("no-driver", "error", "driver", message, fix=fix, source=source,
                        error=driver.get("error"))]
    out: list[Finding] = []
    if ctx.driver_present is None and ctx.driver is None and not driver.get("cuda") \
            and not ctx.env.gpus:
        out.append(finding("no-gpu", "warning", "gpu", "this snapshot names no GPU and no "
                           "driver: nothing in it was judged against hardware",
                           fix="add the GPU and driver (gpus: [{name: H100}], driver: {version: "
                           "...}), or run `dnnctl doctor` on the machine itself"))
    kmod = Version.maybe(driver.get("kernel_module"))
    lib = Version.maybe(driver.get("library")) or ctx.driver
    mismatch = flag(driver.get("mismatch")) is True or (
        kmod is not None and lib is not None and kmod != lib)
    if mismatch and rules_forward_compat.compat_libcuda(ctx, kmod, lib):
        mismatch = False  # the newer libcuda is cuda-compat's: judged by rules_forward_compat
    out += _no_gpu(ctx, driver, mismatch)
    if mismatch:
        # in a container the kernel module is the host's and the container toolkit mounts the
        # host's user-space libraries: a mismatch there is a driver installed inside the
        # image (a CUDA runfile or cuda-drivers package), which no reboot removes
        fix = ("inside the container, remove the NVIDIA driver that was installed into it "
               "(a runfile's: `nvidia-uninstall`; packages: `apt-get remove --purge "
               "cuda-drivers 'nvidia-driver-*' 'libnvidia-compute-*'`; an image takes CUDA "
               "toolkit packages only, never a driver) and restart the "
               "container, so that the host's driver libraries are used"
               if ctx.container else
               "reboot, or unload and reload the nvidia kernel modules, so both come from "
               "the same driver install")
        out.append(finding("driver-mismatch", "error", "driver",
                           f"kernel module {kmod or '?'} and user-space driver {lib or '?'} differ "
                           "(NVML: 'Driver/library version mismatch')", fix=fix,
                           source=CONTAINER_DRIVER_SOURCE if ctx.container else None,
                           kernel_module=kmod, library=lib))
    for gpu in ctx.gpus:
        found = _gpu_vs_driver(ctx, gpu)
        if not found and gpu.arch is not None:
            found.append(finding("ok", "info", "gpu", f"{gpu.label}: compute capability "
                                 f"{gpu.cc} ({gpu.arch['name']})", row=gpu.model or gpu.arch))
        out += found
    out += _runtimes(ctx)
    out += rules_forward_compat.check(ctx)
    if ctx.driver is not None and not any(f.component == "driver" for f in out):
        have, _ = ctx.driver_cuda
        out.append(finding("ok", "info", "driver", f"driver {ctx.driver} fully supports CUDA "
                           f"{have or 'unknown'}", driver=ctx.driver, driver_cuda=have))
    elif ctx.driver_branch is not None and not driver.get("cuda") and \
            not any(f.component == "driver" for f in out):
        out.append(_branch_line(ctx))
    return out + rules_fabric.check(ctx)  # an NVSwitch node: its Fabric Manager (fabric)


def _no_gpu(ctx: Context, driver: dict, mismatch: bool) -> list[Finding]:
    """A present driver with no GPU listed: an error only where the driver's own count says
    none (``gpu_count: 0``, what detection writes when NVML or nvidia-smi lists no GPU); a
    snapshot without ``gpus`` and ``gpu_count`` says nothing about them (absent = unknown)."""
    if flag(driver.get("present")) is not True or ctx.env.gpus or mismatch:
        return []
    count = driver.get("gpu_count")
    if count is not None and str(count).strip() == "0":
        return [finding("no-gpu", "error", "gpu",
                        f"the driver ({ctx.driver or 'version unknown'}) is loaded but sees no "
                        "NVIDIA GPU", fix="check `nvidia-smi -L`, CUDA_VISIBLE_DEVICES, the "
                        "container's --gpus flag, and that the GPU is not bound to vfio/MIG-less "
                        "passthrough", driver=ctx.driver)]
    return [finding("not-judged", "info", "gpu",
                    "the driver is present, but the snapshot names no GPU (gpus and "
                    "driver.gpu_count absent: unknown), so nothing was judged against a GPU's "
                    "compute capability", fix="add the GPUs (gpus: [{name: ..., "
                    "compute_capability: ...}]; on the machine: `nvidia-smi -L`), or run "
                    "`dnnctl doctor` there", gpu_count=count)]


def _gpu_vs_driver(ctx: Context, gpu: GpuInfo) -> list[Finding]:
    if gpu.cc is None:
        return [unknown("gpu", f"GPU {gpu.label!r} is not in the matrix and its compute "
                        "capability is unknown: its code requirements were not judged",
                        fix="give the compute capability (e.g. --gpu 9.0), or add the model to "
                        "an overlay's gpus table", gpu=gpu.label)]
    if gpu.arch is None:
        return [unknown("gpu", f"compute capability {gpu.cc} of {gpu.label} has no row in the "
                        "matrix", gpu=gpu.label, compute_capability=gpu.cc)]
    arch = gpu.arch
    out: list[Finding] = []
    if gpu.model is not None and gpu.model.uncertain:
        out.append(unknown("gpu", f"{gpu.label}: the matrix row is uncertain", row=gpu.model))
    if ctx.driver_span is None or gpu.gpu_class == "jetson" or ctx.windows:
        return out  # Jetson (L4T) and Windows drivers are not on the Linux numbering
    last = arch.get("last_driver_branch")
    drv, branch = ctx.driver, ctx.driver_branch
    if last is not None and (ctx.driver_major or 0) > last:  # a branch decides this alone
        out.append(finding(
            "arch-unsupported", "error", "driver",
            f"driver {ctx.driver_label} no longer supports {arch['name']} GPUs ({gpu.label}, "
            f"sm_{gpu.cc.major}{gpu.cc.minor}): R{last} was the last branch for them",
            fix=f"install an R{last} driver (the legacy branch for {arch['name']})",
            row=arch, driver=drv, driver_branch=branch, last_branch=last, gpu=gpu.label))
    need = Version.maybe(arch.get("min_driver"))
    at_least = ctx.driver_at_least(need) if need is not None else True
    what = f"{gpu.label} ({arch['name']}, sm_{gpu.cc.major}{gpu.cc.minor}) needs driver >= {need}"
    if at_least is False:
        out.append(finding(
            "driver-too-old", "error", "driver", f"{what}; this one is {ctx.driver_label}",
            fix=driver_fix(ctx, need), row=arch, driver=drv, driver_branch=branch,
            required=need))
    elif at_least is None and need is not None:
        out.append(unknown(
            "driver", f"{what}: drivers of the R{branch} branch before it do not drive it, and "
            "the exact version of this one is not in the snapshot",
            fix=f"check the exact version (`nvidia-smi --query-gpu=driver_version "
            f"--format=csv,noheader`); if it is older, {driver_fix(ctx, need)}", row=arch,
            driver_branch=branch, required=need))
    return out


def _branch_line(ctx: Context) -> Finding:
    """What a driver known only by its branch fully supports, with or without its exact
    version: 'R470: CUDA 11.3, and 11.4 from 470.42.01'."""
    lo, hi = ctx.branch_cuda()
    text = (f"a driver of the R{ctx.driver_branch} branch (its exact version is not in the "
            "snapshot)")
    if ctx.driver_span is None:  # Windows: a branch's drivers are numbered 53x.xx for R535
        return finding("not-judged", "info", "driver", f"{text}: Windows drivers are not "
                       "numbered by their branch, so it was not judged", fix=BRANCH_FIX,
                       driver_branch=ctx.driver_branch)
    if lo == hi:
        return finding("ok", "info", "driver", f"{text}: every driver of it fully supports "
                       f"CUDA {lo or 'unknown'}", driver_branch=ctx.driver_branch,
                       driver_cuda=lo)
    need = driver_need(ctx.matrix, hi, windows=ctx.windows).full if hi else None
    return finding("ok", "info", "driver", f"{text}: fully supports CUDA {lo or 'unknown'}, "
                   f"and CUDA {hi} from {need}", driver_branch=ctx.driver_branch,
                   driver_cuda=lo, driver_cuda_from=f"{hi} from {need}")


def _runtimes(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    for rt in ctx.env.cuda_runtimes:
        src = f"{rt.source or ''}"
        if "compat" in f"{src} {rt.path or ''}".lower():
            continue
        v = Version.maybe(rt.version)
        if v is None:
            origin = src or "unknown source"
            out.append(unknown("cuda", f"CUDA runtime version {rt.version!r} ({origin}) could not "
                               "be read", source_of=src))
            continue
        what = f"CUDA {v} ({src or 'runtime'})"
        # anything but pip's runtime wheels may be what PTX is JIT-compiled with
        out += runtime_findings(ctx, "cuda", v, what=what, jit=not src.startswith("pip"))
        out += _toolkit_targets(ctx, rt, v)
    return out


# sources that name runtime libraries, never a toolkit (README, the snapshot's fields)
RUNTIME_SOURCES = ("pip:", "conda:", "system:ldconfig", "env:")


def _toolkit_targets(ctx: Context, rt: Component, v: Version) -> list[Finding]:
    """A toolkit's targets against the GPUs. Only nvcc:<path> and system:<toolkit dir> mark a
    toolkit (README); a copy whose source is absent or none of the documented ones may or may
    not be one, so what would follow is said, not judged. `compat check --cuda` plans the
    toolkit and runtime together (source ``planned``)."""
    rel = ctx.matrix.cuda_release(v)
    if rel is None or (rt.source or "").startswith(RUNTIME_SOURCES):
        return []
    toolkit = rt.toolkit or rt.source == "planned"
    out: list[Finding] = []
    for gpu in ctx.known_ccs:
        if str(gpu.cc) in rel["targets"]:
            continue
        sm = f"sm_{gpu.cc.major}{gpu.cc.minor}"
        if not toolkit:
            out.append(finding(
                "not-judged", "info", "cuda",
                f"CUDA {v} ({_origin(rt)}): if it is a toolkit (nvcc), it cannot compile "
                f"for {gpu.label} ({sm}); whether it is one is not in the snapshot, so this "
                "was not judged", fix="name its source: nvcc:<path to nvcc> or system:<toolkit "
                "dir> for a toolkit, pip:<package>, conda:<prefix> or system:ldconfig for "
                "runtime libraries", row=rel, cuda=v, compute_capability=gpu.cc))
            continue
        found = finding(
            "cuda-mismatch", "warning", "cuda",
            f"the CUDA {v} toolkit ({rt.source}) cannot compile for {gpu.label} ({sm}); "
            "extensions built with it will not run there", fix=_toolkit_fix(ctx, gpu, v), row=rel,
            cuda=v, compute_capability=gpu.cc)
        if rules_extensions.toolkit_fix_for_torch(ctx, gpu, v) is not None:
            found.source = f"{found.source}; {rules_extensions.CPP_EXTENSION_SOURCE}"
        out.append(found)
    return out


def _origin(rt: Component) -> str:
    return f"source {rt.source!r}" if rt.source else "source not given"


def _toolkit_fix(ctx: Context, gpu: GpuInfo, have: Version | None = None) -> str:
    arch = gpu.arch
    if ctx.os_kind == "macos":
        return os_fixes.MACOS_NO_CUDA
    if arch is None:
        return "use a CUDA toolkit that lists this compute capability"
    # beside a CUDA torch the toolkit builds its extensions: it must keep torch's CUDA major
    for_torch = rules_extensions.toolkit_fix_for_torch(ctx, gpu, have)
    if for_torch is not None:
        return for_torch
    text = f"use a CUDA toolkit >= {arch['min_cuda']}"
    if arch.get("last_cuda"):
        text += f" and <= {arch['last_cuda']}"
    # the fix must pass this doctor's checks too: the oldest toolkit that can target the GPU
    # must also run on this driver, else the driver it needs is part of the fix
    need = fixcheck.driver_problem(ctx, Version.parse(arch["min_cuda"]))
    text += f", with a newer driver ({need})" if need else ""
    pick = _toolkit_release(ctx, gpu)
    if pick is not None:
        text += ": " + os_fixes.toolkit_install(ctx, pick)
    return text


# NVIDIA's CUDA apt repositories name one toolkit release's meta-package cuda-toolkit-X-Y
# from CUDA 8.0 on (CUDA installation guide for Linux, "Meta Packages"); the Windows
# installers of those releases are in the same toolkit archive.
APT_TOOLKIT_FROM = Version.parse("8.0")


def _toolkit_release(ctx: Context, gpu: GpuInfo) -> Version | None:
    """The toolkit release to install for ``gpu``: the newest that targets it and runs on this
    driver, else the oldest that targets it; None before CUDA 8.0 (no cuda-toolkit-X-Y)."""
    fits = sorted(v for r in ctx.matrix.rows("cuda_releases") if not r.uncertain
                  and str(gpu.cc) in r["targets"]
                  and (v := Version.parse(r["version"]).trunc(2)) >= APT_TOOLKIT_FROM)
    if not fits:
        return None
    runs = [v for v in fits if fixcheck.driver_problem(ctx, v) is None]
    return runs[-1] if runs else fits[0]
