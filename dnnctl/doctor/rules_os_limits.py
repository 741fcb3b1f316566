"""What native Windows and WSL 2 leave out that Linux has, said where the snapshot makes it
relevant (rules_platform holds the framework builds the OS rules out).

- Package families with no native build for an OS (compat/limits.yaml ``os_builds``: RAPIDS
  on Windows, only through WSL 2): an error, whatever else is known.
- torch's Windows builds have no NCCL: ``torch.distributed`` code asking for the ``nccl``
  backend (torchrun scripts, DistributedDataParallel) fails with "Distributed package doesn't
  have NCCL built in" (gloo works). A conditional warning for a CUDA build of torch there.
- torch.compile's GPU backend (Inductor) generates Triton kernels, and Triton publishes no
  Windows build: "Cannot find a working triton installation". A conditional warning for a
  CUDA build of torch 2.0 or later (or of unknown release) without a triton package.
- WSL 2 reaches a GPU only through Windows' WDDM driver model; data-center GPUs run in TCC by
  default (some only in it): a conditional warning for one the snapshot does not show WSL
  reaching.
- WSL 2 limits pinned (page-locked) host memory: a large pinned allocation fails with out of
  memory. ggml's CUDA backend (llama.cpp and its bindings) pins host buffers, which
  ``GGML_CUDA_NO_PINNED=1`` turns off: a conditional warning for such a build in WSL 2.
"""

from __future__ import annotations

from typing import Any

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name

NCCL_SOURCE = (
    "https://docs.pytorch.org/docs/stable/distributed.html, 'Backends that come with PyTorch' "
    "('By default for Linux, the Gloo and NCCL backends are built and included'; 'As of "
    "PyTorch v1.8, Windows supports all collective communications backends but NCCL'; v1.7: "
    "'Windows support for the distributed package only covers collective communications with "
    "Gloo backend'); HamidShojanazeri in meta-llama/llama3#127 (Windows: 'Distributed package "
    "doesn't have NCCL built in': 'use torch.distributed.init_process_group(backend='gloo')')")
TRITON_SOURCE = (
    "https://github.com/triton-lang/triton#compatibility ('Supported Platforms: Linux'); "
    "malfet (PyTorch) in pytorch/pytorch#136361 (torch.compile on Windows: 'RuntimeError: "
    "Cannot find a working triton installation ... This is an expected behavior, as there are "
    "no Triton for Windows yet', a duplicate of pytorch/pytorch#90768); rotx-eva in "
    "analogdevicesinc/ai8x-training#329 (torch 2.3.1+cu121 on Windows 10: compiling off, "
    "'--compiler-mode none', works); the community build: https://github.com/woct0rdho/"
    "triton-windows ('pip install triton-windows')")
PINNED_SOURCE = (
    "CUDA on WSL User Guide, 'Known Limitations for Linux CUDA Applications' ('Pinned system "
    "memory (example: System memory that an application makes resident for GPU accesses) "
    "availability for applications is limited'), https://docs.nvidia.com/cuda/wsl-user-guide/"
    "index.html#known-limitations-for-linux-cuda-applications; ggml-org/llama.cpp PR #1233 "
    "(slaren: 'fall back to pageable memory if pinned alloc fails', 'adds an environment "
    "variable GGML_CUDA_NO_PINNED that can be set to disable all pinned memory usage', fixing "
    "#1230: 'WSL: CUDA error 2 at ggml-cuda.cu:359: out of memory'); PR #1594 ('In WSL, the "
    "CUDA has limitation on the pinned memory'); ggml-org/llama.cpp#1735 ('export "
    "GGML_CUDA_NO_PINNED=1 ... works fine on the latest commit under WSL2, as long as you "
    "disabled pinned memory')")
GGML = ("llama-cpp-python", "pywhispercpp")
TRITON_PACKAGES = ("triton", "triton-windows", "pytorch-triton")


def check(ctx: Context) -> list[Finding]:
    """Every OS limit the snapshot makes relevant."""
    packages = ctx.packages
    out = _os_builds(ctx, packages)
    torch = _cuda_torch(ctx, packages)
    if ctx.os_kind == "windows" and torch is not None:
        out += _torch_windows(ctx, torch, packages)
    if ctx.wsl in (0, 2):
        out += _pinned(ctx, packages) + _tcc(ctx)
    return out


TCC_SOURCE = (
    "microsoft/WSL#9952 (H100 PCIe, which Windows runs only in TCC, not visible in WSL 2: "
    "'WSL only supports CUDA with GPUs in WDDM mode'), https://github.com/microsoft/WSL/issues/"
    "9952; microsoft/WSL#13027 ('TCC driver mode is currently not supported with WSL'); "
    "nvidia-smi(1), -dm / --driver-model ('0/WDDM, 1/TCC ... Windows only')")


def _tcc(ctx: Context) -> list[Finding]:
    """Data-center GPUs in WSL 2 that the snapshot does not show WSL reaching: Windows runs
    them in the TCC driver model by default (some only in it), and WSL 2 reaches a GPU only
    through WDDM. Conditional: a WDDM-capable board switched to WDDM works."""
    count = (ctx.env.driver or {}).get("gpu_count")
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        return []  # the driver in WSL lists GPUs: they are reached
    names = [g.label for g in ctx.gpus if g.gpu_class == "datacenter"]
    if not names:
        return []
    return [finding(
        "platform-unsupported", "warning", "gpu",
        f"{', '.join(names)} {'is a data-center GPU' if len(names) == 1 else 'are data-center GPUs'}"
        ": Windows runs those in the TCC driver model by default (some, such as the H100 PCIe, "
        "only in it), and WSL 2 reaches a GPU only through the WDDM model, so a GPU in TCC "
        "mode is not visible in WSL", fix="on Windows, `nvidia-smi -q` shows each GPU's "
        "Driver Model; switch one that supports it to WDDM (`nvidia-smi -i <index> -dm 0` as "
        "administrator, then reboot); a GPU that runs only TCC works from native Linux or from "
        "a VM it is passed through to, not from WSL", source=TCC_SOURCE, conditional=True,
        gpus=names)]


