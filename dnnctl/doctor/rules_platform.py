"""What the operating system decides before any version is compared.

- TensorFlow 2.10 was the last release with GPU support on native Windows: from 2.11 the
  Windows wheels are CPU-only (GPU through WSL2, which is Linux to doctor); on macOS 1.1 was
  the last with a GPU build.
- JAX has no CUDA build for native Windows (jaxlib's CUDA wheels and the CUDA plugins are
  Linux wheels): there every jax runs on the CPU; the GPU needs WSL2 (experimental in JAX's
  table). An error where the snapshot shows a GPU meant for it, else a conditional warning.
- The torch wheels on PyPI are CUDA builds on Linux only; on Windows and macOS a torch with
  no ``+cuXXX`` tag from PyPI is CPU-only (CUDA builds come from download.pytorch.org).
- CUDA on WSL runs in WSL 2 only, through the NVIDIA driver for Windows: inside WSL the fix
  for a missing driver is never a Linux driver install; WSL 1 has no GPU access at all.
- In a container the driver comes from the host: a container started without the GPU
  (``--gpus all`` and the NVIDIA Container Toolkit) sees no driver.
- In WSL 2 the driver's libraries (libcuda.so, libcuda.so.1) live in /usr/lib/wsl/lib, which
  the loader's cache lists as libcuda.so.1 only: a package that opens the unversioned
  ``libcuda.so`` itself (bitsandbytes before 0.40.1) fails there unless that directory is on
  LD_LIBRARY_PATH. The snapshot format does not record LD_LIBRARY_PATH, so this is a warning
  for every such package in WSL. cuDNN 8's sub-libraries (libcudnn_cnn_infer.so.8) open it
  the same way: a cuDNN 8 copy, or a framework whose cuDNN is 8 (its own field, or its torch
  wheel's row), gets the same warning.
- A CPU-only build (torch ``+cpu``, ``tensorflow-cpu``, ``is_built_with_cuda()`` False) never
  uses the GPU, so its arch list, CUDA and cuDNN are not judged.
"""

from __future__ import annotations

import re
from typing import Any

from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import python_fits, torch_install
from dnnctl.compat.versions import TorchVersion, Version
from dnnctl.doctor.context import Context, finding, flag
from dnnctl.doctor.model import Finding
from dnnctl.errors import UsageError

TF_WINDOWS_LAST_GPU = Version.parse("2.10")
TF_WINDOWS_SOURCE = (
    "https://github.com/tensorflow/tensorflow/releases/tag/v2.11.1 ('TensorFlow 2.10 was the "
    "last TensorFlow release that supported GPU on native-Windows. Starting with TensorFlow "
    "2.11, you will need to install TensorFlow in WSL2, or install tensorflow-cpu'); "
    "https://www.tensorflow.org/install/pip (Windows native)")
TORCH_PYPI_SOURCE = (
    "https://docs.astral.sh/uv/guides/integration/pytorch/ (PyPI hosts CPU-only torch wheels "
    "for Windows and macOS, CUDA wheels for Linux); opendatalab/MinerU#240 "
    "(torch-2.3.1-cp310-cp310-win_amd64.whl from PyPI: 'Torch not compiled with CUDA enabled')")
JAX_WINDOWS_SOURCE = (
    "https://docs.jax.dev/en/latest/installation.html (Supported platforms: NVIDIA GPU on "
    "'Windows, x86_64': no; on 'Windows WSL2, x86_64': experimental); "
    "https://github.com/google/jax/blob/jaxlib-v0.4.25/docs/installation.md ('Windows users "
    "can use JAX on CPU and GPU via the Windows Subsystem for Linux, or alternatively they can "
    "use the native Windows CPU-only support'); ZhengYinan-AIR/FISOR#3 (no "
    "jaxlib==0.4.9+cuda12.cudnn88 for Windows: 'JAX does not support CUDA on Windows')")
