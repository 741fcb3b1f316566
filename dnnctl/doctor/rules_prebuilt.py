"""Prebuilt add-on packages tied to one build of torch or of CUDA (table ``prebuilt_pins``).

A prebuilt auto-gptq or PyPI pytorch3d wheel carries C++/CUDA extensions linked against one
torch line: beside another line they fail to load with an undefined c10 symbol. A 2018 conda
faiss-gpu build links one CUDA release's libraries, whose sonames before CUDA 11 carry
major.minor (libcublas.so.9.0), and does not install them: with no runtime of that release
here its GPU library does not load. So:

- release and torch (or the CUDA here) known: another torch line, or no CUDA runtime of the
  build's release, is an error; where the release also had a build that brings its own CUDA
  (faiss-gpu's default CUDA 8.0 build), only a warning, since that build may be the one here;
- the release or what it is judged against unknown: ``not-judged``, naming what the table
  says (the build of the release, or the releases built for what is here);
- a release with a build for the CUDA here: which build is installed is not known
  (``not-judged``, naming the build to install);
- a source build (``extensions.<name>.built_from_source: true``) is built for what is here,
  and a release the table lacks is left to rules_unjudged.
"""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import torch_install
from dnnctl.compat.versions import TorchVersion, Version
from dnnctl.doctor import stack
from dnnctl.doctor.context import Context, cite, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name

# what else fixes a mismatch, per package (beside a release built for what is here)
OTHER_FIX = {
    "auto-gptq": "or build it for this torch: `pip install auto-gptq --no-build-isolation "
                 "--no-binary auto-gptq`",
    "pytorch3d": "or the wheel for this Python, CUDA and torch from "
                 "https://dl.fbaipublicfiles.com/pytorch3d/packaging/wheels/ "
                 "(py3X_cuXYZ_pytXYZ, see its INSTALL.md), or a source build",
    "faiss-gpu": "or a newer faiss-gpu whose conda package brings its own cudatoolkit",
}


def check(ctx: Context) -> list[Finding]:
    """Each listed package of the table against the torch line or CUDA runtimes here."""
    rows = ctx.matrix.rows("prebuilt_pins")
    installed = _installed(ctx)
    out: list[Finding] = []
    for name in sorted({canonical_name(r["package"]) for r in rows}):
        if name not in installed:
            continue
        version = installed[name]
        mine = [r for r in rows if canonical_name(r["package"]) == name]
        if mine[0]["against"] == "torch":
            out += _torch(ctx, name, version, mine)
        else:
            out += _cuda(ctx, name, version, mine)
    return out


def _installed(ctx: Context) -> dict[str, str | None]:
    """Package -> version (None: unknown); source builds left out."""
    out: dict[str, str | None] = {canonical_name(n): (str(v) if v else None)
                                  for n, v in (ctx.env.packages or {}).items()}
    for n, info in (ctx.env.extensions or {}).items():
        key = canonical_name(n)
        if (info or {}).get("built_from_source"):
            out.pop(key, None)
            continue
        if (info or {}).get("version") or key not in out:
            out[key] = str((info or {}).get("version") or "") or out.get(key)
    return out


def _release(version: str | None) -> str | None:
    return version.split("+")[0].strip().lower() if version else None


def _install(row: Row, release: str | None = None, variant: str | None = None) -> str:
    tag = str(row["build"]).replace(".", "")
    cmd = str(row["install"]).replace("{release}", release or row["releases"][-1])
    if row.get("index") and variant and variant.startswith("cu"):
        cmd += " --extra-index-url " + str(row["index"]).replace("{variant}", variant)
    return "`" + cmd.replace("{tag}", tag) + "`"


def _torch(ctx: Context, name: str, version: str | None, rows: list[Row]) -> list[Finding]:
    """A package built for one torch line against the torch here."""
    found = stack.torch_version(ctx)
    torch = None if found is None else TorchVersion(
        found[0].release, stack.torch_variant(ctx, found[1], found[0]), found[0].text)
    release = _release(version)
    judged = [r for r in rows if not r.uncertain]
    row = next((r for r in judged if release in r["releases"]), None)
    what = f"{name} {version}" if version else f"{name} (version unknown)"
    if release is not None and row is None:
        return []  # a release the table lacks: rules_unjudged says so
    if torch is None:
        if row is None:
            return [finding(
                "not-judged", "info", name,
                f"{what}: each prebuilt release is built for one torch line ({_lines(judged)});"
                " neither its release nor torch's version is known here, so it was not judged",
                fix=f"give its version (pip show {name}) and torch's", source=cite(*judged))]
        return [finding(
            "not-judged", "info", name,
            f"{what} is a prebuilt wheel built for torch {row['build']}; torch's version is "
            "not known here, so whether its compiled extensions load was not judged",
            fix=f"give torch's version, or keep torch {row['build']}.x beside it", row=row,
            built_for=row["build"])]
    fits = [r for r in judged if Version.parse(r["build"]).trunc(2) == torch.release.trunc(2)]
    fix = _torch_fix(name, torch, fits)
    if row is None:
        return [finding(
            "not-judged", "info", name,
            f"{what}: each prebuilt release is built for one torch line ({_lines(judged)}); "
            f"its release is not known, so it was not judged against torch {torch.text}",
            fix=f"give its version (pip show {name}); " + fix, source=cite(*judged),
            torch=torch.text)]
    built = Version.parse(row["build"]).trunc(2)
    if built == torch.release.trunc(2):
        return [finding("ok", "info", name, f"{what} was built for torch {row['build']}, the "
                        f"line of torch {torch.text} here", row=row, built_for=row["build"])]
    return [finding(
        "build-mismatch", "error", name,
        f"{what} is a prebuilt wheel built for torch {row['build']}, but torch {torch.text} is "
        f"installed: its compiled extensions fail to load ('undefined symbol: _ZN3c10...')",
        fix=fix + f", or torch {row['build']} ({_torch_install(ctx, row['build'], torch)})",
        row=row, built_for=row["build"], torch=torch.text)]


