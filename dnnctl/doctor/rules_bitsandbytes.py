"""bitsandbytes: the native library it loads for torch's CUDA, and how old releases find the
CUDA runtime.

- From 0.43.0 bitsandbytes loads ``libbitsandbytes_cuda<NNN>`` for the CUDA torch was built
  with (``cuda128`` for 12.8); a release whose wheels carry no library for that CUDA falls back
  to its CPU library ("compiled without GPU support"). Which CUDA releases each release
  carries is the matrix table ``bitsandbytes_cuda``; from 0.50.0 a missing minor falls back to
  a library of the same major. A CUDA that the oldest row lacks is newer than every release
  before that row, so those releases lack it too.
- Before 0.40.1 bitsandbytes looked for the CUDA runtime itself, in $CONDA_PREFIX/lib, the
  directories of LD_LIBRARY_PATH and /usr/local/cuda/lib64, and before 0.38.0 only by the
  unversioned name ``libcudart.so``. The runtime of pip's nvidia-cuda-runtime-cuNN lives in
  site-packages/nvidia/cuda_runtime/lib as ``libcudart.so.NN`` only, where none of them looks.
"""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor.context import Context, cite, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.stack import torch_stack

NAME = "bitsandbytes"
CPU_FALLBACK = ("it loads its CPU library instead ('The installed version of bitsandbytes was "
                "compiled without GPU support') and its 8-bit and 4-bit CUDA ops are missing")
TORCH_CUDART = Version.parse("0.40.1")  # finds the runtime through torch from this release
ANY_VERSIONED = Version.parse("0.38.0")  # also accepts libcudart.so.11.0 / .12.0 from here
CUDART_SOURCE = (
    "bitsandbytes-foundation/bitsandbytes CHANGELOG.md 0.40.1 ('CUDA SETUP now no longer looks "
    "for libcuda and libcudart and relies PyTorch CUDA libraries'); cuda_setup/main.py at 0.37.0 "
    "(CUDA_RUNTIME_LIB = \"libcudart.so\"; determine_cuda_runtime_lib_path: $CONDA_PREFIX/lib, "
    "LD_LIBRARY_PATH, /usr/local/cuda/lib64) and at 0.38.0 (CUDA_RUNTIME_LIBS adds "
    "'libcudart.so.11.0', 'libcudart.so.12.0': 'libcudart.so is missing by default for a conda "
    "install with PyTorch 2.0'); Thund3rPat/kohya_ss-linux#8 (pip's nvidia-cuda-runtime-cu11 "
    "has only libcudart.so.11.0; a libcudart.so symlink on LD_LIBRARY_PATH fixed it)")


def check(ctx: Context, earlier: list[Finding] | None = None) -> list[Finding]:
    """bitsandbytes against torch's CUDA and the CUDA runtimes listed; where neither rule
    here nor an ``earlier`` one said anything about it, why it passed or was not judged."""
    packages = ctx.packages
    if NAME not in packages:
        return []
    ver = Version.maybe(str(packages[NAME] or ""))
    found = _binary(ctx, ver) + _cudart(ctx, ver)
    if found or any(f.component == NAME for f in earlier or []):
        return found
    return [_said(ctx, ver)]


def _said(ctx: Context, ver: Version | None) -> Finding:
    """A bitsandbytes listed is never passed over: judged and fine, or why it was not."""
    what = f"{NAME} {ver}" if ver else f"{NAME} (version unknown)"
    cuda, where = _cuda(ctx, ver)
    if cuda is None:
        return finding("not-judged", "info", NAME, f"{what}: no CUDA is known here (no torch "
                       "build, no CUDA runtime), so which libbitsandbytes_cudaNNN it loads was "
                       "not judged")
    if ver is None:
        return finding("not-judged", "info", NAME, f"{what}: every release the matrix knows "
                       f"carries a library for {where}'s CUDA {cuda.trunc(2)}")
    return finding("ok", "info", NAME, f"{what} carries a library for {where}'s CUDA "
                   f"{cuda.trunc(2)}")


def _cuda(ctx: Context, ver: Version | None) -> tuple[Version | None, str]:
    """The CUDA whose library bitsandbytes loads: torch's; with no torch build here, the CUDA
    runtime it finds itself (releases before 0.40.1 search for it: CUDART_SOURCE)."""
    cuda, _ = torch_stack(ctx, packages=True)
    if cuda is not None:
        return cuda, "torch"
    if ver is not None and ver >= TORCH_CUDART:
        return None, ""
    system = [rt for rt in ctx.env.cuda_runtimes or [] if not _pip_runtime(rt)
              and Version.maybe(str(rt.version or "")) is not None]
    if len(system) != 1:
        return None, ""
    return Version.parse(str(system[0].version)), "the CUDA runtime"


def _rows(ctx: Context) -> list[Row]:
    return sorted(ctx.matrix.rows("bitsandbytes_cuda"),
                  key=lambda r: VersionRange.parse(r["bitsandbytes"]).lowest())


