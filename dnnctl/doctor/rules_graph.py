"""Graph learning libraries against the torch beside them: PyG's compiled extensions and DGL.

PyTorch Geometric's extension packages (torch-scatter, torch-sparse, torch-cluster,
torch-spline-conv, pyg-lib) are C++/CUDA extensions of one torch line and one CUDA variant;
their wheels say which in the local version (``2.1.1+pt113cu117``: torch 1.13, cu117) and come
from one index per pair (``https://data.pyg.org/whl/torch-2.1.0+cu118.html``, table
``pyg_wheels``). Beside another torch line they fail to load with an undefined symbol, beside
another CUDA variant with "Detected that PyTorch and torch_sparse were compiled with different
CUDA versions". A torch with no index (a nightly, a line PyG never built for) has no wheel, so
the extensions here were built for another torch unless they were built from source here.

DGL ships its CPU and CUDA builds under one name: ``dgl`` from PyPI (no ``+cuXYZ`` tag) is the
CPU build, whose graphs cannot go to a GPU ("Device API cuda is not enabled. Please install the
cuda version of dgl"); its CUDA builds (``dgl==X+cuXYZ``) come from data.dgl.ai and must match
torch's CUDA. Each release needs a torch (table ``dgl``).
"""

from __future__ import annotations

import re

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import TorchVersion, Version, VersionRange
from dnnctl.doctor.context import Context, cite, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.stack import torch_info, torch_variant
from dnnctl.errors import UsageError

PYG = ("torch-scatter", "torch-sparse", "torch-cluster", "torch-spline-conv", "pyg-lib")
PYG_TAG = re.compile(r"\+pt(\d)(\d+)(cu\d+|cpu)$", re.IGNORECASE)
PYG_INDEX = "https://data.pyg.org/whl/torch-{index}+{variant}.html"
PYG_SOURCE = (
    "pyg-team/pytorch_geometric docs/source/install/installation.rst ('pip install pyg_lib "
    "torch_scatter torch_sparse -f https://data.pyg.org/whl/torch-${TORCH}+${CUDA}.html'; 'these "
    "dependencies are fully optional'; 'In case a specific version is not supported by our "
    "wheels, you can alternatively install them from source'); rusty1s/pytorch_scatter "
    ".github/workflows/building.yml (the wheel's version is VERSION+pt<torch><cuda-version>); "
    "rusty1s in pyg-team/pytorch_geometric#6900 (wheels of torch 1.13.0+cu117 under a torch 2.1 "
    "nightly: 'undefined symbol: _ZN2at4_ops6narrow4callERKNS_6TensorElll'; install them from "
    "source, or PyG from master, which no longer needs them); rusty1s/pytorch_sparse "
    "torch_sparse/__init__.py (on import: 'Detected that PyTorch and torch_sparse were "
    "compiled with different CUDA versions ... Please reinstall the torch_sparse that "
    "matches your PyTorch install.')")
DGL_CUDA_TAG = re.compile(r"^cu(\d+)$")


def check(ctx: Context) -> list[Finding]:
    """PyG's extension wheels and DGL against the torch installed."""
    packages = ctx.packages
    torch = _torch(ctx)
    return _pyg(ctx, packages, torch) + _dgl(ctx, packages, torch)


def _torch(ctx: Context) -> TorchVersion | None:
    """torch here with its variant (stack.torch_variant: its tag, else its entry's CUDA,
    else PyPI's Linux default of its line)."""
    info = torch_info(ctx, packages=True) or {}
    try:
        ver = TorchVersion.parse(info["version"]) if info.get("version") else None
    except UsageError:
        return None
    if ver is None:
        return None
    return TorchVersion(ver.release, torch_variant(ctx, info, ver), ver.text)


def _pyg_row(ctx: Context, torch: TorchVersion) -> Row | None:
    """The index of this torch's line, if PyG has one for its variant and it is a release."""
    if torch.is_dev or torch.custom or torch.local is None:
        return None
    return next((r for r in ctx.matrix.rows("pyg_wheels") if not r.uncertain
                 and Version.parse(r["torch"]).trunc(2) == torch.release.trunc(2)
                 and torch.local in [v.lower() for v in r["variants"]]), None)


