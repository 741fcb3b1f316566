"""A TensorFlow with a local version tag (``1.15.5+nv22.12``, ``1.13.1+nv``): a custom build.

PEP 440 local tags are never on PyPI's official tensorflow wheels; NVIDIA's container and
nvidia-tensorflow builds carry ``+nvYY.MM``, and community or source builds their own. Such a
build has its own CUDA, cuDNN and GPU architectures, so the release's tested configuration
(and its official binaries' compute-capability floor) is not applied: what the snapshot says
of the build is judged, and what it does not say is not judged, naming how to read it.
"""

from __future__ import annotations

from typing import Any

from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_libraries import explicit_build

BUILD_INFO = ("`python -c \"import tensorflow as tf; print(tf.sysconfig.get_build_info())\"` "
              "(cuda_version, cudnn_version, cuda_compute_capabilities; TensorFlow 2.3+; "
              "older builds: the CUDA and cuDNN libraries it opens at import, and its "
              "'minimum required Cuda capability' message)")

CUSTOM_SOURCE = (
    "https://www.tensorflow.org/install/source#gpu (the tested build configurations are those "
    "of the official tensorflow / tensorflow-gpu releases, e.g. tensorflow_gpu-1.13.1: cuDNN "
    "7.4, CUDA 10.0); https://docs.nvidia.com/deeplearning/frameworks/tensorflow-release-notes/ "
    "(NVIDIA's TensorFlow containers build TensorFlow themselves against the container's own "
    "CUDA and cuDNN, versioned e.g. 1.15.5+nv22.12); https://peps.python.org/pep-0440/#local-"
    "version-identifiers (local versions are not allowed on public indexes such as PyPI); "
    "https://www.tensorflow.org/api_docs/python/tf/sysconfig/get_build_info")


def local_tag(info: dict[str, Any]) -> str | None:
    """The local version tag of a TensorFlow (``nv22.12`` of ``1.15.5+nv22.12``), if any."""
    text = str(info.get("local_tag") or "")
    if not text and "+" in str(info.get("version") or ""):
        text = str(info["version"]).split("+", 1)[1]
    return text.strip().lower() or None


def check(ctx: Context, what: str, info: dict[str, Any], local: str) -> list[Finding]:
    """A custom build: its own CUDA / cuDNN / arch list judged, the rest said not judged."""
    reason = (f"a custom build (local version tag +{local}: NVIDIA's container build, or a "
              "community or source build), not the PyPI release, so the release's tested "
              "CUDA/cuDNN and its binaries' GPU floor do not apply")
    out = explicit_build(ctx, "tensorflow", what, info, reason, note="not-judged")
    for f in out:
        if f.code == "not-judged":
            f.source = CUSTOM_SOURCE
            f.fix = f"read the build's own configuration: {BUILD_INFO}"
    if not out:
        out.append(finding("not-judged", "info", "tensorflow", f"{what}: {reason}; the "
                           "snapshot gives neither its CUDA, cuDNN nor GPU architectures, so "
                           "it was not judged", fix=f"read the build's own configuration: "
                           f"{BUILD_INFO}", source=CUSTOM_SOURCE))
    elif not info.get("arch_list") and ctx.known_ccs:
        sms = ", ".join(f"sm_{g.cc.major}{g.cc.minor}" for g in ctx.known_ccs)
        out.append(finding("not-judged", "info", "tensorflow", f"{what}: the GPU "
                           f"architectures of this build are not in the snapshot, so whether "
                           f"it has code for {sms} was not judged",
                           fix=f"read them: {BUILD_INFO}; give them as arch_list",
                           source=CUSTOM_SOURCE))
    return out