OS_NAMES = {"windows": "Windows", "macos": "macOS"}
WSL_SOURCE = (
    "https://docs.nvidia.com/cuda/wsl-user-guide/index.html ('CUDA support in this user guide "
    "is specifically for WSL 2'; Step 1: Install NVIDIA Driver for GPU Support, the Windows "
    "driver); https://docs.nvidia.com/cuda/archive/11.2.2/wsl-user-guide/index.html ('Install "
    "the driver using the executable. This is the only driver you need to install'); "
    "vllm-project/vllm#6184 (an old WSL 2 kernel, fixed by `wsl --update`)")
WSL1_SOURCE = (
    "microsoft/WSL#5554 ('That kernel version [4.4.0-19041-Microsoft] indicates that you are "
    "using WSL1'); CompVis/stable-diffusion#161 ('Found no NVIDIA driver': 'I was running WSL "
    "1, updated to WSL2 and its working fine'); " + WSL_SOURCE)
CONTAINER_SOURCE = (
    "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html "
    "(the driver is installed on the host; the toolkit passes the GPU into containers); "
    "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/"
    "sample-workload.html (the check command); NVIDIA/nvidia-docker#400")
WSL_FIX = ("in Windows (PowerShell): `wsl -l -v` must show VERSION 2 for this distro (else "
           "`wsl --set-version <distro> 2`), `wsl --update` for a current WSL kernel, and "
           "install or update the NVIDIA driver for Windows; do not install a Linux NVIDIA "
           "driver inside WSL (the Windows driver is the only one needed)")


def cpu_only(ctx: Context, component: str, what: str, *, why: str = "", fix: str | None = None,
             source: str | None = None, **evidence: Any) -> list[Finding]:
    """A build with no CUDA code: a warning when the snapshot shows CUDA is meant to be used
    (a GPU, a driver, a CUDA toolkit or runtime, a +cuXXX or nvidia-* package), else a note."""
    evident = cuda_evidence(ctx)
    if evident:
        return [finding("cuda-mismatch", "warning", component, f"{what} is a CPU-only build"
                        f"{why}: it will not use the NVIDIA GPU ({evident} here)",
                        fix=fix or _cpu_fix(ctx, component, evidence.pop("line", None)), source=source, build="cpu",
                        **evidence)]
    return [finding("ok", "info", component, f"{what} is a CPU-only build{why}: it cannot use "
                    "an NVIDIA GPU", fix=fix, source=source, build="cpu", **evidence)]


def cuda_evidence(ctx: Context) -> str | None:
    """What in the snapshot says this machine is meant to run CUDA, if anything."""
    if ctx.gpus or ctx.driver_present:
        return "a GPU or an NVIDIA driver is listed"
    torch = (ctx.env.frameworks or {}).get("torch")
    if isinstance(torch, dict) and flag(torch.get("cuda_available")) is False:
        return "torch.cuda.is_available() was checked"
    if ctx.env.cuda_runtimes:
        return f"a CUDA {ctx.env.cuda_runtimes[0].version or ''} toolkit/runtime is installed"
    for name, ver in sorted((ctx.env.packages or {}).items()):
        if re.search(r"\+cu\d+", str(ver)) or name.lower().startswith("nvidia-") or \
                CUDA_ONLY_PACKAGES.fullmatch(name.lower().replace("_", "-")):
            return f"{name} {ver or ''} is a CUDA package".replace("  ", " ")
    return None


# Distributions that exist only as CUDA builds (their names on PyPI say so): one of them beside
# a CPU-only framework says the machine is meant to run CUDA.
CUDA_ONLY_PACKAGES = re.compile(
    r"cupy-cuda\d+x?|onnxruntime-gpu|jax-cuda\d+-(plugin|pjrt)|paddlepaddle-gpu|tensorflow-gpu"
    r"|mxnet-cu\d+|pycuda|cuda-python")