def _pyg(ctx: Context, packages: dict[str, str], torch: TorchVersion | None) -> list[Finding]:
    names = [n for n in PYG if n in packages]
    if not names or torch is None:
        return []
    row = _pyg_row(ctx, torch)
    bad, unknown = [], []
    for name in names:
        m = PYG_TAG.search(packages[name])
        if m is None:
            unknown.append(name)
            continue
        built = f"{m.group(1)}.{m.group(2)}"
        if built != torch.line or (torch.local and m.group(3).lower() != torch.local):
            bad.append(f"{name} {packages[name]} (torch {built}, {m.group(3).lower()})")
    found: list[Finding] = []
    pyg = Version.maybe(packages.get("torch-geometric") or "")
    fix = _pyg_fix(names, row, torch.local or "", pyg is None or pyg >= _OPTIONAL_FROM)
    cited = PYG_SOURCE + (f"; {cite(row)}" if row else "")
    here = f"torch {torch.text}" + ("" if "+" in torch.text or not torch.local
                                    else f" ({torch.local})")
    if bad:
        found.append(finding(
            "build-mismatch", "error", "torch-geometric",
            f"PyG extension wheels built for another torch than {here}: " + "; ".join(bad)
            + ": they do not load (an undefined symbol, or 'Detected that PyTorch and "
            "torch_sparse were compiled with different CUDA versions')", fix=fix,
            source=cited, torch=torch.text, packages=", ".join(names)))
    if unknown and row is not None:
        found.append(finding(
            "not-judged", "info", "torch-geometric",
            f"{', '.join(unknown)}: which torch and CUDA the wheels were built for is not "
            f"known (no +ptXYcuZ local version); beside {here} they must come from "
            f"PyG's index for torch {row['index']}+{torch.local} (another torch's or CUDA's "
            "wheels fail to load)", fix=fix, source=cited, torch=torch.text,
            packages=", ".join(unknown)))
    if unknown and row is None and _after_first_index(ctx, torch):
        found.append(finding(
            "build-mismatch", "warning", "torch-geometric",
            f"PyG has no extension wheels for {here}, so {', '.join(unknown)} here were built "
            "for another torch (they then fail to load with an undefined symbol) unless they "
            "were built from source against this torch", fix=fix, source=cited,
            torch=torch.text, packages=", ".join(unknown)))
    return found


# torch_geometric runs without the extension packages from this release on (its install
# page: 'these dependencies are fully optional', PYG_SOURCE); before it, it imports them
_OPTIONAL_FROM = Version.parse("2.3")


def _after_first_index(ctx: Context, torch: TorchVersion) -> bool:
    """torch's line is not older than the oldest line PyG's wheel index has in the matrix:
    a torch from before PyG published wheels had its extensions built from source, so a
    missing index says nothing about them."""
    lines = [Version.parse(r["torch"]).trunc(2) for r in ctx.matrix.rows("pyg_wheels")]
    return bool(lines) and torch.release.trunc(2) >= min(lines)


def _pyg_fix(names: list[str], row: Row | None, variant: str, optional: bool = True) -> str:
    """The wheels of this torch's index (reinstalled: the same release is already there),
    else their removal (where torch_geometric runs without them: ``optional``) or a build
    from source; commands of at most 80 columns, copied whole."""
    wheels = [n.replace("-", "_") for n in names]
    if row is not None:
        index = PYG_INDEX.format(index=row["index"], variant=variant)
        return " and ".join([f"`export PIP_FIND_LINKS={index}`"] + [
            f"`{cmd}`" for cmd in _chunks("pip install --force-reinstall --no-deps", wheels)])
    source = ("build them from source against this torch (PyG's install page, "
              "'Installation from Source')")
    if not optional:
        return source[0].upper() + source[1:] + " (this torch_geometric imports them)"
    return (" and ".join(f"`{cmd}`" for cmd in _chunks("pip uninstall -y", wheels))
            + " (torch_geometric >= 2.3 runs without them), or " + source)


def _chunks(head: str, words: list[str], width: int = 80) -> list[str]:
    out = [head]
    for w in words:
        if out[-1] != head and len(out[-1]) + 1 + len(w) > width:
            out.append(head)
        out[-1] += f" {w}"
    return out