def _has(row: Row, cuda: Version) -> bool:
    have = [Version.parse(c) for c in row["cuda"]]
    if any(c.trunc(2) == cuda.trunc(2) for c in have):
        return True
    return bool(row.get("same_major")) and any(c.major == cuda.major for c in have)


def _floor(rows: list[Row], cuda: Version) -> Version | str | None:
    """The oldest release from which every release carries a library for ``cuda``."""
    floor = None
    for row in reversed(rows):
        if not _has(row, cuda):
            break
        floor = row.get("first") or VersionRange.parse(row["bitsandbytes"]).lowest()
    return floor


def _binary(ctx: Context, ver: Version | None) -> list[Finding]:
    """No native library for torch's CUDA in this release (or, version unknown, in some)."""
    cuda, where = _cuda(ctx, ver)
    rows = [r for r in _rows(ctx) if not r.uncertain]
    if cuda is None or not rows or ctx.platform == "aarch64":
        return []
    cuda = cuda.trunc(2)
    floor = _floor(rows, cuda)
    lib = f"libbitsandbytes_cuda{cuda.major}{cuda.minor}"
    fix = (f"`pip install -U '{NAME}>={floor}'`" if floor is not None else
           f"a torch build for a CUDA that {NAME} ships a library for")
    beside = (f"beside a torch built with CUDA {cuda}" if where == "torch" else
              f"with the CUDA {cuda} runtime and no torch build listed (releases before "
              f"{TORCH_CUDART} load the library of the runtime they find)")
    if ver is None:
        if floor is None or floor == VersionRange.parse(rows[0]["bitsandbytes"]).lowest():
            return []
        return [finding(
            "cuda-mismatch", "warning", NAME,
            f"{NAME} (version unknown) {beside}: releases before {floor} carry no {lib}, so "
            f"with one of them {CPU_FALLBACK}", fix=fix,
            source=_first_source(rows, cuda), needs=str(floor),
            torch_cuda=cuda)]
    row = next((r for r in rows if VersionRange.parse(r["bitsandbytes"]).contains(ver)), None)
    if row is not None and _has(row, cuda):
        return []
    first = VersionRange.parse(rows[0]["bitsandbytes"]).lowest()
    if row is None and (ver >= first or _has(rows[0], cuda)):
        return []  # a release before the table whose libraries may include this CUDA
    carries = (f"its wheels carry libraries for CUDA {', '.join(row['cuda'])}" if row else
               f"it predates {first}, and {first} already had no library for CUDA {cuda}")
    return [finding(
        "cuda-mismatch", "error", NAME,
        f"{NAME} {ver} has no {lib} for torch's CUDA {cuda} ({carries}): {CPU_FALLBACK}",
        fix=fix, row=row, source=None if row else _first_source(rows, cuda),
        torch_cuda=cuda, needs=str(floor) if floor else None)]


def _first_source(rows: list[Row], cuda: Version) -> str:
    row = next((r for r in rows if _has(r, cuda)), rows[-1])
    return cite(row)


def _cudart(ctx: Context, ver: Version | None) -> list[Finding]:
    """A release that searches for libcudart itself, where only pip's runtime is installed."""
    if ver is not None and ver >= TORCH_CUDART or ctx.os_kind == "windows":
        return []
    runtimes = ctx.env.cuda_runtimes
    if not runtimes or not all(_pip_runtime(rt) for rt in runtimes):
        return []  # a toolkit or conda's runtime may be where it looks
    dirs = sorted({p.rsplit("/", 1)[0] for rt in runtimes if (p := rt.path or "")
                   and "/" in p})
    where = dirs[0] if dirs else "<site-packages>/nvidia/cuda_runtime/lib"
    name = next((p.rsplit("/", 1)[1] for rt in runtimes if (p := rt.path or "")
                 and "/libcudart.so." in p), "libcudart.so.NN")
    what = f"{NAME} {ver}" if ver else f"{NAME} (version unknown)"
    scope = (f"releases before {TORCH_CUDART} look" if ver is None else "it looks")
    unversioned = ver is None or ver < ANY_VERSIONED
    link = f"`ln -s {name} {where}/libcudart.so`, then " if unversioned else ""
    return [finding(
        "libcudart-unreachable", "warning", NAME,
        f"{what}: {scope} for the CUDA runtime in $CONDA_PREFIX/lib, LD_LIBRARY_PATH and "
        f"/usr/local/cuda/lib64" + (" by the name libcudart.so" if unversioned else "") +
        f", but the only runtime here is pip's {name} in {where}: it finds none, so "
        f"{CPU_FALLBACK}",
        fix=f"`pip install -U '{NAME}>={TORCH_CUDART}'` (it uses torch's CUDA), or "
            f"{link}`export LD_LIBRARY_PATH={where}:$LD_LIBRARY_PATH`",
        source=CUDART_SOURCE, fixed_in=str(TORCH_CUDART), libdir=where)]


def _pip_runtime(rt: object) -> bool:
    src = f"{getattr(rt, 'source', '') or ''} {getattr(rt, 'path', '') or ''}".lower()
    return "nvidia-cuda-runtime" in src or "/nvidia/cuda_runtime/" in src
