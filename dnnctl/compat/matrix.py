"""Load the compatibility matrix (compat/*.yaml) plus user overlays, and look rows up.

``load_matrix(overlays)`` reads every bundled ``compat/*.yaml``, then each file named in
``DNNCTL_MATRIX`` (os.pathsep-separated), then ``overlays``; an overlay row whose key matches
a bundled row replaces it, any other row is added. Malformed files raise
``InputFileError`` naming the file, the line and the field.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnnctl.compat import cache
from dnnctl.compat.inputs import bounded, check_yaml_shape, read_input
from dnnctl.compat.schema import MATRIX_SCHEMA, TABLES, Row, row_key, validate_row
from dnnctl.compat.versions import CC, Version, VersionRange
from dnnctl.errors import InputFileError
from dnnctl.resources import compat_dir

ENV_VAR = "DNNCTL_MATRIX"
# torch lines older than this are judged when installed, never suggested (Matrix.current)
LEGACY_TORCH_BEFORE = Version.parse("1.13")
# a die codename at the start of a pci.ids board name: GF/GK/GM/GP/GV/TU/GA/AD/GH + 3 digits,
# then a revision or variant suffix (B, GL, M, BM, GLM) or nothing
_CHIP = re.compile(r"((?:GF|GK|GM|GP|GV|TU|GA|AD|GH)\d{3})(?:[A-Z]{0,3})(?=$|[\s\[(])",
                   re.IGNORECASE)


@functools.lru_cache(maxsize=1)
def _line_loader() -> type:
    """A safe loader (libyaml when available) whose mappings remember their line (PyYAML is
    imported only when a YAML file must really be parsed: the bundled tables are cached)."""
    import yaml

    class LineLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        pass

    def construct_row(loader: Any, node: Any) -> Row:
        loader.flatten_mapping(node)
        row = Row(loader.construct_mapping(node, deep=True))
        row.line = node.start_mark.line + 1
        return row

    LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_row)
    return LineLoader


@dataclass
class Matrix:
    """Every table as a list of rows, plus the files they came from."""

    tables: dict[str, list[Row]] = field(default_factory=lambda: {t: [] for t in TABLES})
    files: list[str] = field(default_factory=list)

    def rows(self, table: str) -> list[Row]:
        return self.tables[table]

    def current(self, table: str) -> list[Row]:
        """The rows that suggestions and "no release build has code for this GPU" draw on:
        torch lines before ``LEGACY_TORCH_BEFORE`` (2019-2022 wheels, rows from secondary
        sources) judge an installed build of that line but are never offered as the fix."""
        if table != "torch":
            return self.tables[table]
        return [r for r in self.tables[table]
                if Version.parse(r["torch"]).trunc(2) >= LEGACY_TORCH_BEFORE]

    # -- GPUs and architectures -------------------------------------------------------------

    def gpu(self, name: str) -> Row | None:
        """The GPU model whose NVML name pattern matches ``name`` (longest match wins)."""
        best: tuple[int, Row] | None = None
        for row in self.tables["gpus"]:
            for pattern in row["match"]:
                m = re.search(pattern, bounded(name), re.IGNORECASE)
                if m and (best is None or len(m.group(0)) > best[0]):
                    best = (len(m.group(0)), row)
        return best[1] if best else None

    def gpu_chip(self, name: str) -> Row | None:
        """The gpu_chips row of the die a pci.ids-style name starts with ("GP108 [GeForce GT
        1030]", "TU117M", "GK208B [GeForce GT 710]"); None for other names."""
        m = _CHIP.match(name.strip())
        if not m:
            return None
        chip = m.group(1).upper()
        return next((r for r in self.tables.get("gpu_chips", []) if chip in r["chips"]), None)

    def arch(self, cc: CC) -> Row | None:
        for row in self.tables["architectures"]:
            if CC.parse(row["cc"]) == cc or any(CC.parse(a) == cc for a in row.get("aliases") or []):
                return row
        return None

    def nvswitch_rows(self, name: str) -> list[Row]:
        """The NVSwitch-board rows whose name pattern matches the GPU name ``name``."""
        return [row for row in self.tables["nvswitch_gpus"]
                if any(re.search(p, bounded(name), re.IGNORECASE) for p in row["match"])]

    def kernel_flavor(self, flavor: str) -> Row | None:
        """The kernel_module_flavors row of "open" / "proprietary"."""
        return next((r for r in self.tables["kernel_module_flavors"]
                     if r["flavor"] == flavor), None)

    def nvcc_host_rows(self, cuda: Version, table: str = "nvcc_host_compilers") -> list[Row]:
        """The nvcc_host_compilers (or nvcc_msvc) rows for a CUDA release; for "X.Y" (no
        update number), every row of an X.Y update (11.4 -> both the 11.4.0 and the 11.4.1+
        row)."""
        exact = cuda if len(cuda.key) >= 3 else None
        out = []
        for row in self.tables[table]:
            rng = VersionRange.parse(row["cuda"])
            if exact is not None:
                hit = rng.contains(exact)
            else:
                hit = any(rng.contains(Version.parse(f"{cuda.text}.{u}")) for u in range(10))
            if hit:
                out.append(row)
        return out

    def mig_enumeration(self, driver: Version | None) -> list[Row]:
        """How many MIG devices CUDA enumerates per process with ``driver``: the row of the
        newest driver not above it, or every row when the driver is unknown."""
        rows = sorted(self.tables["mig_enumeration"], key=lambda r: Version.parse(r["driver"]))
        if driver is None:
            return rows
        fit = [r for r in rows if Version.parse(r["driver"]) <= driver]
        return fit[-1:]

    # -- CUDA and drivers ---------------------------------------------------------------------

    def cuda_release(self, version: Version) -> Row | None:
        want = version.trunc(2)
        for row in self.tables["cuda_releases"]:
            if Version.parse(row["version"]).trunc(2) == want:
                return row
        return None

    def cuda_major(self, major: int) -> Row | None:
        return next((r for r in self.tables["cuda_majors"] if r["major"] == major), None)

    def driver_cuda(self, driver: Version, windows: bool = False) -> tuple[Version | None, bool]:
        """The newest CUDA (major.minor) the driver fully supports, and whether a newer
        release with an unknown driver minimum makes that answer uncertain. Windows drivers
        are numbered apart (``windows=True`` reads the Windows column)."""
        best: Version | None = None
        unsure = False  # minimums only grow, so an unknown row matters only past the last known
        key = "driver_windows" if windows else "driver_linux"
        for row in sorted(self.tables["cuda_releases"], key=lambda r: Version.parse(r["version"])):
            need = row.get(key)
            if need is None or row.uncertain:
                unsure = unsure or best is not None
                continue
            if driver >= Version.parse(need):
                best = Version.parse(row["version"]).trunc(2)
                unsure = False
            else:
                return best, False
        return best, unsure

    def cusparse_cuda(self, version: Version) -> Row | None:
        """The CUDA release a cuSPARSE version comes from, at least: the row whose first
        cuSPARSE version is the newest not above ``version`` (None before CUDA 12)."""
        best: tuple[Version, Row] | None = None
        for row in self.tables["cusparse"]:
            first = Version.parse(row["cusparse"])
            if first <= version and (best is None or first > best[0]):
                best = (first, row)
        return best[1] if best else None

    def forward_compat(self) -> Row | None:
        rows = self.tables["forward_compat"]
        return rows[0] if rows else None

    # -- libraries and frameworks ---------------------------------------------------------

    def cudnn_rows(self, version: Version, cuda_major: int | None = None) -> list[Row]:
        return [r for r in self.tables["cudnn"]
                if VersionRange.parse(r["versions"]).contains(version)
                and (cuda_major is None or r["cuda_major"] == cuda_major)]

    def torch_rows(self, line: str) -> list[Row]:
        want = Version.parse(line).trunc(2)
        return [r for r in self.tables["torch"] if Version.parse(r["torch"]).trunc(2) == want]

    def torch_row(self, line: str, variant: str) -> Row | None:
        return next((r for r in self.torch_rows(line) if r["variant"].lower() == variant.lower()),
                    None)

    def tensorflow_row(self, version: Version) -> Row | None:
        want = version.trunc(2)
        return next((r for r in self.tables["tensorflow"]
                     if Version.parse(r["tensorflow"]).trunc(2) == want), None)

    def jax_rows(self, version: Version) -> list[Row]:
        return [r for r in self.tables["jax"] if VersionRange.parse(r["jax"]).contains(version)]

    def ctranslate2_row(self, version: Version) -> Row | None:
        return next((r for r in self.tables["ctranslate2"]
                     if VersionRange.parse(r["ctranslate2"]).contains(version)), None)

    def triton_row(self, version: Version) -> Row | None:
        """The Triton release row (its bundled ptxas) of ``version`` (3.2.0, 3.5.0+git7416ffcb)."""
        return next((r for r in self.tables["triton"]
                     if VersionRange.parse(r["triton"]).contains(version)), None)

    def triton_pin(self, torch: Version) -> Row | None:
        """The Triton a torch release pins (its Linux wheels' ``triton==X`` requirement)."""
        return next((r for r in self.tables["triton_pins"]
                     if VersionRange.parse(r["torch"]).contains(torch)), None)

    def cupy_row(self, package: str) -> Row | None:
        return next((r for r in self.tables["cupy"] if r["package"] == package.lower()), None)

    def cupy_gpu(self, arch: Row) -> Row | None:
        """The ``cupy_gpus`` row of a GPU generation (an ``architectures`` row)."""
        cc = CC.parse(arch["cc"])
        return next((r for r in self.tables.get("cupy_gpus", [])
                     if any(CC.parse(c) == cc for c in r["cc"])), None)