def _dgl(ctx: Context, packages: dict[str, str], torch: TorchVersion | None) -> list[Finding]:
    version = packages.get("dgl")
    if version is None or torch is None:
        return []
    text, _, tag = version.partition("+")
    v = Version.maybe(text)
    row = next((r for r in ctx.matrix.rows("dgl") if v is not None and not r.uncertain
                and VersionRange.parse(r["dgl"]).admits(v)), None)
    if row is None:
        return []
    cited = cite(row)
    found: list[Finding] = []
    floor = Version.parse(str(row["raises_below"]))
    supported = VersionRange.parse(row["torch"]).admits(torch.release)
    if supported:  # a torch it accepts may still lack its GraphBolt library
        found = _graphbolt(ctx, v, version, torch)
        if found:  # its libraries do not load at all: nothing else about it matters
            return found
    need = row["torch"].replace(" ", "")
    if not supported:
        raises = torch.release < floor
        found.append(finding(
            "build-mismatch", "error" if raises else "warning", "dgl",
            f"dgl {version} needs torch {need}, but torch {torch.text} is installed"
            + (f": 'import dgl' raises 'DGL requires PyTorch >= {floor}'" if raises else
               " (below the torch its install page documents for this release)"),
            fix=f"install a torch {need} (a build of the CUDA the dgl index has), then dgl "
            "from its index for that torch", source=cited, dgl=version, torch=torch.text))
    variant = torch.local if torch.local and DGL_CUDA_TAG.match(torch.local) else None
    built = tag.lower() if DGL_CUDA_TAG.match(tag.lower()) else None
    cuda_pkg = any(re.fullmatch(r"dgl-cu\d+", n) for n in packages)
    if variant is None or cuda_pkg or built == variant:
        return found
    fix = _dgl_fix(ctx, row, v, text, variant, torch) \
        + (f" (after torch {need})" if not supported else "")
    if built is None:
        on_gpu = bool(ctx.gpus)
        found.append(finding(
            "build-mismatch", "error" if on_gpu else "warning", "dgl",
            f"dgl {version} has no +cuXYZ tag: it is DGL's CPU build (PyPI's), beside torch "
            f"{torch.text}: graphs cannot go to the GPU ('Device API cuda is not enabled. "
            "Please install the cuda version of dgl')", fix=fix, source=cited, dgl=version,
            torch=torch.text)
        )
    else:
        found.append(finding(
            "build-mismatch", "error", "dgl",
            f"dgl {version} is built for {built}, torch {torch.text} for {variant}: DGL's "
            "CUDA build must match torch's CUDA", fix=fix, source=cited, dgl=version,
            torch=torch.text))
    return found


GRAPHBOLT_SOURCE = (
    "Rhett-Ying in dmlc/dgl#7809 (DGL 2.2.1, torch 2.4.1, Windows: no "
    "graphbolt_pytorch_2.4.1.dll; 'Since 2024.06.27, we have stopped providing packages for "
    "Windows and MacOS. The latest version of available package is 2.2.1 ... you need to build "
    "on your own or downgrade your torch version to torch 2.1') and #7247 ('DGL 2.1.0 supports "
    "up to torch 2.2.1'); dmlc/dgl#7822 (macOS, torch 2.4.1: 'Cannot find DGL C++ graphbolt "
    "library'); dglai/dglai.github.io#95 (2024-06-27: the install page's warning that Windows "
    "and Mac packages stop)")
DGL_LAST_WINDOWS = "2.2.1"
DGL_WINDOWS_TORCH = "2.1"  # the torch the maintainers name for 2.2.1 there (dgl#7809)


