"""A CPU-only build that a plain install makes by default is never a pass.

Some packages decide whether CUDA is in when pip compiles them on this machine: llama-cpp-python
and pywhispercpp build llama.cpp / whisper.cpp with the CUDA backend only when a CMake flag is
passed (``CMAKE_ARGS="-DGGML_CUDA=on"``, ``GGML_CUDA=1``). A plain ``pip install -U`` rebuilds
them for the CPU only, even where the GPU was used before (llama-cpp-python#787: after an
upgrade the model loads with "BLAS = 0" and nothing goes to the GPU). Such a build says nothing
about what the user wants, unlike a torch ``+cpu`` wheel or a jax without a CUDA plugin, which
are chosen by name or index: so with no GPU, driver or CUDA package in the snapshot it is a
warning that says so conditionally, with the rebuild, and never a ✓. Where the snapshot shows
CUDA is meant to be used, rules_platform.cpu_only says it outright.
"""

from __future__ import annotations

from dnnctl.doctor import rules_platform
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding

# Packages whose CUDA support is a build-time choice that a plain pip install leaves off (the
# sources say how each is built; rules_ggml.py holds their rebuild commands).
BUILD_TIME_CUDA = frozenset({"llama-cpp-python", "pywhispercpp"})
ISSUE_SOURCE = (
    "abetlen/llama-cpp-python#787 ('No longer running on GPU after update': BLAS = 0 after a "
    "plain pip upgrade; fixed by reinstalling with CMAKE_ARGS=\"-DLLAMA_CUBLAS=on\" "
    "--force-reinstall --upgrade --no-cache-dir, confirmed by the reporter)")


def cpu_only(ctx: Context, component: str, what: str, *, why: str, fix: str | None,
             source: str | None) -> list[Finding]:
    """A CPU-only build of ``component``: outright where CUDA is evidently meant to be used,
    else, for a package whose default build is CPU-only, a conditional warning."""
    if component not in BUILD_TIME_CUDA or rules_platform.cuda_evidence(ctx):
        return rules_platform.cpu_only(ctx, component, what, why=why, fix=fix, source=source)
    cite = f"{source}; {ISSUE_SOURCE}" if source else ISSUE_SOURCE
    return [finding(
        "cuda-mismatch", "warning", component,
        f"{what} is a CPU-only build{why}, which is what a plain pip install or upgrade "
        "builds: if this machine has an NVIDIA GPU meant for it, it is not used (the "
        "snapshot names no GPU or driver, so this is not known)", fix=fix, source=cite,
        build="cpu", conditional=True)]
