"""Which builds can run on a GPU, and the working combinations newest first.

``reach`` applies the code-compatibility rules to one build's arch list: a cubin runs on
the same major with an equal or higher minor (sm_86 on 8.9; nothing crosses 9.x -> 10.x),
PTX JIT-compiles onto any newer GPU, ``a`` targets only on their exact CC, ``f`` targets
across the family. Suggestions only name builds with real cubins for the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dnnctl.compat.drivers import arch_min_driver, driver_need, driver_status, with_gpu
from dnnctl.compat.matrix import LEGACY_TORCH_BEFORE, Matrix
from dnnctl.compat.schema import Row
from dnnctl.compat.versions import CC, Target, Version, VersionRange, parse_arch_list

TORCH_INDEX = "https://download.pytorch.org/whl/{variant}"


def reach(cc: CC, targets: list[Target]) -> str | None:
    """'cubin' if some cubin runs on ``cc``, else 'ptx' if some PTX can JIT, else None."""
    if any(not t.ptx and t.runs_on(cc) for t in targets):
        return "cubin"
    if any(t.ptx and t.runs_on(cc) for t in targets):
        return "ptx"
    return None


def reach_row(cc: CC, row: Row, platform: str | None,
              arch_list: list[str] | None = None) -> tuple[str | None, bool, list[str] | None]:
    """(reach, uncertain, the arch list used) for a framework row on one GPU.

    ``uncertain`` is True when the answer changes with the entries sources disagree on, or
    when the platform's arch list is not in the matrix (then the list used is None)."""
    if arch_list is None:
        key = "arch_list_aarch64" if platform == "aarch64" else "arch_list"
        if key not in row:
            return None, True, None
        arch_list = list(row[key])
        extra = [t for t in row.get("arch_uncertain") or [] if t not in arch_list]
    else:
        extra = []
    targets = parse_arch_list(arch_list)
    base = reach(cc, targets)
    with_extra = reach(cc, targets + parse_arch_list(extra)) if extra else base
    return base, with_extra != base, arch_list


def cubin_status(cc: CC, row: Row, platform: str | None) -> bool | None:
    """Whether the build has a cubin that runs on ``cc``; None when sources disagree on it
    or the platform's list is unknown (uncertain PTX entries do not matter here)."""
    key = "arch_list_aarch64" if platform == "aarch64" else "arch_list"
    if key not in row:
        return None
    sure = [t for t in parse_arch_list(list(row[key])) if not t.ptx]
    maybe = [t for t in parse_arch_list(list(row.get("arch_uncertain") or [])) if not t.ptx]
    ok = reach(cc, sure) == "cubin"
    if not ok and maybe and reach(cc, maybe) == "cubin":
        return None
    return ok


@dataclass
class TorchOption:
    row: Row
    reach: str  # cubin | ptx
    driver_ok: str  # full | mvc | too-old | unknown
    min_driver: str | None = None  # compat.drivers.driver_need (with the GPU's own minimum)
    full_driver: str | None = None

    @property
    def install(self) -> str:
        return torch_install(self.row)

    def to_dict(self) -> dict[str, Any]:
        r = self.row
        return {"framework": "torch", "version": f"{r['torch']}.*", "variant": r["variant"],
                "cuda": r["cuda"], "cudnn": r.get("cudnn"), "status": r["status"],
                "code": self.reach, "driver": self.driver_ok, "min_driver": self.min_driver,
                "full_driver": self.full_driver,
                "install": self.install,
                "certainty": r["certainty"], "source": r["source"]}


def python_fits(row: Row, python: Version | None) -> bool:
    """Whether the release of ``row`` has wheels for ``python`` (major.minor); True when either
    is unknown (a row without a range says nothing, and nothing is assumed)."""
    if python is None or not row.get("python"):
        return True
    return VersionRange.parse(row["python"]).contains(python.trunc(2))


def torch_install(row: Row) -> str:
    index = row.get("index_url") or TORCH_INDEX.format(variant=row["variant"])
    return f"pip install 'torch=={row['torch']}.*' --index-url {index}"


def torch_options(matrix: Matrix, cc: CC, *, driver: Version | None = None,
                  platform: str | None = None, allow_ptx: bool = False,
                  python: Version | None = None, windows: bool = False) -> list[TorchOption]:
    """Torch wheels with real code for ``cc`` (cubins; PTX-only when allowed), newest
    release line first, stable before experimental, newest CUDA first. ``windows``: the
    driver is numbered as Windows drivers are (native Windows and WSL)."""
    out = []
    for row in matrix.current("torch"):
        if row.uncertain:
            continue
        got, unsure, _ = reach_row(cc, row, platform)
        cubin = cubin_status(cc, row, platform)
        if cubin is None or (not cubin and (got is None or unsure or not allow_ptx)):
            continue
        got = "cubin" if cubin else got
        if not python_fits(row, python):
            continue
        cuda = Version.parse(row["cuda"])
        need = with_gpu(driver_need(matrix, cuda, windows=windows), matrix.arch(cc),
                        matrix=matrix, windows=windows).to_dict()
        out.append(TorchOption(row, got, driver_status(matrix, driver, cuda, windows=windows),
                               need["min_driver"], need["full_driver"]))
    rank = {"full": 0, "mvc": 1, "unknown": 2, "too-old": 3}
    out.sort(key=lambda o: (-_vkey(o.row["torch"]), o.row["status"] != "stable",
                            -_vkey(o.row["cuda"])))
    if driver is not None:  # a working driver first, within that newest first
        out.sort(key=lambda o: rank[o.driver_ok])
    return out


