"""CTranslate2 (faster-whisper, whisperX): its wheel's cuDNN major against the cuDNN installed.

A CTranslate2 wheel built with cuDNN loads ``libcudnn*.so.<major>`` of that one major: 3.x-4.4
cuDNN 8, 4.5-4.6.2 cuDNN 9, 4.6.3+ none (matrix table ``ctranslate2``). Next to a torch that
brings the other major (torch >= 2.4 pins nvidia-cudnn-cu12 9.x), the first Whisper call fails.
The cuDNN here is every copy the snapshot lists plus the one the torch here bundles, a torch
listed only in ``packages`` included (its wheel's row in compat/torch.yaml); when none of them
is known, the wheel's need is a conditional warning, never a pass.
"""

from __future__ import annotations

from collections.abc import Callable

from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import TORCH_INDEX
from dnnctl.compat.versions import Version, VersionRange, parse_cudnn
from dnnctl.doctor.context import Context, finding, unknown
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_libraries import library_major, loadable_majors
from dnnctl.doctor.stack import cudnn_found, torch_info, torch_stack

SYMPTOM = {8: "'Could not load library libcudnn_ops_infer.so.8' (or libcudnn_cnn_infer.so.8)",
           9: "'Unable to load any of {libcudnn_cnn.so.9.1.0, ...}' / 'Invalid handle. Cannot "
              "load symbol cudnnCreateConvolutionDescriptor'"}
# cuDNN's own loader on Windows (faster-whisper#1080: cudnn_ops64_9.dll with ctranslate2 4.5.0)
SYMPTOM_WINDOWS = {8: "'Could not locate cudnn_ops_infer64_8.dll'",
                   9: "'Could not locate cudnn_ops64_9.dll'"}
USERS = ("faster-whisper", "whisperx")


def check(ctx: Context) -> list[Finding]:
    """The installed ctranslate2 wheel against the CUDA and cuDNN majors found here."""
    packages = ctx.packages
    text = packages.get("ctranslate2")
    if text is None or ctx.os_kind == "macos" or ctx.platform == "aarch64":
        return []  # macOS and aarch64 Linux wheels are CPU-only
    users = [f"{u} {packages[u] or ''}".strip() for u in USERS if u in packages]
    what = f"ctranslate2 {text or '(version unknown)'}" + (
        f" (used by {', '.join(users)})" if users else "")
    ver = Version.maybe(text)
    if ver is None:
        return _version_unknown(ctx, what, cudnn_found(ctx, packages, torch_package=True))
    row = ctx.matrix.ctranslate2_row(ver) if ver else None
    if row is None:
        known = sorted(ctx.matrix.rows("ctranslate2"), key=_low)
        span = (f" (it knows {_low(known[0])}-{_high(known[-1])})" if known else "")
        return [finding("ok", "info", "ctranslate2", f"{what}: not in the matrix{span}; its "
                        "CUDA and cuDNN needs were not judged", version=text)]
    if row.uncertain:
        return [unknown("ctranslate2", f"{what}: the matrix row is uncertain", row=row)]
    cuda = Version.parse(row["cuda"])
    found = cudnn_found(ctx, packages, torch_package=True)
    have = found or set()
    out = library_major(ctx, "ctranslate2", what, cuda.major, "libcublas",
                        fix=_fix(ctx, have, row), row=row)
    if not row["uses_cudnn"]:
        return out or [finding("ok", "info", "ctranslate2", f"{what}: a CUDA {cuda} wheel built "
                               "without cuDNN", row=row)]
    need = Version.parse(row["cudnn"])
    if found is None:
        return out + [_cudnn_unknown(ctx, what, row, need, cuda)]
    if need.major not in found:
        listed = ", ".join(f"{m}.x" for m in sorted(have)) or "none (the snapshot lists no "\
            "cuDNN copy, nvidia-cudnn wheel or torch cuDNN)"
        out.append(finding(
            "cudnn-mismatch", "error", "ctranslate2",
            f"{what} is built against cuDNN {need.major} ({need}, CUDA {cuda}) and loads "
            f"{_library(ctx, need.major)}, but the cuDNN installed here is {listed}: models with "
            f"convolutions (Whisper) fail with {_symptom(ctx, need.major)}",
            fix=_mismatch_fix(ctx, have, row, need, cuda), row=row, cudnn_needed=need.major, cudnn_found=sorted(have)))
    if not out:
        out.append(finding("ok", "info", "ctranslate2", f"{what}: a CUDA {cuda} / cuDNN "
                           f"{need.major} wheel, and cuDNN {need.major} is installed", row=row))
    return out


def _library(ctx: Context, major: int) -> str:
    return f"cudnn*64_{major}.dll" if ctx.os_kind == "windows" else f"libcudnn*.so.{major}"


def _symptom(ctx: Context, major: int) -> str:
    table = SYMPTOM_WINDOWS if ctx.os_kind == "windows" else SYMPTOM
    return table.get(major, "a cuDNN load error")


