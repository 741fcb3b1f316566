"""@tensorflow/tfjs-node-gpu (npm): the libtensorflow it downloads, and that build's CUDA.

tfjs-node-gpu does not use the Python TensorFlow installed beside it: its install script
downloads one libtensorflow release (``LIBTENSORFLOW_VERSION`` in
tfjs-node/scripts/deps-constants.js, read at each release tag of
https://github.com/tensorflow/tfjs), which dlopens the CUDA and cuDNN that TensorFlow release
was built with (compat/frameworks.yaml, TensorFlow's tested build configurations). The README
says the same per period: 'CUDA Toolkit 10.0, cuDNN SDK >=7.4.1' (tfjs-node-gpu 1.2.4 on),
then 'CUDA Toolkit 11.2, cuDNN SDK 8.1.0' (tfjs-node/README.md, tensorflow/tfjs#5427); the
TensorFlow pip guide's CUDA 12 does not apply to it (tensorflow/tfjs#8362: 'Could not load
dynamic library libcudart.so.11.0' with only CUDA 12.3 installed).
"""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor import os_fixes, rules_cudnn
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_libraries import library_major, loadable_majors

COMPONENT = "tfjs-node-gpu"
SOURCE = (
    "tensorflow/tfjs tfjs-node/scripts/deps-constants.js (LIBTENSORFLOW_VERSION at the tags "
    "tfjs-node-v1.2.7: 1.14.0, tfjs-v1.5.0: 1.15.0, tfjs-v3.4.0: 2.4.1, tfjs-v3.8.0: 2.5.0, "
    "tfjs-v3.10.0: 2.6.0, tfjs-v3.12.0: 2.7.0, tfjs-v3.19.0: 2.7.3, tfjs-v3.21.0 to v4.22.0: "
    "2.9.1); tfjs-node/README.md ('CUDA Toolkit 11.2', 'cuDNN SDK 8.1.0'); "
    "https://www.tensorflow.org/install/source#gpu (each libtensorflow's CUDA and cuDNN)")

# (tfjs-node-gpu releases, the libtensorflow release they download)
LIBTENSORFLOW = (
    (">=1.2.7, <1.5.0", "1.14.0"), (">=1.5.0, <3.4.0", "1.15.0"), (">=3.4.0, <3.8.0", "2.4.1"),
    (">=3.8.0, <3.10.0", "2.5.0"), (">=3.10.0, <3.12.0", "2.6.0"),
    (">=3.12.0, <3.19.0", "2.7.0"), (">=3.19.0, <3.21.0", "2.7.3"), (">=3.21.0, <5", "2.9.1"),
)

# apt packages (NVIDIA's CUDA and machine-learning repositories) for a libtensorflow's CUDA:
# the runtime libraries meta-package and a cuDNN build for that CUDA, as TensorFlow's GPU
# install guide of the period installed them (libcudnn8=8.1.0.77-1+cuda11.2, ...).
APT = {"10.0": ("cuda-libraries-10-0", "libcudnn7=7.6.5.32-1+cuda10.0"),
       "11.0": ("cuda-libraries-11-0", "libcudnn8=8.0.4.30-1+cuda11.0"),
       "11.2": ("cuda-libraries-11-2", "libcudnn8=8.1.0.77-1+cuda11.2")}


def _package(ctx: Context) -> tuple[str, str | None] | None:
    """(name as written, version text) of tfjs-node-gpu, if the snapshot lists it."""
    for name, ver in (ctx.env.packages or {}).items():
        if str(name).lower().rsplit("/", 1)[-1] == COMPONENT:
            return str(name), (str(ver) if ver is not None else None)
    return None


def check(ctx: Context) -> list[Finding]:
    """tfjs-node-gpu's libtensorflow against the CUDA runtime and cuDNN here."""
    found = _package(ctx)
    if found is None:
        return []
    name, text = found
    ver = Version.maybe(text)
    rows = [(rng, lib) for rng, lib in LIBTENSORFLOW
            if ver is None or VersionRange.parse(rng).contains(ver)]
    if not rows:
        return [finding("unknown-version", "warning", COMPONENT, f"{name} {text}: which "
                        "libtensorflow this release downloads is not in the table",
                        fix=f"`npm ls {name}`", source=SOURCE)]
    builds = [(rng, lib, tf) for rng, lib in rows
              if (tf := ctx.matrix.tensorflow_row(Version.parse(lib))) is not None]
    if ver is None:
        return _any_release(ctx, name, builds)
    rng, lib, tf = builds[-1]
    cuda, cudnn = Version.parse(tf["cuda"]), Version.parse(tf["cudnn"])
    what = f"{name} {text} (libtensorflow {lib}, built for CUDA {cuda} / cuDNN {cudnn})"
    fix = _fix(ctx, cuda, cudnn)
    out = library_major(ctx, COMPONENT, what, cuda.major, "libcudart", fix=fix, row=tf,
                        built=cuda)
    out += rules_cudnn.need_check(ctx, COMPONENT, what, cudnn, fix=fix)
    for f in out:
        f.source = SOURCE
    return out


def _any_release(ctx: Context, name: str, builds: list[tuple[str, str, Row]]) -> list[Finding]:
    """Version unknown: a problem only where no release's CUDA major is loadable here."""
    have = loadable_majors(ctx)
    majors = sorted({Version.parse(tf["cuda"]).major for _, _, tf in builds})
    if have is None or any(m in have for m in majors):
        return []
    _, lib, tf = builds[-1]
    cuda = Version.parse(tf["cuda"])
    found = ", ".join(f"{m}.x" for m in sorted(have)) or "none"
    return [finding(
        "cuda-mismatch", "error", COMPONENT,
        f"{name} (version unknown): every release downloads a libtensorflow built for CUDA "
        f"{' or '.join(f'{m}.x' for m in majors)} (the newest, libtensorflow {lib}: CUDA "
        f"{cuda} / cuDNN {tf['cudnn']}), but the CUDA runtimes here are {found}: it fails with "
        f"'Could not load dynamic library libcudart.so.{cuda.major}.0' and runs on the CPU",
        fix=_fix(ctx, cuda, Version.parse(tf['cudnn'])), source=SOURCE, cuda_needed=str(cuda), cuda_majors_found=sorted(have))]


def _fix(ctx: Context, cuda: Version, cudnn: Version) -> str:
    if ctx.os_kind == "macos":
        return os_fixes.MACOS_NO_CUDA
    if ctx.os_kind == "windows":  # the DLLs are found through PATH
        return (f"{os_fixes.runtime_install(ctx, cuda)} and cuDNN {cudnn.trunc(2)} for CUDA "
                f"{cuda.major}.x (https://developer.nvidia.com/rdp/cudnn-archive), with both bin "
                "folders on PATH for the Node process")
    apt = APT.get(str(cuda.trunc(2)))
    if apt is None:
        return f"install the CUDA {cuda.trunc(2)} runtime libraries"
    lib = f"/usr/local/cuda-{cuda.trunc(2)}/lib64"
    return (f"`sudo apt-get install {apt[0]} {apt[1]}` (NVIDIA's CUDA and machine-learning apt "
            f"repositories; beside any newer CUDA), then `export LD_LIBRARY_PATH={lib}:"
            "$LD_LIBRARY_PATH` for the Node process")
