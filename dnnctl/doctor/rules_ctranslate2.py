"""CTranslate2 (faster-whisper, whisperX): its wheel's cuDNN major against the cuDNN installed.

A CTranslate2 wheel built with cuDNN loads ``libcudnn*.so.<major>`` of that one major: 3.x-4.4
cuDNN 8, 4.5-4.6.2 cuDNN 9, 4.6.3+ none (matrix table ``ctranslate2``). Next to a torch that
brings the other major (torch >= 2.4 pins nvidia-cudnn-cu12 9.x), the first Whisper call fails.
"""

from __future__ import annotations

from collections.abc import Callable

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor.context import Context, finding, unknown
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name
from dnnctl.doctor.rules_libraries import library_major, loadable_majors
from dnnctl.doctor.stack import cudnn_found

SYMPTOM = {8: "'Could not load library libcudnn_ops_infer.so.8' (or libcudnn_cnn_infer.so.8)",
           9: "'Unable to load any of {libcudnn_cnn.so.9.1.0, ...}' / 'Invalid handle. Cannot "
              "load symbol cudnnCreateConvolutionDescriptor'"}
USERS = ("faster-whisper", "whisperx")


def check(ctx: Context) -> list[Finding]:
    """The installed ctranslate2 wheel against the CUDA and cuDNN majors found here."""
    packages = {canonical_name(n): str(v) for n, v in (ctx.env.packages or {}).items()}
    text = packages.get("ctranslate2")
    if text is None or ctx.os_kind == "macos" or ctx.platform == "aarch64":
        return []  # macOS and aarch64 Linux wheels are CPU-only
    users = [f"{u} {packages[u] or ''}".strip() for u in USERS if u in packages]
    what = f"ctranslate2 {text or '(version unknown)'}" + (
        f" (used by {', '.join(users)})" if users else "")
    ver = Version.maybe(text)
    if ver is None:
        return _version_unknown(ctx, what, cudnn_found(ctx, packages))
    row = ctx.matrix.ctranslate2_row(ver) if ver else None
    if row is None:
        known = sorted(ctx.matrix.rows("ctranslate2"), key=_low)
        span = (f" (it knows {_low(known[0])}-{_high(known[-1])})" if known else "")
        return [finding("ok", "info", "ctranslate2", f"{what}: not in the matrix{span}; its "
                        "CUDA and cuDNN needs were not judged", version=text)]
    if row.uncertain:
        return [unknown("ctranslate2", f"{what}: the matrix row is uncertain", row=row)]
    cuda = Version.parse(row["cuda"])
    found = cudnn_found(ctx, packages)
    have = found or set()
    out = library_major(ctx, "ctranslate2", what, cuda.major, "libcublas",
                        fix=_fix(ctx, have, row), row=row)
    if not row["uses_cudnn"]:
        return out or [finding("ok", "info", "ctranslate2", f"{what}: a CUDA {cuda} wheel built "
                               "without cuDNN", row=row)]
    need = Version.parse(row["cudnn"])
    if found is not None and need.major not in found:
        listed = ", ".join(f"{m}.x" for m in sorted(have)) or "none (the snapshot lists no "\
            "cuDNN copy, nvidia-cudnn wheel or torch cuDNN)"
        out.append(finding(
            "cudnn-mismatch", "error", "ctranslate2",
            f"{what} is built against cuDNN {need.major} ({need}, CUDA {cuda}) and loads "
            f"libcudnn*.so.{need.major}, but the cuDNN installed here is {listed}: models with "
            f"convolutions (Whisper) fail with {SYMPTOM.get(need.major, 'a cuDNN load error')}",
            fix=_fix(ctx, have, row), row=row, cudnn_needed=need.major, cudnn_found=sorted(have)))
    if not out:
        out.append(finding("ok", "info", "ctranslate2", f"{what}: a CUDA {cuda} / cuDNN "
                           f"{need.major} wheel, and cuDNN {need.major} is installed"
                           if have else f"{what}: a CUDA {cuda} / cuDNN {need.major} wheel "
                           "(which cuDNN is installed is not known)", row=row))
    return out


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