def load_matrix(overlays: Sequence[Path | str] = ()) -> Matrix:
    """The bundled matrix with ``$DNNCTL_MATRIX`` and ``overlays`` applied on top, in order."""
    base = _bundled(tuple((str(p), st.st_mtime_ns, st.st_size)
                          for p in sorted(compat_dir().glob("*.yaml")) if (st := p.stat())))
    matrix = Matrix({t: list(rows) for t, rows in base.tables.items()}, list(base.files))
    env = [p for p in os.environ.get(ENV_VAR, "").split(os.pathsep) if p.strip()]
    for path in [*env, *overlays]:
        _merge(matrix, Path(path), base=False)
    return matrix


@functools.lru_cache(maxsize=4)
def _bundled(files: tuple[tuple[str, int, int], ...]) -> Matrix:
    """The shipped tables, validated once per process and cached across processes as JSON
    (keyed by every file's path, mtime and size; see dnnctl.compat.cache)."""
    hit = cache.load(files)
    if hit is not None:
        return Matrix(hit, [p for p, _, _ in files])
    matrix = Matrix()
    for path, _, _ in files:
        _merge(matrix, Path(path), base=True, label=f"compat/{Path(path).name}")
    cache.store(files, matrix.tables)
    return matrix


def _merge(matrix: Matrix, path: Path, *, base: bool, label: str | None = None) -> None:
    data = _read(path)
    seen: dict[tuple[str, tuple[str, ...]], Row] = {}
    for table, rows in data.items():
        if table == "schema":
            continue
        for row in rows:
            row.file = label or str(path)
            validate_row(table, row)
            key = row_key(table, row)
            if (table, key) in seen:  # the same key twice in one file contradicts itself
                raise InputFileError(str(path), f"duplicate row {key} in table {table} (also at "
                                     f"line {seen[(table, key)].line})",
                                     "merge the two rows, or mark the fact certainty: '?' with "
                                     "both sources in 'conflicts'", line=row.line)
            seen[(table, key)] = row
            existing = matrix.tables[table]
            index = next((i for i, r in enumerate(existing) if row_key(table, r) == key), None)
            if index is None:
                existing.append(row)
            elif base:
                raise InputFileError(str(path), f"row {key} of table {table} is already defined at "
                                     f"{existing[index].where}", line=row.line)
            else:
                existing[index] = row
    matrix.files.append(str(path))