def _os_builds(ctx: Context, packages: dict[str, str]) -> list[Finding]:
    out = []
    for row in ctx.matrix.rows("os_builds"):
        if row.uncertain or row["os"] != ctx.os_kind:
            continue
        names = _names(row)
        here = [n for n in sorted(packages) if n in names]
        if not here:
            continue
        what = ", ".join(f"{n} {packages[n]}".strip() for n in here)
        out.append(finding(
            "platform-unsupported", "error", here[0],
            f"{what}: {row['family']} has no native {row['os'].capitalize()} build (not even a "
            f"CPU one); on {row['os'].capitalize()} it runs only inside {row['via']}, so "
            "installing or building it natively fails", fix=row["fix"], row=row,
            os=row["os"], packages=here))
    return out


def _names(row: Row) -> set[str]:
    """The row's distributions, each also under its -cu11 / -cu12 / -cu13 wheel name."""
    base = [row["package"], *(row.get("packages") or [])]
    return {canonical_name(f"{n}{s}") for n in base for s in ("", "-cu11", "-cu12", "-cu13")}


def _cuda_torch(ctx: Context, packages: dict[str, str]) -> dict[str, Any] | None:
    """The torch here if it is a CUDA build (its CUDA, a +cuXXX version, cuda_build)."""
    info: dict[str, Any] = dict((ctx.env.frameworks or {}).get("torch") or {})
    version = str(info.get("version") or packages.get("torch") or "")
    if info.get("cuda_build") is False or "+cpu" in version:
        return None
    if info.get("cuda") or "+cu" in version or info.get("cuda_build") is True:
        info["version"] = version or None
        return info
    return None


def _torch_windows(ctx: Context, torch: dict[str, Any],
                   packages: dict[str, str]) -> list[Finding]:
    what = f"torch {torch['version']}" if torch.get("version") else "torch (version unknown)"
    out = [finding(
        "platform-unsupported", "warning", "torch",
        f"if this program uses torch.distributed with the NCCL backend (torchrun scripts, "
        f"DistributedDataParallel, init_process_group('nccl'), also on one GPU): {what} on "
        "native Windows has no NCCL, so it fails with 'Distributed package doesn't have NCCL "
        "built in'", fix="use the gloo backend: `torch.distributed.init_process_group("
        "backend=\"gloo\")` in the program (PyTorch Lightning: "
        "`export PL_TORCH_DISTRIBUTED_BACKEND=gloo`); or run it under WSL 2 or Linux, where "
        "torch has NCCL", source=NCCL_SOURCE, os="windows", conditional=True)]
    ver = Version.maybe(str(torch.get("version") or "").split("+")[0])
    if (ver is None or ver >= Version.parse("2.0")) and \
            not any(n in packages for n in TRITON_PACKAGES):
        since = "" if ver is not None else " (torch 2.0 or later)"
        out.append(finding(
            "platform-unsupported", "warning", "torch",
            f"if this program calls torch.compile on a CUDA device{since}: its default GPU "
            "backend (Inductor) generates Triton kernels, and Triton publishes no build for "
            f"native Windows (none is installed here), so {what} fails with 'Cannot find a "
            "working triton installation'", fix="run without compiling (drop torch.compile, "
            "or the program's option that turns it off), or fall back to eager "
            "on failure with `torch._dynamo.config.suppress_errors = True`; for compiled GPU "
            "code run it under WSL 2 or Linux (or try the community triton-windows wheels)",
            source=TRITON_SOURCE, os="windows", conditional=True))
    return out


def _pinned(ctx: Context, packages: dict[str, str]) -> list[Finding]:
    out = []
    for name in GGML:
        info = (ctx.env.frameworks or {}).get(name) or {}
        if name not in packages and not info:
            continue
        backends = [str(b).lower() for b in info.get("backends") or []]
        if info.get("cuda_build") is False or (backends and "cuda" not in backends):
            continue
        if info.get("cuda_build") is not True and "cuda" not in backends:
            continue  # a CPU build is the default: only a CUDA one pins
        version = info.get("version") or packages.get(name)
        what = f"{name} {version}" if version else name
        out.append(finding(
            "pinned-memory", "warning", name,
            f"{what} is a CUDA build in WSL 2, which limits pinned (page-locked) host memory: "
            "ggml's CUDA backend pins host buffers (the whole model with --no-mmap / "
            "use_mmap=False), and a large pinned allocation fails with 'CUDA error 2 ... out of "
            "memory' or 'failed to allocate ... MB of pinned memory', although the GPU has room "
            "(if the model is that large)", fix="`export GGML_CUDA_NO_PINNED=1` before starting "
            "it (pageable host memory instead), or keep mmap on; the same holds for other "
            "pinned buffers in WSL 2 (torch's DataLoader pin_memory=True)",
            source=PINNED_SOURCE, os="wsl2", conditional=True))
    return out