def _cpu_fix(ctx: Context, component: str, line: str | None = None) -> str | None:
    """A CUDA torch in place of the CPU build: removed first, since pip takes the CPU build
    (``X+cpu``) as meeting a ``torch==X.*`` request and would install nothing."""
    if component != "torch":
        return None
    fix = cuda_torch_fix(ctx, line)
    return f"`pip uninstall -y torch`, then `{fix}`" if fix.startswith("pip install") else fix


def cuda_torch_fix(ctx: Context, line: str | None = None) -> str:
    """The torch wheel of the same line for the newest CUDA not newer than the CUDA installed
    here (the PyTorch install selector's per-CUDA index)."""
    have = [v for rt in ctx.env.cuda_runtimes if (v := Version.maybe(rt.version))]
    if line is not None and not any(python_fits(r, ctx.python)
                                    for r in ctx.matrix.torch_rows(line)):
        line = None  # the release has no wheels for this Python: the newest that has
    rows = [r for r in ctx.matrix.rows("torch") if not r.uncertain
            and python_fits(r, ctx.python) and (line is None or r["torch"] == line)
            and (not have or Version.parse(r["cuda"]).trunc(2) <= max(have).trunc(2)
                 and Version.parse(r["cuda"]).major == max(have).major)]
    if not rows:
        return ("install a CUDA build of torch (https://pytorch.org/get-started/locally/ "
                "gives the command)")
    best = max(rows, key=lambda r: (Version.parse(r["torch"]), Version.parse(r["cuda"])))
    return torch_install(best)


def gpu_stack(ctx: Context) -> bool:
    """The snapshot shows a GPU stack a framework's GPU build is meant for: a GPU, a
    driver version, a CUDA runtime or cuDNN (the Windows rules' error-or-warning test)."""
    env = ctx.env
    return bool(ctx.gpus or env.driver.get("version") or env.cuda_runtimes or env.cudnn)


def tensorflow_windows(ctx: Context, what: str, version: Version | None,
                       last_gpu: Row | None) -> list[Finding]:
    """TensorFlow >= 2.11 on native Windows: no GPU build exists."""
    if ctx.os_kind != "windows" or version is None or \
            version.trunc(2) <= TF_WINDOWS_LAST_GPU:
        return []
    old = ""
    if last_gpu is not None:
        old = (f"; or, for the GPU on native Windows, `pip install \"tensorflow=="
               f"{last_gpu['tensorflow']}.*\"` with CUDA {last_gpu['cuda']} and cuDNN "
               f"{last_gpu['cudnn']}" + (f" (Python {last_gpu['python']})"
                                         if last_gpu.get("python") else ""))
    # an error where the snapshot shows a GPU meant for it; with none, whether the GPU is
    # wanted is unknown (a CPU install is fine there): a conditional warning
    gpu = gpu_stack(ctx)
    return [finding(
        "cuda-mismatch", "error" if gpu else "warning", "tensorflow",
        ("" if gpu else "if this machine's NVIDIA GPU is meant for TensorFlow: ")
        + f"{what} has no GPU support on native Windows: TensorFlow "
        f"{TF_WINDOWS_LAST_GPU} was the last release with it, later ones run on the CPU only",
        fix="run TensorFlow in WSL2 and there `pip install \"tensorflow[and-cuda]\"`" + old,
        source=TF_WINDOWS_SOURCE, os="windows", last_gpu_release=str(TF_WINDOWS_LAST_GPU),
        conditional=None if gpu else True)]


TF_MACOS_LAST_GPU = Version.parse("1.1")
TF_MACOS_SOURCE = (
    "asimshankar in tensorflow/tensorflow#15230 ('GPUs-on-Macs are not supported by the "
    "TensorFlow team (since after version 1.2)') and #18485 ('since version 1.2 TensorFlow has "
    "not been providing GPU support on macOS. See release notes for 1.1.0'); av8ramit in "
    "#11761 ('we stopped Mac GPU support after the 1.1 release'); gunan in #12770 and #9072 "
    "('As announced in 1.1 we will drop official support for mac-gpu setups')")