def _read(path: Path) -> dict[str, list[Row]]:
    import yaml

    loader = _line_loader()
    text = read_input(path, hint="check the path given to --matrix / DNNCTL_MATRIX")
    check_yaml_shape(text, path, loader)
    try:
        data = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except (ValueError, RecursionError, OverflowError) as exc:  # e.g. a 4,300-digit number
        raise InputFileError(str(path), f"a value cannot be read: {str(exc)[:120]}",
                             "matrix values are short strings, numbers and lists") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputFileError(str(path), f"not valid YAML: {getattr(exc, 'problem', exc)}",
                             "fix the YAML syntax (indentation, quotes, colons)",
                             line=mark.line + 1 if mark else None) from None
    if not isinstance(data, dict):
        raise InputFileError(str(path), "a matrix file must be a mapping of tables",
                             f"start the file with 'schema: {MATRIX_SCHEMA}' and table names")
    if data.get("schema") != MATRIX_SCHEMA:
        raise InputFileError(str(path), f"schema must be {MATRIX_SCHEMA!r}, got "
                             f"{data.get('schema')!r}", f"add 'schema: {MATRIX_SCHEMA}'", line=1)
    out: dict[str, list[Row]] = {}
    for table, rows in data.items():
        if table == "schema":
            continue
        if table not in TABLES:
            raise InputFileError(str(path), f"unknown table {table!r}",
                                 f"tables: {', '.join(TABLES)}", line=_line_of(text, table))
        if not isinstance(rows, list):
            raise InputFileError(str(path), f"table {table!r} must be a list of rows",
                                 line=_line_of(text, table))
        for row in rows:
            if not isinstance(row, Row):
                raise InputFileError(str(path), f"table {table!r}: every row must be a mapping",
                                     line=_line_of(text, table), where=f"table {table}")
        out[table] = rows
    return out


def _line_of(text: str, key: str) -> int | None:
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith(f"{key}:"):
            return n
    return None


def iter_rows(matrix: Matrix, tables: Iterable[str] | None = None) -> Iterable[tuple[str, Row]]:
    for table in tables or TABLES:
        for row in matrix.tables[table]:
            yield table, row


def as_plain(row: Row) -> dict[str, Any]:
    """A row as a plain dict (for JSON output)."""
    return dict(row)
