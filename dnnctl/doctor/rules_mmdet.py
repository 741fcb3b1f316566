"""MMDetection against the mmcv installed beside it.

``import mmdet`` asserts that mmcv lies in the range its release was made for (table
``mmdet_mmcv``): "MMCV==1.3.9 is used but incompatible. Please install mmcv>=1.1.5, <=1.3."
MMDetection 2.x compares lists of integers from its own ``digit_version`` with an inclusive
maximum (a two-part maximum such as ``1.3`` then admits 1.2.x but not 1.3.0); 3.x compares
``mmengine.utils.digit_version`` tuples (pre-releases below their release) with a strict one.
Both are reproduced here, so the verdict is the assertion's. mmdet 2.x runs on the
``mmcv-full`` package and 3.x on ``mmcv`` 2.x, each built for one torch and CUDA (its wheels
come from download.openmmlab.com, one index per CUDA variant and torch line).
"""

from __future__ import annotations

import re

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import TorchVersion
from dnnctl.doctor.context import Context, cite, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.stack import torch_info
from dnnctl.errors import UsageError

SOURCE = (
    "jshilong in open-mmlab/mmdetection#5803 ('MMCV==1.3.9 is used but incompatible. Please "
    "install mmcv>=[1, 1, 4], <=[1, 2, 0]'; 'Sure [downgrade mmcv], or you can update your "
    "mmdet'); mmdetection docs/en/faq.md ('Compatibility issue between MMCV and MMDetection "
    "... Please install the correct version of MMCV for the version of your MMDetection'); "
    "open-mmlab/mmengine mmengine/utils/version_utils.py digit_version (3.x)")
MMCV_INDEX = "https://download.openmmlab.com/mmcv/dist/{cu}/{torch}/index.html"
MMCV_INDEX_SOURCE = (
    "mmdetection docs/en/get_started.md: 2.x 'pip install mmcv-full -f "
    "https://download.openmmlab.com/mmcv/dist/{cu_version}/{torch_version}/index.html' and "
    "'pip install -U openmim', 'mim install mmcv-full'; 3.x 'mim install \"mmcv>=2.0.0\"'; "
    "open-mmlab/mim mim/__main__.py (python -m mim)")
_PRE = {"a": -3, "b": -2, "rc": -1}


def _digits_2x(text: str) -> list[int]:
    """MMDetection 2.x's digit_version: numeric parts, and ``0rc1`` as ``[-1, 1]``."""
    out: list[int] = []
    for part in text.split("."):
        if part.isdigit():
            out.append(int(part))
        elif "rc" in part:
            head, _, tail = part.partition("rc")
            if head.isdigit() and tail.isdigit():
                out += [int(head) - 1, int(tail)]
    return out


def _digits_3x(text: str) -> tuple[int, ...] | None:
    """mmengine's digit_version: the release padded to four parts, then (pre, n) with
    rc -1 / b -2 / a -3, (1, n) for a post-release, (0, 0) for a release."""
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)(?:[.-]?(a|b|rc)(\d+))?(?:[.-]?post(\d+))?",
                 text.lower())
    if not m:
        return None
    release = [int(p) for p in m.group(1).split(".")][:4]
    release += [0] * (4 - len(release))
    if m.group(2):
        return tuple(release + [_PRE[m.group(2)], int(m.group(3))])
    if m.group(4):
        return tuple(release + [1, int(m.group(4))])
    return tuple(release + [0, 0])


def admits(row: Row, mmcv: str) -> bool | None:
    """Whether the release's own assertion accepts ``mmcv`` (None: unreadable)."""
    if row["upper"] == "<=":
        v = _digits_2x(mmcv)
        return bool(v) and _digits_2x(row["mmcv_min"]) <= v <= _digits_2x(row["mmcv_max"])
    v, lo, hi = _digits_3x(mmcv), _digits_3x(row["mmcv_min"]), _digits_3x(row["mmcv_max"])
    if v is None or lo is None or hi is None:
        return None
    return lo <= v < hi


def _release_key(text: str) -> tuple[int, ...]:
    return _digits_3x(text) or (0,)


def _installed(ctx: Context) -> tuple[str | None, str, str] | None:
    """(mmdet's version or None, mmcv's package, its version) when both are listed."""
    packages = ctx.packages
    if "mmdet" not in packages:
        return None
    for name in ("mmcv-full", "mmcv"):
        if packages.get(name):
            return packages["mmdet"] or None, name, packages[name]
    return None