def tensorflow_macos(ctx: Context, what: str, version: Version | None,
                     info: dict[str, Any]) -> list[Finding]:
    """TensorFlow >= 1.2 on macOS: no GPU build exists (the Windows rule's shape)."""
    if ctx.os_kind != "macos" or version is None or version.trunc(2) <= TF_MACOS_LAST_GPU:
        return []
    # the CPU package on a Mac with no GPU in view is simply the CPU build: nothing to say
    asked = str(info.get("package") or "") == "tensorflow-gpu"
    gpu = gpu_stack(ctx)
    if not gpu and not asked:
        return []
    return [finding(
        "cuda-mismatch", "error" if gpu else "warning", "tensorflow",
        ("" if gpu else "if an NVIDIA GPU is meant for TensorFlow here: ")
        + f"{what} has no GPU support on macOS: TensorFlow {TF_MACOS_LAST_GPU} was the last "
        "release with a macOS GPU build, later ones run on the CPU only"
        + (" (no tensorflow-gpu wheel exists for macOS)" if asked else ""),
        fix=f"on macOS `pip install \"tensorflow=={version.trunc(2)}.*\"` (CPU only); for the "
        "NVIDIA GPU run TensorFlow on a Linux host (or WSL2 on Windows)",
        source=TF_MACOS_SOURCE, os="macos", last_gpu_release=str(TF_MACOS_LAST_GPU),
        conditional=None if gpu else True)]


def jax_windows(ctx: Context, info: dict[str, Any]) -> list[Finding]:
    """jax on native Windows: no CUDA jaxlib or plugin exists there."""
    if ctx.os_kind != "windows":
        return []
    names = ctx.packages
    jaxlib = str(info.get("jaxlib") or names.get("jaxlib") or "")
    plugins = [n for n in names if re.fullmatch(r"jax-cuda\d+-(plugin|pjrt)", n)]
    if info.get("plugin"):
        plugins.append(str(info["plugin"]))
    cuda_jax = ", ".join(([f"jaxlib {jaxlib}"] if "+cuda" in jaxlib else []) + plugins)
    # an error where a GPU is meant for it (or a CUDA jaxlib / plugin asked for); with none,
    # a CPU jax on Windows is fine: a conditional warning
    gpu = gpu_stack(ctx) or bool(cuda_jax)
    what = f"jax {info['version']}" if info.get("version") else "jax (version unknown)"
    asked = f" ({cuda_jax} asked for: no such wheel exists for Windows)" if cuda_jax else ""
    return [finding(
        "cuda-mismatch", "error" if gpu else "warning", "jax",
        ("" if gpu else "if this machine's NVIDIA GPU is meant for JAX: ")
        + f"{what} has no GPU support on native Windows: JAX publishes no CUDA build for it, "
        f"only the CPU jaxlib{asked}",
        fix="run JAX in WSL2 (Ubuntu; GPU support there is experimental) and there "
        "`pip install -U \"jax[cuda12]\"`; or on native Windows the CPU build, "
        "`pip install -U jax`", source=JAX_WINDOWS_SOURCE, os="windows",
        conditional=None if gpu else True)]


def torch_pypi(ctx: Context, what: str, default: Row | None, fix: str | None) -> list[Finding]:
    """A torch with no CUDA tag on Windows / macOS: PyPI's wheel there is CPU-only."""
    kind = ctx.os_kind
    if kind not in OS_NAMES:
        return []
    if kind == "macos":
        fix = "PyPI's macOS torch wheels have no CUDA: use a Linux or Windows host for the GPU"
    elif fix is None and default is not None:
        fix = (f"pip install \"torch=={default['torch']}.*\" --index-url "
               f"https://download.pytorch.org/whl/{default['variant']}")
    return cpu_only(ctx, "torch", what, why=f" (PyPI's {OS_NAMES[kind]} wheels carry no CUDA; "
                    "CUDA builds come from download.pytorch.org with a +cuXXX tag)", fix=fix,
                    source=TORCH_PYPI_SOURCE, os=kind)


