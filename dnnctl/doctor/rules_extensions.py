"""Building CUDA extensions against torch (xformers, flash-attn, apex, a project's own ops).

torch's extension builder (torch.utils.cpp_extension) compiles with the toolkit it finds
(``CUDA_HOME`` / ``CUDA_PATH``, else the ``nvcc`` on ``PATH``, else /usr/local/cuda) and
compares that nvcc's CUDA with the CUDA torch was built with: a different major raises
"The detected CUDA version (X) mismatches the version that was used to compile PyTorch (Y)",
a different minor only warns. Prebuilt wheels are not affected: this matters when something is
built here, so it is a warning (a minor difference an info).

DeepSpeed builds its CUDA ops at first use (``OpBuilder.jit_load``) with the nvcc of torch's
``CUDA_HOME`` and checks it first (``assert_no_cuda_mismatch``): a different major always
fails unless ``DS_SKIP_CUDA_CHECK=1``; a different minor passes only when both are in its
list of compatible minors. A toolkit is a ``cuda_runtimes`` entry whose source is
``nvcc:<path>`` or ``system:<toolkit dir>`` (README, the snapshot's fields).

A toolkit that cannot compile for a GPU here (rules_driver) is replaced, beside a CUDA torch,
by the lowest toolkit of torch's CUDA major that targets it (``toolkit_fix_for_torch``, with
the driver it needs when the driver is older or unknown), else by PTX of an older architecture
through ``TORCH_CUDA_ARCH_LIST``; with torch's CUDA unknown, one answer per CUDA major of
its line's builds.
"""

from __future__ import annotations

from dnnctl.compat.drivers import driver_need, with_gpu
from dnnctl.compat.suggest import TORCH_INDEX, python_fits
from dnnctl.compat.versions import CC, Version
from dnnctl.doctor import fixcheck, os_fixes
from dnnctl.doctor.context import Context, GpuInfo, finding
from dnnctl.doctor.model import Component, Finding
from dnnctl.doctor.stack import torch_info, torch_stack, torch_version

CPP_EXTENSION_SOURCE = (
    "torch/utils/cpp_extension.py _check_cuda_version ('if cuda_ver.major != "
    "torch_cuda_version.major: raise RuntimeError(CUDA_MISMATCH_MESSAGE ...)', otherwise "
    "logger.warning(CUDA_MISMATCH_WARN): 'has a minor version mismatch ... Most likely this "
    "shouldn't be a problem') and _find_cuda_home (CUDA_HOME / CUDA_PATH, then nvcc on PATH, "
    "then /usr/local/cuda), read in the torch 2.13 wheel; danthe3rd in "
    "facebookresearch/xformers#748 (nvcc 12.1 with torch 2.0.0+cu118: 'You'll need to use nvcc "
    "version 11.8. However we provide (already pre-compiled) binaries')")

APEX_SOURCE = (
    "NVIDIA/apex#323 (merged 2019-05, 'Hard error on mismatch between torch.version.cuda and the "
    "Cuda toolkit version being used to compile Apex': setup.py "
    "check_cuda_torch_binary_vs_bare_metal raises when bare_metal_major != torch_binary_major "
    "or bare_metal_minor != torch_binary_minor); the check still raised in 2023-12 "
    "(NVIDIA/apex#1761: torch 2.1.2+cu121, nvcc 11.5); option PRs to skip it closed (#967, #997: 'these "
    "version mismatches are not tested internally')")

DEEPSPEED_SOURCE = (
    "microsoft/DeepSpeed op_builder/builder.py assert_no_cuda_mismatch (read at 38327e0, "
    "2025-02): the nvcc of torch's CUDA_HOME against torch.version.cuda; another major.minor "
    "raises 'Installed CUDA version X does not match the version torch was compiled with Y, "
    "unable to compile cuda/cpp extensions without a matching cuda version' unless both "
    "minors are in cuda_minor_mismatch_ok of that major (since v0.4.0, #1139; 12.x from "
    "v0.9.3) or DS_SKIP_CUDA_CHECK=1 (v0.9.3, #3436); CUDA ops are built at first use "
    "(OpBuilder.jit_load); deepspeedai/DeepSpeed-MII#277 (mrwyattii: 'we do not support "
    "mismatched CUDA versions', torch from the cu118 index for a CUDA 11.7 system)")