def _graphbolt(ctx: Context, v: Version | None, version: str,
               torch: TorchVersion) -> list[Finding]:
    """DGL's GraphBolt library is built per torch release (graphbolt_pytorch_<torch>): a torch
    line none of the release's packages was built for fails `import dgl`, on every OS."""
    rows = [r for r in ctx.matrix.rows("dgl_wheels") if v is not None and not r.uncertain
            and r.get("torch") and VersionRange.parse(r["dgl"]).admits(v)]
    line = Version.parse(torch.line)
    if not rows or any(VersionRange.parse(r["torch"]).admits(line) for r in rows):
        return []
    ranges = " or ".join(r["torch"].replace(" ", "") for r in rows)
    ext = {"windows": "graphbolt_pytorch_{}.dll", "macos": "libgraphbolt_pytorch_{}.dylib"}.get(
        ctx.os_kind or "", "libgraphbolt_pytorch_{}.so").format(torch.release)
    if ctx.os_kind in ("windows", "macos"):
        fix = (f"`pip install \"torch=={DGL_WINDOWS_TORCH}.*\"` (the torch DGL's maintainers "
               f"name for dgl {DGL_LAST_WINDOWS}, its last {ctx.os_kind} package), or build DGL "
               "from source for this torch, or run it in WSL 2 / Linux with DGL's current "
               "packages")
    else:
        newer = sorted({rel for r in ctx.matrix.rows("dgl_wheels") if not r.uncertain
                        and r.get("torch") and VersionRange.parse(r["torch"]).admits(line)
                        for rel in r["releases"]}, key=Version.parse)
        fix = (f"a torch {ranges}, or " + (f"dgl {newer[-1]} (its packages cover torch "
               f"{torch.line}; index data.dgl.ai/wheels/torch-{torch.line}/...)" if newer
               else "build DGL from source for this torch"))
    return [finding(
        "build-mismatch", "error", "dgl",
        f"dgl {version} carries its GraphBolt library for torch {ranges} only; beside torch "
        f"{torch.text} `import dgl` fails (no {ext})", fix=fix,
        source=f"{GRAPHBOLT_SOURCE}; {cite(*rows[:1])}",
        dgl=version, torch=torch.text)]


def _dgl_install(row: Row, release: str, variant: str, torch: TorchVersion) -> str:
    index = row["index"].format(torch=torch.line, variant=variant)
    return (f"`pip uninstall -y dgl` and `export PIP_FIND_LINKS={index}` and "
            f"`pip install dgl=={release}+{variant}`")


def _dgl_wheels(ctx: Context, torch: TorchVersion) -> list[Row]:
    """The ``dgl_wheels`` rows that hold for this torch's line."""
    line = Version.parse(torch.line)
    return [r for r in ctx.matrix.rows("dgl_wheels") if not r.uncertain
            and (not r.get("torch") or VersionRange.parse(r["torch"]).admits(line))]


def _dgl_fix(ctx: Context, row: Row, v: Version, text: str, variant: str,
             torch: TorchVersion) -> str:
    """This release's ``variant`` build where DGL published one (or where the matrix does not
    say); else the nearest release with one, for this torch."""
    known = [r for r in ctx.matrix.rows("dgl_wheels") if not r.uncertain
             and VersionRange.parse(r["dgl"]).admits(v)]
    here = [r for r in _dgl_wheels(ctx, torch) if r in known]
    published = sorted({x for r in here for x in r["variants"]})
    if not known or variant in published:
        return _dgl_install(row, text, variant, torch)
    what = (f"DGL published no {variant} build of dgl {text} for torch {torch.line} (its CUDA "
            f"builds for it: {', '.join(published) or 'none'})")
    found: list[tuple[Version, Row]] = []
    for r in _dgl_wheels(ctx, torch):
        for rel in (Version.parse(x) for x in r["releases"] if variant in r["variants"]):
            need = next((d for d in ctx.matrix.rows("dgl") if not d.uncertain
                         and VersionRange.parse(d["dgl"]).admits(rel)), None)
            if need is not None and VersionRange.parse(need["torch"]).admits(torch.release):
                found.append((rel, need))
    if not found:
        if not published:
            return f"{what}, nor of any release in the matrix: build DGL from source"
        index = row["index"].format(torch=torch.line, variant="cuXYZ")
        return (f"{what}, nor of any release in the matrix for this torch: a torch built for "
                f"one of {', '.join(published)}, then dgl=={text}+cuXYZ from {index}")
    ordered = sorted({rel for rel, _ in found} | {v})
    pos = ordered.index(v)
    rel, need = min(found, key=lambda f: (abs(ordered.index(f[0]) - pos), -ordered.index(f[0])))
    return f"{what}; the nearest release with one: " + _dgl_install(need, str(rel), variant, torch)