def wsl1(ctx: Context) -> list[Finding]:
    """WSL 1 (kernel ``4.4.0-<build>-Microsoft``): no GPU is reachable, whatever is installed."""
    if ctx.wsl != 1:
        return []
    return [finding("no-driver", "error", "driver", "this is WSL 1, which has no GPU support: "
                    "CUDA on WSL runs in WSL 2 only ('Found no NVIDIA driver' here means WSL 1)",
                    fix="in Windows (PowerShell): `wsl -l -v` shows VERSION 1 for this distro; "
                    "convert it with `wsl --set-version <distro> 2`, then `wsl --update`; CUDA in "
                    "WSL 2 uses the NVIDIA driver for Windows, no Linux driver",
                    source=WSL1_SOURCE, os="wsl1")]


def no_driver_fix(ctx: Context) -> tuple[str, str] | None:
    """(fix, source) for a missing driver inside WSL or a container, where installing a Linux
    driver is the wrong step; None elsewhere (the host driver install is the fix)."""
    if ctx.wsl is not None:
        return WSL_FIX, WSL_SOURCE
    if ctx.container:
        return ("in a container the driver comes from the host: start the container with "
                "--gpus all on a host with the NVIDIA driver (R580 LTSB or newer) and the "
                "NVIDIA Container Toolkit, which on the host "
                "`sudo docker run --rm --runtime=nvidia --gpus all ubuntu nvidia-smi` checks; "
                "installing a driver in the container does not help", CONTAINER_SOURCE)
    return None


WSL_LIBCUDA_SOURCE = (
    "https://docs.nvidia.com/cuda/wsl-user-guide/index.html (the Windows driver is the only "
    "one: it is stubbed inside WSL 2 as libcuda.so; do not install a Linux driver in WSL 2); "
    "microsoft/WSL#8587 (/usr/lib/wsl/lib holds libcuda.so, libcuda.so.1, libcuda.so.1.1; "
    "`ldconfig -p` lists only libcuda.so.1; with LD_LIBRARY_PATH=/usr/lib/wsl/lib "
    "libcuda.so loads); NVIDIA/cuda-python#17 (dlopen of libcuda.so in WSL: 'adding "
    "/usr/lib/wsl/lib to the LD_LIBRARY_PATH environment variable resolves the problem')")
# Packages that open the driver library by its unversioned name, and the release from which
# they no longer do (None: every release).
UNVERSIONED_LIBCUDA = {
    "bitsandbytes": ("0.40.1", (
        "bitsandbytes-foundation/bitsandbytes#17 ('WSL: libcuda.so: cannot open shared object "
        "file', cuda_setup/main.py: ctypes.CDLL(\"libcuda.so\")) and its CHANGELOG.md 0.40.1 "
        "('CUDA SETUP now no longer looks for libcuda and libcudart and relies PyTorch CUDA "
        "libraries')")),
}
WSL_LIBDIR = "/usr/lib/wsl/lib"
CUDNN8_LIBCUDA_SOURCE = (
    "facebookresearch/nougat#105 and #115 (WSL 2, cuDNN 8 from pip: 'Could not load library "
    "libcudnn_cnn_infer.so.8. Error: libcuda.so: cannot open shared object file'; fixed by a "
    "libcuda.so link to /usr/lib/wsl/lib/libcuda.so.1); microsoft/WSL#8587 (loading "
    "libcudnn_cnn_infer.so.8 needs libcuda.so); tensorflow/hub#884, "
    "facebookresearch/seamless_communication#167 (the same error in WSL 2)")


