"""`dnnctl compat` queries: suggest combinations for a GPU, show matrix tables."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from dnnctl.compat.drivers import driver_need, driver_status, with_gpu
from dnnctl.compat.gpus import resolve_gpu, split_gpu_text
from dnnctl.compat.matrix import Matrix
from dnnctl.compat.suggest import (
    TORCH_INDEX,
    reach_row,
    torch_arch_history,
    torch_options,
)
from dnnctl.compat.versions import CC, Version, VersionRange
from dnnctl.errors import UsageError

FRAMEWORKS = ("torch", "tensorflow", "jax", "cupy")


# -- suggest ----------------------------------------------------------------------------------

def suggest(matrix: Matrix, gpu: str, *, driver: str | None = None,
            framework: str | None = None, python: str | None = None,
            platform: str | None = None) -> dict[str, Any]:
    """Working combinations for a GPU, newest first, each with its install command."""
    if framework and framework not in FRAMEWORKS:
        raise UsageError(f"--framework {framework!r} is not one of {', '.join(FRAMEWORKS)}")
    info = resolve_gpu(matrix, *split_gpu_text(gpu))
    if info.cc is None or info.arch is None:
        raise UsageError(f"GPU {gpu!r} is not in the matrix",
                         hint="give its compute capability instead, e.g. --gpu 9.0 or --gpu sm_90 "
                         "(see `dnnctl compat show gpus`)")
    drv = Version.parse(driver) if driver else None
    platform = platform or (info.model.get("platform") if info.model else None)
    arch = info.arch
    notes: list[str] = []
    need = Version.maybe(arch.get("min_driver"))
    if drv is not None and need is not None and drv < need:
        notes.append(f"driver {drv} is too old for {arch['name']} GPUs: install >= {need}")
    last = arch.get("last_driver_branch")
    if last is not None:
        notes.append(f"{arch['name']} is supported by driver branches up to R{last}")
    if arch.get("last_cuda"):
        notes.append(f"CUDA {arch['min_cuda']}-{arch['last_cuda']} can target sm_"
                     f"{info.cc.major}{info.cc.minor}; newer CUDA cannot")
    gpu_blocked = drv is not None and need is not None and drv < need
    user_drv, drv = drv, (None if gpu_blocked else drv)  # rank newest first: it must change
    combos: list[dict[str, Any]] = []
    ptx_only: list[dict[str, Any]] = []
    wanted = [framework] if framework else list(FRAMEWORKS)
    py = Version.parse(python) if python else None
    if "torch" in wanted:
        for opt in torch_options(matrix, info.cc, driver=drv, platform=platform, python=py,
                                 allow_ptx=True):
            d = opt.to_dict()
            (combos if opt.reach == "cubin" else ptx_only).append(d)
        notes += [f"torch {n}" for n in torch_arch_history(matrix, info.cc, platform)]
    for name, fn in (("tensorflow", _tf_options), ("jax", _jax_options),
                     ("cupy", _cupy_options)):
        if name in wanted:
            for d in fn(matrix, info.cc, drv, platform):
                (combos if d["code"] in ("cubin", "jit") else ptx_only).append(d)
    for c in combos + ptx_only:
        if gpu_blocked:
            c["driver"] = "too-old"
    if drv is not None:
        combos = [c for c in combos if c["driver"] != "too-old"] + \
                 [c for c in combos if c["driver"] == "too-old"]
    return {"gpu": info.label, "model": info.model["model"] if info.model else None,
            "compute_capability": str(info.cc), "architecture": arch["name"],
            "driver": str(user_drv) if user_drv else None, "gpu_min_driver": arch.get("min_driver"),
            "platform": platform, "combinations": combos, "ptx_only": ptx_only, "notes": notes}


def _need(matrix: Matrix, cuda: Version, cc: CC) -> dict[str, str | None]:
    return with_gpu(driver_need(matrix, cuda), matrix.arch(cc)).to_dict()


def _tf_options(matrix: Matrix, cc: CC, drv: Version | None, platform: str | None) -> list[dict]:
    out = []
    for row in sorted(matrix.rows("tensorflow"), key=lambda r: Version.parse(r["tensorflow"]),
                      reverse=True):
        got, unsure, _ = reach_row(cc, row, platform)
        if row.uncertain or unsure or got is None:
            continue
        cuda = Version.parse(row["cuda"])
        extra = f"[{row['pip_extra']}]" if row.get("pip_extra") else ""
        out.append({"framework": "tensorflow", "version": f"{row['tensorflow']}.*",
                    "cuda": row["cuda"], "cudnn": row["cudnn"], "code": got,
                    "driver": driver_status(matrix, drv, cuda),
                    **_need(matrix, cuda, cc),
                    "install": f"pip install 'tensorflow{extra}=={row['tensorflow']}.*'",
                    "certainty": row["certainty"], "source": row["source"]})
    return out


def _jax_options(matrix: Matrix, cc: CC, drv: Version | None, platform: str | None) -> list[dict]:
    out = []
    def upper(r: dict) -> Version:
        return max(v for op, v, _ in VersionRange.parse(r["jax"]).clauses)
    for row in sorted(matrix.rows("jax"), key=lambda r: (upper(r), r["plugin"]), reverse=True):
        got, unsure, _ = reach_row(cc, row, platform)
        if row.uncertain or unsure or got is None:
            continue
        cuda = min(v for op, v, _ in VersionRange.parse(row["cuda"]).clauses if op == ">=")
        out.append({"framework": "jax", "version": row["jax"], "plugin": f"cuda{row['plugin']}",
                    "cuda": row["cuda"], "cudnn": f">={row['cudnn']}", "code": got,
                    "driver": driver_status(matrix, drv, Version((cuda.major, 0))),
                    **_need(matrix, cuda, cc),
                    "install": row["install"].format(version="<version>"),
                    "certainty": row["certainty"], "source": row["source"]})
    return out


def _cupy_options(matrix: Matrix, cc: CC, drv: Version | None, platform: str | None) -> list[dict]:
    arch = matrix.arch(cc)
    if arch is None:
        return []
    lo, hi = Version.parse(arch["min_cuda"]), Version.maybe(arch.get("last_cuda"))
    out = []
    for row in matrix.rows("cupy"):
        rng = VersionRange.parse(row["cuda"])
        low = max([lo] + [v for op, v, _ in rng.clauses if op in (">=", "==")])
        if row.uncertain or not rng.contains(low) or (hi is not None and low.trunc(2) > hi):
            continue
        if not re.search(r"\dx$", row["package"]):
            continue  # per-minor wheels are long gone: suggest the per-major ones
        gen = matrix.cupy_gpu(arch)
        cupy_min = Version.parse(gen["first"]) if gen and gen.get("fails") else None
        if cupy_min is not None:  # a release before it fails on this GPU
            cupy_min = max(cupy_min, VersionRange.parse(row["cupy"]).lowest() or cupy_min)
            if not VersionRange.parse(row["cupy"]).contains(cupy_min):
                continue
        out.append({"framework": "cupy", "version": f">={cupy_min}" if cupy_min else row["cupy"],
                    "package": row["package"], "cuda": f">={low}", "code": "jit",
                    "driver": driver_status(matrix, drv, low),
                    **_need(matrix, low, cc), "install": row["install"],
                    "certainty": row["certainty"], "source": row["source"]})
    return sorted(out, key=lambda d: d["package"], reverse=True)


# -- show -------------------------------------------------------------------------------------

SHOW = {
    "gpus": ("gpus", ("model", "cc", "class", "platform", "examples", "certainty")),
    "archs": ("architectures", ("cc", "name", "min_cuda", "last_cuda", "min_driver",
                                "last_driver_branch", "certainty")),
    "cuda": ("cuda_releases", ("version", "driver_linux", "driver_windows", "targets",
                               "family", "dropped", "certainty")),
    "cudnn": ("cudnn", ("versions", "cuda_major", "driver_linux", "cc", "pip", "certainty")),
    "torch": ("torch", ("torch", "variant", "cuda", "cudnn", "status", "arch_list",
                        "arch_uncertain", "min_driver", "full_driver", "certainty")),
    "tensorflow": ("tensorflow", ("tensorflow", "cuda", "cudnn", "python", "arch_list",
                                  "certainty")),
    "jax": ("jax", ("jax", "plugin", "cuda", "cudnn", "arch_list", "certainty")),
    "cupy": ("cupy", ("package", "cupy", "cuda", "install", "certainty")),
}


def show(matrix: Matrix, what: str, filters: Sequence[str] = ()) -> dict[str, Any]:
    """One matrix table, rows filtered by ``KEY=TEXT`` (substring) or plain ``TEXT``."""
    if what not in SHOW:
        raise UsageError(f"unknown table {what!r}", hint=f"one of: {', '.join(SHOW)}")
    table, columns = SHOW[what]
    rows = [{**dict(r), **_derived(matrix, table, r), "where": r.where}
            for r in matrix.rows(table)]
    rows = [r for r in rows if all(_matches(r, f) for f in filters)]
    return {"table": what, "columns": list(columns), "rows": rows}


def _derived(matrix: Matrix, table: str, row: dict[str, Any]) -> dict[str, Any]:
    """Facts a torch row implies: its pip index and minimum drivers (MVC floor / full)."""
    if table != "torch":
        return {}
    need = driver_need(matrix, Version.parse(row["cuda"])).to_dict()
    return {"index_url": row.get("index_url") or TORCH_INDEX.format(variant=row["variant"]),
            **need}


def _matches(row: dict[str, Any], spec: str) -> bool:
    key, sep, text = spec.partition("=")
    if sep:
        if key.strip() not in row:
            return False
        return text.strip().lower() in _flat(row[key.strip()]).lower()
    return any(spec.strip().lower() in _flat(v).lower() for v in row.values())


def _flat(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    if isinstance(value, dict):
        return " ".join(f"{k} {v}" for k, v in value.items())
    return "" if value is None else str(value)