def best_torch_fix(matrix: Matrix, cc: CC, *, driver: Version | None, platform: str | None,
                   same_line: str | None = None, windows: bool = False,
                   python: Version | None = None) -> str | None:
    """The install command to suggest for a torch build that cannot run on ``cc``: the same
    release line if it has a wheel for the GPU, else the newest wheel that works with this
    driver; with the driver it needs when the driver must change anyway (in Windows
    numbering when ``windows``); only releases with wheels for ``python`` when it is given."""
    arch = matrix.arch(cc)
    gpu_need = arch_min_driver(matrix, arch, windows=windows)
    if driver is not None and gpu_need is not None and driver < gpu_need:
        driver = None  # the driver must be upgraded for this GPU anyway: rank newest first
    options = torch_options(matrix, cc, driver=driver, platform=platform, windows=windows,
                            python=python)
    if not options:
        return None
    pick = options[0]
    if same_line:
        line = [o for o in options if Version.parse(o.row["torch"]).trunc(2) ==
                Version.parse(same_line).trunc(2) and o.driver_ok in ("full", "mvc", "unknown")]
        pick = line[0] if line else pick
    text = pick.install
    need = with_gpu(driver_need(matrix, Version.parse(pick.row["cuda"]), windows=windows), arch,
                    matrix=matrix, windows=windows).minimum
    if need is not None and (driver is None or pick.driver_ok == "too-old"):
        text += f" (with driver >= {need})"
    return text


def legacy_torch_fix(matrix: Matrix, cc: CC, *, platform: str | None = None,
                     windows: bool = False, python: Version | None = None) -> str | None:
    """For an installed torch line before 1.13 on a GPU no current wheel has code for: the
    newest older line whose binaries still carry a cubin for ``cc`` (its PyPI build), or None.
    Only offered to a snapshot that already runs such an old line (never to a current one);
    only a line with wheels for ``python`` when it is given."""
    lines: dict[Version, list[Row]] = {}
    for row in matrix.rows("torch"):
        line = Version.parse(row["torch"]).trunc(2)
        if line < LEGACY_TORCH_BEFORE and not row.uncertain and python_fits(row, python) \
                and cubin_status(cc, row, platform):
            lines.setdefault(line, []).append(row)
    if not lines:
        return None
    line = max(lines)
    rows = sorted(lines[line], key=lambda r: (not r.get("pypi_default"), -_vkey(r["cuda"])))
    row = rows[0]
    need = with_gpu(driver_need(matrix, Version.parse(row["cuda"]), windows=windows),
                    matrix.arch(cc), matrix=matrix, windows=windows).minimum
    driver = f", driver >= {need}" if need is not None else ""
    how = (f"`pip install 'torch=={line}.*'` (Linux; PyPI's build is its {row['variant']})"
           if row.get("pypi_default") and not windows else
           f"its {row['variant']} build from https://pytorch.org/get-started/previous-versions")
    return (f"torch {line}, the newest release line whose binaries have code for "
            f"sm_{cc.major}{cc.minor}: {how}, CUDA {row['cuda']}{driver}, with the add-ons "
            f"built for torch {line}")


def torch_arch_history(matrix: Matrix, cc: CC, platform: str | None = None) -> list[str]:
    """Per wheel variant: the torch line that dropped code for ``cc``, or that it never had."""
    notes = []
    by_variant: dict[str, list[Row]] = {}
    for row in matrix.current("torch"):
        by_variant.setdefault(row["variant"], []).append(row)
    for variant, rows in sorted(by_variant.items(), key=lambda kv: _vkey(kv[1][0]["cuda"])):
        rows.sort(key=lambda r: _vkey(r["torch"]))
        prev: bool | None = None
        states = [cubin_status(cc, row, platform) for row in rows]
        for row, ok in zip(rows, states):
            if ok is None:
                notes.append(f"{variant}: torch {row['torch']} is uncertain for sm_{cc.major}"
                             f"{cc.minor} (sources disagree)")
                continue
            if prev is True and not ok:
                notes.append(f"{variant}: torch {row['torch']} dropped sm_{cc.major}{cc.minor}")
            prev = ok
        if all(ok is False for ok in states):
            notes.append(f"{variant}: never had code for sm_{cc.major}{cc.minor} "
                         f"(torch {rows[0]['torch']}-{rows[-1]['torch']})")
    return notes


def _vkey(text: str) -> float:
    v = Version.parse(text)
    return v.major * 1000 + v.minor