def _lines(rows: list[Row]) -> str:
    return ", ".join(f"{'/'.join(r['releases'])}: torch {r['build']}" for r in rows)


def _torch_install(ctx: Context, line: str, torch: TorchVersion) -> str:
    """torch of ``line`` in the CUDA variant of the torch here, from its index where the
    matrix has that build."""
    row = next((r for r in ctx.matrix.rows("torch") if str(r["torch"]) == line
                and torch.local and r["variant"] == torch.local), None)
    return f"`{torch_install(row)}`" if row else f"`pip install \"torch=={line}.*\"`"


def _torch_fix(name: str, torch: TorchVersion, fits: list[Row]) -> str:
    if fits:
        rel = fits[-1]["releases"][-1]
        first = (f"{_install(fits[-1], rel, torch.local)} (a release built for torch "
                 f"{torch.line})")
    else:
        first = f"no {name} release in the matrix is built for torch {torch.line}"
    return f"{first}, {OTHER_FIX.get(name, 'or build it from source')}"


def _runtimes(ctx: Context) -> list[Version]:
    """The CUDA releases (major.minor) of the runtimes and cuBLAS copies here."""
    found = [Version.maybe(rt.version) for rt in ctx.env.cuda_runtimes]
    found += [Version.maybe(c.version) for c in ctx.env.libraries.get("cublas", [])]
    return sorted({v.trunc(2) for v in found if v is not None})


def _loads(build: Version, here: list[Version]) -> bool:
    """Whether a runtime here satisfies a build's libraries: the same release, or from CUDA 11
    (sonames of the major only) the same major and at least the build's minor."""
    return any(v == build or (build.major >= 11 and v.major == build.major and v >= build)
               for v in here)


def _cuda(ctx: Context, name: str, version: str | None, rows: list[Row]) -> list[Finding]:
    """A package built for one CUDA release against the CUDA runtimes here."""
    here = _runtimes(ctx)
    release = _release(version)
    judged = [r for r in rows if not r.uncertain]
    mine = [r for r in judged if release in r["releases"]]
    what = f"{name} {version}" if version else f"{name} (version unknown)"
    if release is not None and not mine:
        return []
    shown = ", ".join(v.text for v in here) or "none"
    fits = [r for r in judged if _loads(Version.parse(r["build"]), here)]
    if not here or not mine:
        builds = ("; its builds: CUDA " + "/".join(r["build"] for r in mine)) if mine else ""
        fix = (f"for the CUDA here: {_install(fits[-1])}" if fits and here else
               "give the CUDA runtime here (cuda_runtimes) and its version")
        return [finding(
            "not-judged", "info", name,
            f"{what} is a build for one CUDA release, which it does not install{builds}; "
            + ("its release is not known" if here else "no CUDA runtime is listed here")
            + " (CUDA here: " + shown + "), so whether it loads was not judged",
            fix=fix, source=cite(*(mine or [judged[0]] + fits[-1:])), cuda=shown)]
    loads = [r for r in mine if _loads(Version.parse(r["build"]), here)]
    if loads:  # a build of this release loads here; which build it is, is not known
        return [finding(
            "not-judged", "info", name,
            f"{what} has a build for CUDA {loads[-1]['build']}, which is here; which of its "
            "builds is installed is not in the snapshot, so it was not judged",
            fix=f"`conda list {name}` names the build; else {_install(loads[-1], release)}",
            source=cite(*loads), cuda=shown)]
    builds = "/".join(r["build"] for r in mine)
    bundled = next((r["bundled"] for r in mine if r.get("bundled")), None)
    other = [r for r in fits if r not in mine]
    fix = (f"{_install(other[-1])} (built for CUDA {other[-1]['build']}, the CUDA here), "
           if other else "") + f"or install the CUDA {mine[0]['build']} runtime, " \
        + OTHER_FIX.get(name, "or build it from source")
    if bundled:
        return [finding(
            "cuda-mismatch", "warning", name,
            f"{what}: its builds for CUDA {builds} need that CUDA installed (they do not bring "
            f"it) and the CUDA here is {shown}; only its CUDA {bundled} build brings its own "
            "runtime, so unless that is the build here its GPU library does not load",
            fix=fix, source=cite(*mine), builds=builds, cuda=shown)]
    return [finding(
        "cuda-mismatch", "error", name,
        f"{what} is built for CUDA {builds} and does not install it; the CUDA here is {shown}: "
        f"its GPU library does not load ('libcublas.so.{mine[0]['build']}: cannot open shared "
        "object file')", fix=fix, source=cite(*mine), builds=builds, cuda=shown)]