def _cudnn_unknown(ctx: Context, what: str, row: Row, need: Version, cuda: Version) -> Finding:
    """A wheel built with cuDNN where no cuDNN copy, nvidia-cudnn wheel or torch says which
    cuDNN is installed: a warning conditional on the cuDNN here not being the wheel's."""
    torch_here = torch_info(ctx, packages=True) is not None
    bundling = _torch_bundling(ctx, need.major, cuda.major)
    note = ""
    if torch_here and bundling is not None:
        note = (f"; nor is the torch release here, and torch wheels bundle cuDNN {need.major} "
                f"from {bundling[0]} on")
    return finding(
        "not-judged", "warning", "ctranslate2",
        f"{what} is built against cuDNN {need.major} ({need}, CUDA {cuda}) and loads "
        f"{_library(ctx, need.major)}; which cuDNN is installed here is not known{note}: "
        f"unless it is cuDNN {need.major}, models with convolutions (Whisper) fail with "
        f"{_symptom(ctx, need.major)}",
        fix=f"if the cuDNN here is not {need.major}: "
        + _other_ways(ctx, row, need, cuda, torch_here), row=row, cudnn_needed=need.major)


def _mismatch_fix(ctx: Context, have: set[int], row: Row, need: Version, cuda: Version) -> str:
    """The releases built for the cuDNN here; where the wheel needs a newer cuDNN than the
    torch here bundles, also the torch that bundles the wheel's."""
    fix = _fix(ctx, have, row)
    _, torch_cudnn = torch_stack(ctx, packages=True)
    bundling = _torch_bundling(ctx, need.major, cuda.major)
    if torch_cudnn is None or torch_cudnn.major >= need.major or bundling is None \
            or not fix.startswith("pip install "):
        return fix
    return (f"`{fix}` (built for the cuDNN {torch_cudnn.major} here), or a torch that bundles "
            f"cuDNN {need.major}: `{_torch_install(*bundling)}`")


def _other_ways(ctx: Context, row: Row, need: Version, cuda: Version, torch_here: bool) -> str:
    """Install the wheel's cuDNN (beside a torch: the torch that bundles it, since a pip
    nvidia-cudnn of another major conflicts with the torch wheel's pin), or the newest releases
    of the same CUDA major built for another cuDNN major."""
    bundling = _torch_bundling(ctx, need.major, cuda.major)
    if torch_here and bundling is not None:
        ways = [f"a torch that bundles it (`{_torch_install(*bundling)}`)"]
    else:
        where = " with its nvidia\\cudnn\\bin folder on PATH" if ctx.os_kind == "windows" else ""
        ways = [f"install it (`pip install 'nvidia-cudnn-cu{cuda.major}=={need.major}.*'`"
                f"{where})"]
    others = sorted({Version.parse(r["cudnn"]).major for r in ctx.matrix.rows("ctranslate2")
                     if r["uses_cudnn"] and not r.uncertain
                     and Version.parse(r["cuda"]).major == cuda.major
                     and Version.parse(r["cudnn"]).major != need.major}, reverse=True)
    for major in others:
        fix = _fix(ctx, {major}, row)
        if fix.startswith("pip install 'ctranslate2"):
            ways.append(f"with cuDNN {major}: `{fix}` (the releases built for it)")
    return ", or ".join(ways)


def _torch_bundling(ctx: Context, major: int, cuda_major: int) -> tuple[Version, str] | None:
    """The first torch line from which every later wheel bundles cuDNN ``major`` (lines with
    no cuDNN in the matrix skipped), and its CUDA ``cuda_major`` variant (PyPI's default where
    it is one); None when the newest torch line bundles another major."""
    lines: dict[Version, list[Row]] = {}
    for r in ctx.matrix.rows("torch"):
        lines.setdefault(Version.parse(r["torch"]).trunc(2), []).append(r)
    since = None
    for line in sorted(lines, reverse=True):
        known = [v.major for r in lines[line] if (v := parse_cudnn(r.get("cudnn"))) is not None]
        if not known:
            continue  # a line whose cuDNN pin is not in the matrix yet says nothing
        if any(m != major for m in known):
            break
        since = line
    if since is None:
        return None
    fits = [r for r in lines[since] if Version.parse(r["cuda"]).major == cuda_major]
    fits.sort(key=lambda r: not r.get("pypi_default"))
    return (since, fits[0]["variant"]) if fits else None


def _torch_install(line: Version, variant: str) -> str:
    return f"pip install 'torch>={line}' --index-url {TORCH_INDEX.format(variant=variant)}"


