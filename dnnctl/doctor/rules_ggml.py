"""Native ggml builds (llama-cpp-python, pywhispercpp): the GPU backend and its code.

These packages compile llama.cpp / whisper.cpp when installed. Without the CUDA backend
(``GGML_CUDA``, before mid-2024 ``LLAMA_CUDA`` / ``LLAMA_CUBLAS``) the build runs on the CPU
only, whatever the GPU (``n_gpu_layers`` does nothing); with it, the build carries code for
the ``CMAKE_CUDA_ARCHITECTURES`` it was compiled for, and a GPU outside them fails with 'no
kernel image is available'. Judged from ``frameworks.<package>``: ``cuda_build`` /
``backends`` and ``arch_list`` (CMake's form, ``86``, ``89-real``, ``90-virtual``, or
``sm_86`` / ``compute_90``).

A CUDA build is also judged against the CUDA toolkit (nvcc) here, which compiles it on every
(re)install: the llama.cpp maintainers test the CUDA backend's build from CUDA 11.7 on
(JohannesGaessler in ggml-org/llama.cpp#11112: 'The minimum version that we test the build
for is 11.7'); older toolkits have broken it again and again (CUB in sum.cu below 11.7,
ggml-org/llama.cpp#9562; CUDA 10.2 needing fixes in #4635, Dec 2023), and the default
architecture list of ggml/src/ggml-cuda/CMakeLists.txt includes 86-real ('needs CUDA v11.1').
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version
from dnnctl.doctor import fixcheck, os_fixes, rules_cpu_builds
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_extensions import toolkits
from dnnctl.doctor.rules_libraries import arch_findings
from dnnctl.doctor.rules_runtime import runtime_findings

LLAMA_SOURCE = (
    "abetlen/llama-cpp-python README.md at each tag (CUDA: `CMAKE_ARGS=\"-DLLAMA_CUBLAS=on\"` up "
    "to v0.2.59, `-DLLAMA_CUDA=on` v0.2.60-v0.2.81, `-DGGML_CUDA=on` from v0.2.82; 'To upgrade "
    "and rebuild llama-cpp-python add --upgrade --force-reinstall --no-cache-dir'); "
    "ggml-org/llama.cpp#8155 ('LLAMA_CUDA is deprecated ... Use GGML_CUDA instead' and a "
    "CPU-only build); instructlab/instructlab#3014 ('LLAMA_CUBLAS is deprecated' is a CMake "
    "error in current llama.cpp); its CHANGELOG.md (0.2.81: 'use LLAMA_CUDA instead of removed "
    "LLAMA_CUBLAS'; 0.2.85: 'Update Dockerfile build options from `LLAMA_` to `GGML_`')")
WHISPER_SOURCE = (
    "absadiki/pywhispercpp README.md ('Basic Pre-built CPU wheels are available on PYPI'; "
    "NVIDIA GPU support: `GGML_CUDA=1 pip install git+https://github.com/absadiki/pywhispercpp`)")
ARCH_SOURCE = (
    "https://cmake.org/cmake/help/latest/prop_tgt/CUDA_ARCHITECTURES.html (an entry builds "
    "SASS and PTX, '-real' SASS only, '-virtual' PTX only); llama-cpp-python "
    ".github/workflows/build-wheels-cuda.yaml (-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=...)")
TOOLKIT_SOURCE = (
    "JohannesGaessler in https://github.com/ggml-org/llama.cpp/issues/11112 ('The minimum "
    "version that we test the build for is 11.7'); ggml-org/llama.cpp#9562 ('CUDA: fix sum.cu "
    "compilation for CUDA < 11.7'), #4635 ('Fix new CUDA10 compilation errors'); "
    "ggml/src/ggml-cuda/CMakeLists.txt (default architectures: '86 == RTX 3000, needs CUDA "
    "v11.1'); m-from-space in abetlen/llama-cpp-python#1003 (nvcc 9.1 from Ubuntu's "
    "nvidia-cuda-toolkit: 'a pretty outdated CUDA toolkit', fixed by CUDA 12)")
TESTED_TOOLKIT = Version.parse("11.7")
LLAMA_FLAGS = ((Version.parse("0.2.60"), "LLAMA_CUBLAS"), (Version.parse("0.2.82"), "LLAMA_CUDA"))


@dataclass(frozen=True)
class Binding:
    """A ggml binding: how it is rebuilt with CUDA, and how to ask it."""

    package: str
    check: str
    source: str


BINDINGS = (
    Binding("llama-cpp-python", "python -c \"import llama_cpp; "
            "print(llama_cpp.llama_supports_gpu_offload())\"", LLAMA_SOURCE),
    Binding("pywhispercpp", "pip show -f pywhispercpp (a CUDA build links libggml-cuda)",
            WHISPER_SOURCE),
)


def check(ctx: Context) -> list[Finding]:
    packages = ctx.packages
    out: list[Finding] = []
    for b in BINDINGS:
        info = (ctx.env.frameworks or {}).get(b.package)
        if info is None and b.package not in packages:
            continue
        info = dict(info or {})
        info.setdefault("version", packages.get(b.package) or None)
        out += _one(ctx, b, info)
    return out


def _one(ctx: Context, b: Binding, info: dict[str, Any]) -> list[Finding]:
    text = str(info.get("version") or "")
    what = f"{b.package} {text or '(version unknown)'}"
    backends = [str(x).lower() for x in info.get("backends") or []]
    cuda_build = info.get("cuda_build")
    if cuda_build is None and (backends or info.get("arch_list")):
        cuda_build = "cuda" in backends or bool(info.get("arch_list"))
    if cuda_build is None:
        return [finding("not-judged", "info", b.package, f"{what}: whether it was built with "
                        "the CUDA backend is not known (a plain pip install builds it for the "
                        "CPU only); not judged", fix=f"check with {b.check}, and name it "
                        f"(frameworks.{b.package}.cuda_build)", source=b.source)]
    if cuda_build is False:
        why = " (built without the CUDA backend" + (
            f"; backends: {', '.join(backends)}" if backends else "") + ")"
        return rules_cpu_builds.cpu_only(ctx, b.package, what, why=why,
                                         fix=_rebuild(b, text), source=b.source)
    out: list[Finding] = _toolkit(ctx, b, what, text)
    targets = _targets(info.get("arch_list") or [])
    if targets:
        found, ptx_only = arch_findings(ctx, b.package, what, Row(), targets,
                                        _rebuild(b, text, ctx), source=ARCH_SOURCE)
        out += found
    cuda = Version.maybe(info.get("cuda"))
    if cuda is not None:
        out += runtime_findings(ctx, b.package, cuda, what=what, jit=False)
    if not [f for f in out if f.code != "cuda-mismatch" or f.component != b.package]:
        code_for = " ".join(targets) if targets else "an arch list not given"
        out.append(finding("ok" if targets else "not-judged", "info", b.package,
                           f"{what}: a CUDA build ({code_for})"
                           + ("" if targets else "; which GPUs it has code for was not judged"),
                           source=ARCH_SOURCE if targets else b.source))
    return out


def _targets(entries: list[str]) -> list[str]:
    """CMake CUDA_ARCHITECTURES entries as targets: 86 -> sm_86 + compute_86, 89-real -> sm_89,
    90-virtual -> compute_90; sm_XY / compute_XY stay."""
    out: list[str] = []
    for entry in entries:
        for part in re.split(r"[;,\s]+", str(entry).strip().lower()):
            m = re.fullmatch(r"(\d{2,3}[af]?)(-real|-virtual)?", part)
            if m:
                if m.group(2) != "-virtual":
                    out.append(f"sm_{m.group(1)}")
                if m.group(2) != "-real":
                    out.append(f"compute_{m.group(1)}")
            elif re.fullmatch(r"(sm|compute)_\d+[af]?", part):
                out.append(part)
    return out


def _rebuild(b: Binding, version: str, ctx: Context | None = None) -> str:
    """Reinstall with the CUDA backend (the flag this version's README names), for the GPUs
    here when an arch list is the problem."""
    arch = ""
    if ctx is not None and ctx.known_ccs:
        arch = " -DCMAKE_CUDA_ARCHITECTURES=" + ";".join(
            f"{g.cc.major}{g.cc.minor}" for g in ctx.known_ccs)
    ver = Version.maybe(version)
    if b.package == "llama-cpp-python":
        flag = next((f for upto, f in LLAMA_FLAGS if ver is not None and ver < upto), "GGML_CUDA")
        pin = f"=={version}" if ver is not None else ""
        return (f"`CMAKE_ARGS=\"-D{flag}=on{arch}\" pip install --upgrade --force-reinstall "
                f"--no-cache-dir llama-cpp-python{pin}`")
    return ("`GGML_CUDA=1 pip install --force-reinstall --no-cache-dir "
            "git+https://github.com/absadiki/pywhispercpp`"
            + (f" (its CMake build with{arch})" if arch else ""))


def _toolkit(ctx: Context, b: Binding, what: str, version: str) -> list[Finding]:
    """The nvcc that (re)builds the CUDA backend: older than the oldest toolkit the llama.cpp
    maintainers test with is a warning, with a toolkit that is and the rebuild pointed at it."""
    kits = toolkits(ctx)
    old = [(rt, v) for rt, v in kits if v.trunc(2) < TESTED_TOOLKIT]
    good = sorted((v, rt) for rt, v in kits if v.trunc(2) >= TESTED_TOOLKIT)
    first = next(((rt, v) for rt, v in kits if rt.nvcc), None)
    if not old or (good and (first is None or first[1].trunc(2) >= TESTED_TOOLKIT)):
        return []
    rt, v = min(old, key=lambda x: x[1])
    if good:
        use = good[-1][0].trunc(2)
        fix = ""
    else:
        use = _toolkit_release(ctx)
        fix = f"{os_fixes.toolkit_install(ctx, use)}, then " if use is not None else ""
    if use is None:
        return [finding("cuda-mismatch", "warning", b.package, _message(what, rt, v),
                        fix="install a CUDA toolkit >= 11.7 and rebuild with its nvcc",
                        source=TOOLKIT_SOURCE, toolkit=v, tested_from=TESTED_TOOLKIT)]
    fix += (f"`{os_fixes.set_env(ctx, 'CUDACXX', os_fixes.toolkit_nvcc(ctx, use))}`, then "
            + _exports(ctx, _rebuild(b, version, ctx)))
    return [finding("cuda-mismatch", "warning", b.package, _message(what, rt, v), fix=fix,
                    source=TOOLKIT_SOURCE, toolkit=v, tested_from=TESTED_TOOLKIT)]


def _exports(ctx: Context, rebuild: str) -> str:
    """`A=1 B="x" pip install ...` as separate command lines: `export A=1`, ..., `pip ...`
    (PowerShell's `$env:A="1"` on Windows)."""
    m = re.fullmatch(r"`((?:\w+=(?:\"[^\"]*\"|\S+) )+)(pip [^`]*)`(.*)", rebuild)
    if m is None:
        return rebuild
    sets = re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", m.group(1))
    return ", then ".join([f"`{os_fixes.set_env(ctx, k, v)}`" for k, v in sets]
                          + [f"`{m.group(2)}`"]) + m.group(3)


def _message(what: str, rt: Any, v: Version) -> str:
    return (f"{what}: its CUDA backend is compiled by the CUDA {v} toolkit here ({rt.source}), "
            f"older than {TESTED_TOOLKIT}, the oldest toolkit llama.cpp's CUDA build is tested "
            "with: the build fails (or a reinstall will)")


def _toolkit_release(ctx: Context) -> Version | None:
    """The newest toolkit >= 11.7 that runs on this driver and targets every GPU here; with
    no GPU known, CUDA 12 at most (CUDA 13 no longer targets GPUs below compute capability
    7.5: compat/cuda.yaml)."""
    top = None if ctx.known_ccs else Version.parse("13.0")
    fits = sorted(v for r in ctx.matrix.rows("cuda_releases") if not r.uncertain
                  and (v := Version.parse(r["version"]).trunc(2)) >= TESTED_TOOLKIT
                  and (top is None or v < top)
                  and all(str(g.cc) in r["targets"] for g in ctx.known_ccs)
                  and fixcheck.driver_problem(ctx, v) is None)
    return fits[-1] if fits else None