# DeepSpeed's cuda_minor_mismatch_ok at 38327e0 (2025-02): within a major, a toolkit and a
# torch CUDA both listed here pass its check; 12.x was 12.0-12.1 in v0.9.3, 12.0-12.3 in v0.12.1.
DEEPSPEED_MINORS_OK = {10: ("10.0", "10.1", "10.2"),
                       11: tuple(f"11.{m}" for m in range(9)),
                       12: ("12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8")}


def toolkits(ctx: Context) -> list[tuple[Component, Version]]:
    """CUDA toolkits with an nvcc: toolkit folders (``system:<dir>``) and nvcc on PATH; not the
    libcudart copies of the ld cache, pip's runtime wheels or conda's cudart."""
    out = []
    for rt in ctx.env.cuda_runtimes:
        if not rt.toolkit or "compat" in f"{rt.source} {rt.path or ''}".lower():
            continue
        v = Version.maybe(rt.version)
        if v is not None:
            out.append((rt, v))
    return out


def check(ctx: Context) -> list[Finding]:
    """The toolkits here against the CUDA torch was built with."""
    torch_cuda, _ = torch_stack(ctx)
    found = toolkits(ctx)
    if torch_cuda is None or not found:
        return []
    same = [(c, v) for c, v in found if v.major == torch_cuda.major]
    other = [(c, v) for c, v in found if v.major != torch_cuda.major]
    where = ", ".join(f"{v} ({c.source})" for c, v in other)
    names = set(ctx.packages)
    if "deepspeed" in names and len(found) == 1:
        judged = _deepspeed(ctx, found[0], torch_cuda)
        if judged is not None:
            return judged
    if other and not same:
        cuda = other[0][1]
        return [finding(
            "cuda-mismatch", "warning", "cuda",
            f"the CUDA toolkit here, {where}, has another major than torch's CUDA "
            f"{torch_cuda}: building a CUDA extension against this torch (xformers, "
            "flash-attn, apex, a project's own ops) fails with 'The detected CUDA version "
            f"({cuda.trunc(2)}) mismatches the version that was used to compile PyTorch "
            f"({torch_cuda.trunc(2)})'; prebuilt wheels are not affected",
            fix=f"install the CUDA {torch_cuda.trunc(2)} toolkit and point CUDA_HOME at it, "
            f"or install a torch built for CUDA {cuda.major}.x, or use the extension's "
            "prebuilt wheel", source=CPP_EXTENSION_SOURCE, toolkit=str(cuda),
            torch_cuda=str(torch_cuda))]
    if other:  # both majors installed: which one is used depends on CUDA_HOME / PATH
        return [finding(
            "cuda-mismatch", "info", "cuda",
            f"CUDA toolkits of two majors are installed ({where}; and "
            + ", ".join(f"{v} ({c.source})" for c, v in same) + f"): extensions built "
            f"against torch (CUDA {torch_cuda}) must use the CUDA {torch_cuda.major}.x one "
            "(CUDA_HOME, else the nvcc on PATH)", source=CPP_EXTENSION_SOURCE,
            torch_cuda=str(torch_cuda))]
    minor = [(c, v) for c, v in same if v.trunc(2) != torch_cuda.trunc(2)]
    if minor and len(minor) == len(same):
        c, v = minor[0]
        if "apex" in names:  # apex's own setup.py check is stricter than torch's
            return [finding(
                "cuda-mismatch", "warning", "apex",
                f"the CUDA {v} toolkit ({c.source}) differs from torch's CUDA {torch_cuda} in "
                "the minor, and apex's setup.py (--cuda_ext) requires the same major.minor: "
                "'Cuda extensions are being compiled with a version of Cuda that does not "
                "match the version used to compile Pytorch binaries'",
                fix=f"install the CUDA {torch_cuda.trunc(2)} toolkit and point CUDA_HOME at "
                f"it, or a torch built for CUDA {v.trunc(2)}", source=APEX_SOURCE,
                toolkit=str(v), torch_cuda=str(torch_cuda))]
        return [finding(
            "cuda-mismatch", "info", "cuda",
            f"the CUDA {v} toolkit ({c.source}) differs from torch's CUDA {torch_cuda} in the "
            "minor only: extensions build, with torch's warning 'has a minor version mismatch "
            "... Most likely this shouldn't be a problem'", source=CPP_EXTENSION_SOURCE,
            toolkit=str(v), torch_cuda=str(torch_cuda))]
    return []


