"""Frameworks and GPU-related pip packages, read from installed metadata without importing.

Importing torch takes seconds and may itself crash on a broken stack, so plain ``doctor``
reads ``*.dist-info`` folders, ``torch/version.py`` and TensorFlow's ``build_info.py`` as text
(parsed with ``ast``, never executed). ``--deep`` (dnnctl.doctor.deep) asks the frameworks.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dnnctl.doctor import parse, requirements
from dnnctl.doctor.host import Dist, Host
from dnnctl.doctor.parse import jaxlib_tag

_EXACT = {
    "torch", "torchvision", "torchaudio", "triton", "pytorch-triton", "jax", "jaxlib",
    "tensorflow", "tensorflow-gpu", "tensorflow-cpu", "tensorflow-intel", "tf-nightly",
    "tf-nightly-gpu", "tensorrt", "onnxruntime-gpu", "cupy", "cuda-python", "cuda-bindings",
    "cuda-core", "cuda-toolkit", "cuda-pathfinder", "pynvml", "xformers", "flash-attn",
    "bitsandbytes", "numba-cuda", "paddlepaddle-gpu", "vllm", "deepspeed", "dnnctl",
    "ctranslate2", "faster-whisper", "whisperx", "llama-cpp-python", "pywhispercpp",
}
_PREFIXES = ("nvidia-", "cupy-cuda", "cupy-rocm", "jax-cuda", "jax-rocm", "tensorrt-cu",
             "torch-tensorrt", "mxnet-cu")
TF_NAMES = ("tensorflow", "tensorflow-gpu", "tensorflow-cpu", "tensorflow-intel", "tf-nightly",
            "tf-nightly-gpu")


def relevant(name: str) -> bool:
    """Is this distribution part of the GPU stack doctor reports on?"""
    return name in _EXACT or name.startswith(_PREFIXES)


def _read(dist: Dist, rel: str) -> str | None:
    try:
        return (dist.location / rel).read_text(errors="replace")
    except OSError:
        return None


def _installer(dist: Dist) -> str | None:
    text = dist.read_text("INSTALLER")
    return text.strip() or None if text else None


def torch_info(dist: Dist) -> dict[str, Any]:
    """torch: version (+ local tag as torch reports it), CUDA from torch/version.py, cuDNN pin."""
    info: dict[str, Any] = {"version": dist.version, "source": "metadata",
                            "path": str(dist.location / "torch")}
    installer = _installer(dist)
    if installer:
        info["installer"] = installer
    fields = parse.py_assignments(_read(dist, "torch/version.py"))
    reported = fields.get("__version__")
    # PyPI's default wheel says "2.11.0" in METADATA but "2.11.0+cu130" in torch/version.py
    if isinstance(reported, str) and reported.split("+")[0] == dist.version.split("+")[0]:
        info["version"] = reported
    tag = parse.local_tag(info["version"])
    if tag:
        info["local_tag"] = tag
    cuda = fields.get("cuda") if "cuda" in fields else parse.cuda_from_tag(tag)
    if isinstance(cuda, str) and parse.version_tuple(cuda):
        info["cuda"] = cuda
    elif "cuda" in fields and fields["cuda"] is None:
        info["cuda_build"] = False  # a CPU or ROCm build: known, not merely unknown
    for key in ("hip", "rocm", "xpu"):
        if isinstance(fields.get(key), str):
            info[key] = fields[key]
    pins = parse.requirement_pins(dist.requires())
    for name in ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11"):
        if name in pins:
            info["cudnn"] = pins[name]
            info["cudnn_package"] = name
            break
    return info


def tensorflow_info(dists: dict[str, Dist]) -> dict[str, Any] | None:
    present = [n for n in TF_NAMES if n in dists]
    if not present:
        return None
    dist = dists[present[0]]
    info: dict[str, Any] = {"version": dist.version, "package": dist.name, "source": "metadata"}
    if len(present) > 1:
        info["packages"] = present
    build = parse.tf_build_info(_read(dist, "tensorflow/python/platform/build_info.py"))
    cuda = parse.tf_version_field(build.get("cuda_version"))
    cudnn = parse.tf_version_field(build.get("cudnn_version"))
    if cuda:
        info["cuda"] = cuda
    if cudnn:
        info["cudnn"] = cudnn
    archs = build.get("cuda_compute_capabilities")
    if isinstance(archs, list) and all(isinstance(a, str) for a in archs):
        info["arch_list"] = archs
    if build.get("is_cuda_build") is False:
        info.pop("cuda", None)
        info["cuda_build"] = False
    return info


def jax_info(dists: dict[str, Dist]) -> dict[str, Any] | None:
    jax, jaxlib = dists.get("jax"), dists.get("jaxlib")
    if not jax and not jaxlib:
        return None
    info: dict[str, Any] = {"source": "metadata"}
    if jax:
        info["version"] = jax.version
    if jaxlib:
        info["jaxlib"] = jaxlib.version
        cuda, cudnn = jaxlib_tag(jaxlib.version)
        if cuda:
            info["cuda"] = cuda
        if cudnn:  # what the build was compiled with (its minimum), not the copy that loads
            info["cudnn"] = cudnn
    plugins = sorted(n for n in dists if re.fullmatch(r"jax-(cuda|rocm)\d+-plugin", n))
    if plugins:
        info["plugin"] = plugins[0]
        info["plugin_version"] = dists[plugins[0]].version
        m = re.fullmatch(r"jax-cuda(\d+)-plugin", plugins[0])
        if m:
            info["cuda"] = m.group(1)
        if len(plugins) > 1:
            info["plugins"] = plugins
    return info


def _cupy_cuda(dist: Dist) -> str | None:
    """The CUDA a CuPy wheel targets: .data/_wheel.json, else the package name."""
    text = _read(dist, "cupy/.data/_wheel.json")
    if text:
        try:
            cuda = json.loads(text).get("cuda")
        except (ValueError, AttributeError):
            cuda = None
        if isinstance(cuda, str) and parse.version_tuple(cuda):
            return cuda.removesuffix(".x")
    m = re.fullmatch(r"cupy-cuda(\d+)x", dist.name)
    if m:
        return m.group(1)
    m = re.fullmatch(r"cupy-cuda(\d+)(\d)", dist.name)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def cupy_info(dists: dict[str, Dist]) -> dict[str, Any] | None:
    names = sorted(n for n in dists if n == "cupy" or n.startswith(("cupy-cuda", "cupy-rocm")))
    if not names:
        return None

    def installed_at(n: str) -> float:
        try:
            return dists[n].info_dir.stat().st_mtime
        except OSError:
            return 0.0

    # Every cupy-* wheel writes the same cupy/ folder: the last one installed owns the files.
    active = max(names, key=installed_at)
    info: dict[str, Any] = {"version": dists[active].version, "package": active,
                            "packages": names, "source": "metadata"}
    cuda = _cupy_cuda(dists[active])
    if cuda:
        info["cuda"] = cuda
    return info


def onnxruntime_info(dists: dict[str, Dist]) -> dict[str, Any] | None:
    """onnxruntime-gpu: its version and, where the wheel records it (1.21 on), the CUDA of its
    build (onnxruntime/capi/build_and_package_info.py ``cuda_version``)."""
    dist = dists.get("onnxruntime-gpu")
    if dist is None:
        return None
    info: dict[str, Any] = {"version": dist.version, "package": dist.name, "source": "metadata"}
    fields = parse.py_assignments(_read(dist, "onnxruntime/capi/build_and_package_info.py"))
    cuda = fields.get("cuda_version")
    if isinstance(cuda, str) and parse.version_tuple(cuda):
        info["cuda"] = cuda
    return info


def xformers_info(dists: dict[str, Dist]) -> dict[str, Any] | None:
    """xformers: the torch it was built for, from xformers/cpp_lib.json (``version.torch``,
    ``version.cuda`` as nvcc's major*100+minor), else the wheel's ``torch==X`` pin."""
    dist = dists.get("xformers")
    if dist is None:
        return None
    info: dict[str, Any] = {"version": dist.version, "source": "metadata"}
    try:
        meta = json.loads(_read(dist, "xformers/cpp_lib.json") or "null")
    except ValueError:
        meta = None
    build = meta.get("version") if isinstance(meta, dict) else None
    build = build if isinstance(build, dict) else {}
    torch = build.get("torch")
    if isinstance(torch, str) and parse.version_tuple(torch):
        info["torch"] = torch
    elif "torch" in (pins := parse.requirement_pins(dist.requires())):
        info["torch"] = pins["torch"]
    cuda = build.get("cuda")
    if isinstance(cuda, int) and not isinstance(cuda, bool) and 100 <= cuda < 10000:
        info["cuda"] = f"{cuda // 100}.{cuda % 100}"
    if isinstance(build.get("python"), str):
        info["python"] = build["python"]
    return info


def probe_python(host: Host) -> tuple[dict[str, dict[str, Any]], dict[str, str],
                                      dict[str, Dist], list[str]]:
    """(frameworks, packages, the distributions found, notes)."""
    dists, notes = host.distributions(relevant)
    frameworks: dict[str, dict[str, Any]] = {}
    if "torch" in dists:
        frameworks["torch"] = torch_info(dists["torch"])
    for name, fn in (("tensorflow", tensorflow_info), ("jax", jax_info), ("cupy", cupy_info),
                     ("onnxruntime", onnxruntime_info), ("xformers", xformers_info)):
        info = fn(dists)
        if info:
            frameworks[name] = info
    packages = {name: d.version for name, d in sorted(dists.items())}
    return frameworks, packages, dists, notes


def requires_of(dists: dict[str, Dist]) -> dict[str, list[str]]:
    """Each listed distribution's requirements on watched GPU stack projects whose markers
    hold for this interpreter (requirements.kept), by distribution name."""
    out = {}
    for name, dist in sorted(dists.items()):
        lines = requirements.kept(dist.requires())
        if lines:
            out[name] = lines
    return out