def _version_unknown(ctx: Context, what: str, cudnns: set[int] | None) -> list[Finding]:
    """A ctranslate2 of unknown version against every wheel the table knows: each loads the
    cuBLAS of its CUDA major and, if built with cuDNN, that cuDNN major."""
    rows = [r for r in ctx.matrix.rows("ctranslate2") if not r.uncertain]
    have = loadable_majors(ctx)

    def fits(r: Row) -> bool:
        cuda_ok = have is None or Version.parse(r["cuda"]).major in have
        return cuda_ok and (not r["uses_cudnn"] or cudnns is None
                            or Version.parse(r["cudnn"]).major in cudnns)

    def kind(r: Row) -> str:
        major = Version.parse(r["cuda"]).major
        return f"CUDA {major}" + (f" / cuDNN {Version.parse(r['cudnn']).major}"
                                  if r["uses_cudnn"] else " without cuDNN")

    if not rows or (have is None and cudnns is None):
        return [finding("not-judged", "info", "ctranslate2", f"{what}: which CUDA and cuDNN "
                        "it loads depends on its version; not judged")]
    builds = sorted({kind(r) for r in rows}, reverse=True)
    good = sorted({kind(r) for r in rows if fits(r)}, reverse=True)
    if good:
        since = _fitting_since(rows, fits)
        fix = "name its version (pip show ctranslate2)"
        if since is not None and len(good) < len(builds):
            fix = (f"`pip install -U 'ctranslate2>={since}'` (every release from {since} on "
                   "fits what is installed here), or name its version (`pip show ctranslate2`)")
        return [finding("not-judged", "info", "ctranslate2", f"{what}: its wheels built for "
                        f"{', '.join(good)} fit what is installed here, the others ("
                        + (", ".join(b for b in builds if b not in good) or "none")
                        + ") do not; which one is installed was not judged",
                        fix=fix, fits=good)]
    span = f"{_low(rows[0])}-{_high(rows[-1]) or 'now'}"
    nothing = have == set()  # every wheel loads libcublas of its CUDA major
    listed = ", ".join(f"{m}.x" for m in sorted(have or ())) or "none"
    return [finding(
        "cuda-mismatch" if have is not None and not any(
            Version.parse(r["cuda"]).major in have for r in rows) else "cudnn-mismatch",
        "error" if nothing else "warning", "ctranslate2",
        f"{what}: no wheel the matrix knows ({span}) fits what is installed here (CUDA "
        f"{listed}, cuDNN " + (", ".join(f"{m}.x" for m in sorted(cudnns)) or "none"
                               if cudnns is not None else "unknown")
        + f"); they are built for {'; '.join(builds)}",
        fix="`pip install -U ctranslate2 nvidia-cublas-cu12` (a current wheel and the CUDA 12 "
        "cuBLAS it loads)", builds=builds)]


def _fitting_since(rows: list[Row], fits: Callable[[Row], bool]) -> Version | None:
    """The first release of the newest unbroken run of wheels that all fit (up to the newest
    the matrix knows), None when the newest does not fit."""
    since = None
    for r in sorted(rows, key=_low, reverse=True):
        if not fits(r):
            break
        since = _low(r)
    return since


def _low(row: Row) -> Version:
    return VersionRange.parse(row["ctranslate2"]).lowest()


def _high(row: Row) -> Version | None:
    return VersionRange.parse(row["ctranslate2"]).upper()


def _fix(ctx: Context, have: set[int], current: Row) -> str:
    """The newest run of ctranslate2 releases built for a cuDNN major installed here (and a
    CUDA major found here), extended by later releases that need no cuDNN."""
    cuda_have = loadable_majors(ctx)
    rows = sorted(ctx.matrix.rows("ctranslate2"), key=_low)

    def cuda_ok(r: Row) -> bool:
        return cuda_have is None or Version.parse(r["cuda"]).major in cuda_have

    def cudnn_ok(r: Row) -> bool:
        return r["uses_cudnn"] and Version.parse(r["cudnn"]).major in have

    exact = [i for i, r in enumerate(rows) if cudnn_ok(r) and cuda_ok(r) and not r.uncertain]
    if not exact:
        if not (current["uses_cudnn"] and (have or ctx.env.none_found("cudnn"))):
            return "pip install -U ctranslate2"
        major = Version.parse(current["cudnn"]).major
        cuda = Version.parse(current["cuda"]).major
        bare = [r for r in rows if not r["uses_cudnn"] and cuda_ok(r) and not r.uncertain
                and Version.parse(r["cuda"]).major == cuda and _low(r) > _low(current)]
        other = (f"ctranslate2 built without cuDNN (pip install 'ctranslate2>={_low(bare[0])}')"
                 if bare and not have else "a ctranslate2 built for the cuDNN installed here")
        return (f"install cuDNN {major} for CUDA {cuda}.x (pip install "
                f"'nvidia-cudnn-cu{cuda}=={major}.*'), or {other}")
    last = exact[-1]
    major, cuda_major = (Version.parse(rows[last][k]).major for k in ("cudnn", "cuda"))
    first = last
    while first > 0 and cudnn_ok(rows[first - 1]) and \
            Version.parse(rows[first - 1]["cudnn"]).major == major and \
            Version.parse(rows[first - 1]["cuda"]).major == cuda_major:
        first -= 1
    end = last
    while end + 1 < len(rows) and cuda_ok(rows[end + 1]) and \
            Version.parse(rows[end + 1]["cuda"]).major == cuda_major and \
            (cudnn_ok(rows[end + 1]) or not rows[end + 1]["uses_cudnn"]):
        end += 1
    high = _high(rows[end]) if end + 1 < len(rows) else None
    spec = f">={_low(rows[first])}" + (f",<{high}" if high else "")
    return f"pip install 'ctranslate2{spec}'"