def check(ctx: Context) -> list[Finding]:
    """mmcv against the range the installed mmdet release asserts."""
    found = _installed(ctx)
    if found is None:
        return []
    mmdet, package, mmcv = found
    mmcv = mmcv.split("+")[0]
    rows = [r for r in ctx.matrix.rows("mmdet_mmcv") if not r.uncertain]
    accept = _accepting(rows, mmcv)
    if mmdet is None:
        return [finding(
            "not-judged", "info", "mmdet",
            f"mmdet (version unknown) beside {package} {mmcv}: `import mmdet` asserts an mmcv "
            "range of its own release ('MMCV==... is used but incompatible'), not checked"
            + (f"; {package} {mmcv} is accepted by mmdet {accept}" if accept else
               f"; no mmdet release in the matrix accepts {package} {mmcv}"),
            fix="name mmdet's version (packages: {mmdet: X.Y.Z}) to judge it"
            + (f", or `pip install \"mmdet=={_newest(accept)}\"`" if accept else ""),
            source=SOURCE, mmcv=mmcv)]
    text = mmdet.split("+")[0].strip().lower()
    row = next((r for r in rows if text in [v.lower() for v in r["mmdet"]]), None)
    if row is None:
        return [finding("not-judged", "info", "mmdet", f"mmdet {mmdet}: the mmcv range its "
                        "release asserts is not in the matrix, so mmcv "
                        f"{mmcv} was not checked against it", source=SOURCE, mmcv=mmcv)]
    ok = admits(row, mmcv)
    if ok is not False:
        return []
    want = f">={row['mmcv_min']}, {row['upper']}{row['mmcv_max']}"
    cited = f"{SOURCE}; {cite(row)}"
    return [finding(
        "build-mismatch", "error", "mmdet",
        f"mmdet {mmdet} accepts mmcv{want} only, and {package} {mmcv} is installed: `import "
        f"mmdet` fails ('MMCV=={mmcv} is used but incompatible. Please install mmcv{want}.')",
        fix=_fix(ctx, row, package, accept), source=cited + "; " + MMCV_INDEX_SOURCE,
        mmdet=mmdet, mmcv=mmcv, mmcv_accepted=want)]


def _accepting(rows: list[Row], mmcv: str) -> str | None:
    """The mmdet releases whose assertion accepts ``mmcv``, as runs of consecutive releases
    ("2.11.0..2.19.1"; runs joined by ", "), the newest last."""
    every = sorted((v for r in rows for v in r["mmdet"]), key=_release_key)
    ok = {v for r in rows if admits(r, mmcv) for v in r["mmdet"]}
    runs: list[list[str]] = []
    for i, v in enumerate(every):
        if v not in ok:
            continue
        if runs and i > 0 and every[i - 1] == runs[-1][-1]:
            runs[-1].append(v)
        else:
            runs.append([v])
    if not runs:
        return None
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}..{r[-1]}" for r in runs)


def _newest(accept: str) -> str:
    return accept.split(", ")[-1].split("..")[-1]


def _fix(ctx: Context, row: Row, package: str, accept: str | None) -> str:
    """An mmdet release that accepts the mmcv here, or an mmcv in this release's range built
    for the torch and CUDA here."""
    three = row["upper"] == "<"
    name = "mmcv" if three else "mmcv-full"
    hi = row["mmcv_max"]
    # 2.x: a two-part inclusive maximum ("1.3") admits no 1.3.x release
    upper = f"<{hi}" if three or hi.count(".") < 2 else f"<={hi}"
    spec = f"{name}>={row['mmcv_min']},{upper}"
    index = _index(ctx, three)
    # mim picks the mmcv build of the torch and CUDA here (its index URL would not fit a
    # command line of 80 columns)
    mmcv = (f"`pip install -U openmim` and `python -m mim install \"{spec}\"` (mim picks the "
            f"{name} build for the torch and CUDA here"
            + (f"; pip's index for them is {index}" if index else "") + ")")
    swap = f"`pip uninstall -y {package}` and " if package != name else ""
    newer = (f"`pip install \"mmdet=={_newest(accept)}\"` (an mmdet that accepts it), or "
             if accept else "")
    return newer + swap + mmcv


def _index(ctx: Context, three: bool) -> str | None:
    """The mmcv wheel index of the torch here: cuXYZ / cpu and torchX.Y.0 (mmcv-full) or
    torchX.Y (mmcv 2.x)."""
    text = str((torch_info(ctx, packages=True) or {}).get("version") or "")
    try:
        torch = TorchVersion.parse(text) if text else None
    except UsageError:
        torch = None
    if torch is None or not torch.local or not re.fullmatch(r"cu\d+|cpu", torch.local):
        return None
    line = torch.line if three else f"{torch.line}.0"
    return MMCV_INDEX.format(cu=torch.local, torch=f"torch{line}")