def wsl_libcuda(ctx: Context) -> list[Finding]:
    """A package that opens ``libcuda.so`` by that name, inside WSL 2 (or WSL of unknown
    generation): it is found only with /usr/lib/wsl/lib on LD_LIBRARY_PATH."""
    if ctx.wsl not in (0, 2) or ctx.driver_present is False:
        return []
    packages = ctx.packages
    out: list[Finding] = _cudnn8(ctx)
    for name, (fixed, source) in sorted(UNVERSIONED_LIBCUDA.items()):
        if name not in packages:
            continue
        ver = Version.maybe(packages[name])
        if ver is not None and fixed is not None and ver >= Version.parse(fixed):
            continue
        what = f"{name} {ver}" if ver else f"{name} (version unknown)"
        opens = (f"{what}: releases before {fixed} open" if ver is None and fixed
                 else f"{what} opens")
        fix = f"`export LD_LIBRARY_PATH={WSL_LIBDIR}:$LD_LIBRARY_PATH` (add it to ~/.bashrc)"
        if fixed:
            fix += f", or `pip install -U '{name}>={fixed}'`"
        unknown_release = ver is None and fixed is not None  # said, never assumed
        out.append(finding(
            "not-judged" if unknown_release else "libcuda-unreachable",
            "info" if unknown_release else "warning", name,
            f"{opens} the driver library by its unversioned name libcuda.so; in "
            f"WSL 2 that file is in {WSL_LIBDIR}, which the loader searches for libcuda.so.1 "
            "only, so unless LD_LIBRARY_PATH names it the package fails with 'libcuda.so: "
            "cannot open shared object file' (LD_LIBRARY_PATH is not in the snapshot)"
            + ("; whether this release is one of them is not known, so it was not judged"
               if unknown_release else ""),
            fix=fix, source=f"{source}; {WSL_LIBCUDA_SOURCE}", fixed_in=fixed,
            libdir=WSL_LIBDIR))
    return out


def _cudnn8(ctx: Context) -> list[Finding]:
    """cuDNN 8 in WSL 2: its sub-libraries open libcuda.so by that name."""
    where = [f"{c.source or c.path or 'a copy of unknown source'}"
             for c in ctx.env.cudnn if _major(c.version) == 8]
    for name, info in sorted((ctx.env.frameworks or {}).items()):
        if not isinstance(info, dict):
            continue
        cudnn = info.get("cudnn_runtime") or info.get("cudnn") or _torch_cudnn(ctx, name, info)
        if _major(cudnn) == 8:
            what = f"{name} {info['version']}" if info.get("version") else name
            where.append(f"{what} (cuDNN {cudnn})")
    if not where:
        return []
    return [finding(
        "libcuda-unreachable", "warning", "cudnn",
        f"cuDNN 8 is used here ({', '.join(where)}): its libcudnn_cnn_infer.so.8 opens the "
        f"driver library by its unversioned name libcuda.so; in WSL 2 that file is in "
        f"{WSL_LIBDIR}, which the loader searches for libcuda.so.1 only, so unless "
        "LD_LIBRARY_PATH names it convolutions fail with 'Could not load library "
        "libcudnn_cnn_infer.so.8. Error: libcuda.so: cannot open shared object file' "
        "(LD_LIBRARY_PATH is not in the snapshot)",
        # not `ldconfig`: its cache lists that directory's libcuda.so.1 only (WSL#8587)
        fix=f"`export LD_LIBRARY_PATH={WSL_LIBDIR}:$LD_LIBRARY_PATH` (add it to ~/.bashrc), or "
        f"link libcuda.so -> {WSL_LIBDIR}/libcuda.so.1 in cuDNN's lib directory; do not "
        "install a Linux NVIDIA driver inside WSL", source=f"{CUDNN8_LIBCUDA_SOURCE}; {WSL_LIBCUDA_SOURCE}",
        libdir=WSL_LIBDIR)]


def _major(version: Any) -> int | None:
    v = Version.maybe(str(version)) if version else None
    return v.major if v is not None else None


def _torch_cudnn(ctx: Context, name: str, info: dict[str, Any]) -> str | None:
    """The cuDNN a torch wheel bundles, from its row (line x +cuXXX variant)."""
    if name != "torch" or not info.get("version"):
        return None
    try:
        ver = TorchVersion.parse(info["version"])
    except UsageError:
        return None
    row = ctx.matrix.torch_row(ver.line, ver.local) if ver.local else None
    return row.get("cudnn") if row is not None and not row.uncertain else None