def _deepspeed(ctx: Context, toolkit: tuple[Component, Version], torch_cuda: Version
               ) -> list[Finding] | None:
    """DeepSpeed's own check of the one toolkit here against torch's CUDA: a warning where it
    refuses (ops already built with DS_BUILD_OPS=1 are not affected), an info where it
    accepts a minor difference, None where the versions are the same."""
    c, v = toolkit
    have = str(v.trunc(2))
    if have == str(torch_cuda.trunc(2)):
        return None
    if _deepspeed_accepts(v, torch_cuda):
        return [finding(
            "cuda-mismatch", "info", "deepspeed",
            f"the CUDA {v} toolkit ({c.source}) differs from torch's CUDA {torch_cuda} in the "
            "minor, which DeepSpeed's op builder accepts ('since the APIs are compatible, "
            "accepting this combination')", source=DEEPSPEED_SOURCE, toolkit=str(v),
            torch_cuda=str(torch_cuda))]
    kind = "major" if v.major != torch_cuda.major else "minor (not in its list of compatible ones)"
    return [finding(
        "cuda-mismatch", "warning", "deepspeed",
        f"the CUDA {v} toolkit ({c.source}) has another {kind} than torch's CUDA "
        f"{torch_cuda}: DeepSpeed builds its CUDA ops at first use with this nvcc and refuses "
        f"('Installed CUDA version {have} does not match the version torch was compiled with "
        f"{torch_cuda}'); DS_SKIP_CUDA_CHECK=1 skips the check at the risk of broken ops",
        fix=_deepspeed_fix(ctx, v, torch_cuda), source=DEEPSPEED_SOURCE, toolkit=str(v),
        torch_cuda=str(torch_cuda))]


def _deepspeed_fix(ctx: Context, toolkit: Version, torch_cuda: Version) -> str:
    """A torch built for a CUDA that DeepSpeed accepts with this toolkit (of the torch line
    here if it has one, else of the newest line that does), or the toolkit of torch's CUDA."""
    other = f"install the CUDA {torch_cuda.trunc(2)} toolkit and point CUDA_HOME at it"
    tv = torch_version(ctx)
    line = Version.parse(tv[0].line).trunc(2) if tv else None
    rows = [r for r in ctx.matrix.current("torch")
            if _deepspeed_accepts(toolkit, Version.parse(r["cuda"]))
            and python_fits(r, ctx.python)
            and (line is None or Version.parse(r["torch"]).trunc(2) == line)]
    if not rows:
        return other
    best = max(rows, key=lambda r: (Version.parse(r["torch"]).trunc(2), Version.parse(r["cuda"])))
    # uninstall first: pip keeps an installed 2.x.y+cu121 for 'torch==2.x.*' from another index
    return (f"a torch built for CUDA {best['cuda']}: `pip uninstall -y torch` then `pip install "
            f"'torch=={best['torch']}.*' -i {TORCH_INDEX.format(variant=best['variant'])}`"
            f", or {other}")


def _deepspeed_accepts(toolkit: Version, torch_cuda: Version) -> bool:
    """assert_no_cuda_mismatch: the same major.minor, or both in its compatible minors."""
    have, want = str(toolkit.trunc(2)), str(torch_cuda.trunc(2))
    return have == want or (toolkit.major == torch_cuda.major and {have, want}
                            <= set(DEEPSPEED_MINORS_OK.get(toolkit.major, ())))


def toolkit_fix_for_torch(ctx: Context, gpu: GpuInfo, have: Version | None) -> str | None:
    """The toolkit to build torch extensions for ``gpu`` when the one here (``have``) cannot:
    torch's extension builder refuses a toolkit of another major than torch's CUDA
    (``_check_cuda_version``), so the lowest toolkit of that major that targets the GPU (with
    the driver it needs), else PTX of an older architecture through TORCH_CUDA_ARCH_LIST.
    None when no CUDA torch is here (the toolkit is not judged against torch)."""
    info = torch_info(ctx, packages=True)
    if info is None or info.get("cuda_build") is False:
        return None
    torch_cuda, _ = torch_stack(ctx, packages=True)
    majors = [torch_cuda.major] if torch_cuda is not None else _torch_majors(ctx)
    if not majors:
        return None
    sm = f"sm_{gpu.cc.major}{gpu.cc.minor}"
    if len(majors) == 1:
        return (f"torch's extension builder refuses a toolkit whose major differs from "
                f"torch's CUDA {torch_cuda or f'{majors[0]}.x'}, so "
                + _for_major(ctx, gpu, majors[0], have, sm, command=True))
    order = sorted(majors, key=lambda m: (have is None or m != have.major, -m))
    parts = [f"a CUDA {m}.x torch: " + _for_major(ctx, gpu, m, have, sm, command=i == 0)
             for i, m in enumerate(order)]
    return ("keep torch's CUDA major (torch's extension builder refuses another; `python -c "
            "\"import torch; print(torch.version.cuda)\"` names it): for " + "; for ".join(parts))


def _torch_majors(ctx: Context) -> list[int]:
    """The CUDA majors of the torch line's builds in the matrix, for a torch whose CUDA is
    not known."""
    found = torch_version(ctx)
    if found is None:
        return []
    line = found[0].line
    return sorted({v.major for r in ctx.matrix.rows("torch") if str(r["torch"]) == line
                   and (v := Version.maybe(r.get("cuda"))) is not None})


def _for_major(ctx: Context, gpu: GpuInfo, major: int, have: Version | None, sm: str, *,
               command: bool) -> str:
    """The lowest CUDA ``major``.x toolkit that compiles for ``gpu`` (and the driver it needs),
    or PTX of an older architecture; ``command``: with the install command."""
    rels = sorted(v for r in ctx.matrix.rows("cuda_releases") if not r.uncertain
                  and (v := Version.parse(r["version"]).trunc(2)).major == major)
    fits = [v for v in rels if str(gpu.cc) in (ctx.matrix.cuda_release(v) or {}).get(
        "targets", [])]
    ptx = _arch_list(ctx, gpu, have if have is not None and have.major == major
                     else (rels[-1] if rels else None))
    alt = (f"`{os_fixes.set_env(ctx, 'TORCH_CUDA_ARCH_LIST', chr(34) + ptx + chr(34))}` "
           f"before the build (PTX of an older architecture, compiled for {sm} when loaded)"
           if ptx else None)
    if not fits:
        return (f"no CUDA {major}.x toolkit compiles for {sm}: " + (alt + ", or " if alt else "")
                + "a torch built with a CUDA that does")
    pick = fits[0]
    need = fixcheck.driver_problem(ctx, pick)
    if need:
        driver = f", with a newer driver ({need})"
    elif ctx.driver is None:
        floor = with_gpu(driver_need(ctx.matrix, pick, windows=ctx.windows), gpu.arch,
                         matrix=ctx.matrix, windows=ctx.windows).minimum
        driver = f" (it needs driver >= {floor}; the driver here is not known)" if floor else ""
    else:
        driver = ""
    how = f": {os_fixes.toolkit_install(ctx, pick)}" if command else ""
    return (f"the lowest CUDA {major}.x toolkit that compiles for {sm} is {pick}{driver}{how}"
            + (f"; or with the toolkit here, {alt}" if alt and have is not None
               and have.major == major else ""))


def _arch_list(ctx: Context, gpu: GpuInfo, toolkit: Version | None) -> str | None:
    """``X.Y+PTX`` for the newest architecture of the GPU's family or older that ``toolkit``
    targets (PTX runs on newer GPUs), None when it targets none."""
    rel = ctx.matrix.cuda_release(toolkit) if toolkit is not None else None
    older = sorted((c for t in (rel or {}).get("targets", [])
                    if (c := CC.maybe(str(t))) is not None and c <= gpu.cc),
                   key=lambda c: (c.major, c.minor))
    return f"{older[-1]}+PTX" if older else None
