"""The matrix schema: one spec per table, checked row by row with file and line in errors.

A JSON-schema-like description kept in Python: each table lists its fields with a kind and
whether they are required, and the fields that identify a row (an overlay row with the same
key replaces the bundled one). Every row carries ``source`` and ``certainty``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dnnctl.compat.inputs import check_pattern
from dnnctl.compat.versions import CC, Target, Version, VersionRange, release_key
from dnnctl.errors import InputFileError, UsageError

MATRIX_SCHEMA = "dnnctl-matrix/1"
CERTAINTIES = ("V", "S", "?")


class Row(dict):
    """A table row: a plain dict that remembers its file and line."""

    file: str = "?"
    line: int | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file

    @property
    def uncertain(self) -> bool:
        return self.get("certainty") == "?"


@dataclass(frozen=True)
class Field:
    kind: str
    required: bool = False
    choices: tuple[str, ...] = ()


def F(kind: str, required: bool = False, *choices: str) -> Field:  # noqa: N802 - table DSL
    return Field(kind, required, tuple(choices))


_COMMON = {"source": F("text", True), "certainty": F("certainty", True),
           "conflicts": F("list_text"), "note": F("text")}

TABLES: dict[str, tuple[tuple[str, ...], dict[str, Field]]] = {
    "cuda_majors": (("major",), {
        "major": F("int", True), "mvc": F("bool"), "mvc_min_driver": F("version"),
        "mvc_min_driver_windows": F("version")}),
    "cuda_releases": (("version",), {
        "version": F("version", True), "driver_linux": F("version"), "driver_windows": F("version"),
        "updates": F("version_map"), "targets": F("cc_list", True), "arch_specific": F("cc_list"),
        "family": F("cc_list"), "deprecated": F("cc_list"), "dropped": F("cc_list"),
        "renamed": F("cc_map")}),
    "cusparse": (("cusparse",), {
        "cusparse": F("version", True), "cuda": F("version", True)}),
    "forward_compat": (("name",), {
        "name": F("text", True), "package": F("text", True), "gpu_classes": F("list_text", True),
        "error": F("text"), "branch_types": F("list_text")}),
    "driver_branches": (("branch",), {
        "branch": F("int", True), "type": F("choice", True, "PB", "LTSB", "NFB"), "eol": F("text"),
        "last_for": F("list_text")}),
    "architectures": (("cc",), {
        "cc": F("cc", True), "name": F("text", True), "family": F("text", True),
        "min_cuda": F("version", True), "last_cuda": F("version"), "min_driver": F("version"),
        "last_driver_branch": F("int"), "aliases": F("cc_list")}),
    # gpu_chips: a GPU die's codename (pci.ids names a board "GP108 [GeForce GT 1030]") ->
    # its compute capability, for boards the gpus table does not list
    "gpu_chips": (("cc",), {"cc": F("cc", True), "chips": F("list_text", True)}),
    "gpus": (("model",), {
        "model": F("text", True), "match": F("regex_list", True), "cc": F("cc", True),
        "class": F("choice", True, "datacenter", "workstation", "consumer", "jetson"),
        "platform": F("choice", False, "x86_64", "aarch64"), "examples": F("list_text", True)}),
    # nvswitch_gpus: GPUs sold on NVSwitch baseboards (they need nvidia-fabricmanager there);
    # switches: how the host sees the NVSwitches (driver: /proc/driver/nvidia-nvswitch/devices,
    # nvlink5: an InfiniBand port); board_gpus: the GPU count of that baseboard
    "nvswitch_gpus": (("model",), {
        "model": F("text", True), "match": F("regex_list", True),
        "switches": F("choice", True, "driver", "nvlink5"), "board_gpus": F("int", True),
        "board": F("bool"), "examples": F("list_text", True)}),
    # fabric_manager_packages: driver releases -> the package of their Fabric Manager
    # ({version}: the driver's exact version, {branch}: its major)
    "fabric_manager_packages": (("driver",), {
        "driver": F("range", True), "apt": F("text", True), "rpm": F("text", True)}),
    # kernel_module_flavors: NVIDIA's open and proprietary kernel modules -> the GPUs each
    # drives (min_cc / below_cc; not_match: GPU names it does not drive) and how to switch to
    # it ({branch}: the driver's major)
    "kernel_module_flavors": (("flavor",), {
        "flavor": F("choice", True, "open", "proprietary"), "min_cc": F("cc"),
        "below_cc": F("cc"), "not_match": F("regex_list"), "install_apt": F("text", True),
        "install_apt_debian": F("text", True), "install_dnf": F("text", True),
        "install_dnf_module": F("text", True), "runfile": F("text", True)}),
    # nvcc_host_compilers: CUDA releases -> the gcc / clang majors their nvcc's host_config.h
    # accepts (*_uncertain: majors the sources disagree on)
    "nvcc_host_compilers": (("cuda",), {
        "cuda": F("range", True), "gcc_min": F("int"), "gcc_max": F("int"),
        "gcc_uncertain": F("list_text"), "clang_min": F("int"), "clang_max": F("int"),
        "clang_uncertain": F("list_text")}),
    # nvcc_msvc: CUDA releases -> the _MSC_VER range (msvc_max inclusive) their host_config.h
    # accepts on Windows (msvc_uncertain: _MSC_VER values the sources disagree on)
    "nvcc_msvc": (("cuda",), {
        "cuda": F("range", True), "msvc_min": F("int", True), "msvc_max": F("int", True),
        "msvc_uncertain": F("list_text")}),
    "mig_enumeration": (("driver",), {
        "driver": F("version", True), "per": F("choice", True, "process", "gpu_instance")}),
    "cudnn": (("versions", "cuda_major"), {
        "versions": F("range", True), "cuda_major": F("int", True), "cuda": F("range", True),
        "driver_linux": F("version", True), "cc": F("cc_list", True), "cc_uncertain": F("cc_list"),
        "cc_needs_cuda": F("cc_version_map"), "pip": F("text_or_null")}),
    "torch": (("torch", "variant"), {
        "torch": F("version", True), "variant": F("text", True), "cuda": F("version", True),
        "cudnn": F("version"), "status": F("choice", True, "stable", "experimental"),
        "pypi_default": F("bool"), "python": F("range"), "arch_list": F("target_list", True),
        "arch_list_aarch64": F("target_list"), "arch_uncertain": F("target_list"),
        "index_url": F("text"), "nccl": F("version")}),
    "tensorflow": (("tensorflow",), {
        "tensorflow": F("version", True), "python": F("range"), "cuda": F("version", True),
        "cudnn": F("version", True), "arch_list": F("target_list"), "pip_extra": F("text")}),
    # tensorflow_floors: TensorFlow releases [first, before) -> the lowest compute capability
    # their official GPU binaries run on (the runtime ignores a GPU below it), per OS where the
    # builds differ (os absent: every OS); built_for: the capabilities built, where a source
    # names them; install: the pip requirement naming these releases, for a fix
    "tensorflow_floors": (("first", "os"), {
        "first": F("release", True), "before": F("release"),
        "os": F("choice", False, "linux", "windows"), "min_cc": F("cc", True),
        "built_for": F("cc_list"), "install": F("text")}),
    "jax": (("jax", "plugin"), {
        "jax": F("range", True), "plugin": F("int", True), "cuda": F("range", True),
        "cudnn": F("version", True), "cudnn_max": F("version"), "arch_list": F("target_list", True),
        "install": F("text", True)}),
    "ctranslate2": (("ctranslate2",), {
        "ctranslate2": F("range", True), "cuda": F("version", True),
        "uses_cudnn": F("bool", True), "cudnn": F("version")}),
    # paddlepaddle-gpu: a release range and a wheel's .postNNN tag -> its CUDA and minimum cuDNN;
    # os: the row holds for that OS only (where Paddle's Linux and Windows pages differ)
    "paddle": (("paddle", "tag", "os"), {
        "paddle": F("range", True), "tag": F("text", True), "cuda": F("version", True),
        "cudnn": F("version", True), "index": F("text"), "cudnn_apt": F("text"),
        "os": F("choice", False, "linux", "windows")}),
    # paddle3: paddlepaddle-gpu 3.x wheels carry no .postNNN tag; the CUDA variant is the
    # package index they come from (and the nvidia-* runtime wheels they require);
    # code_for / no_code_for: compute capabilities a variant is known to run on / to have no
    # code for (the rest is not known: not judged)
    "paddle3": (("paddle", "variant"), {
        "paddle": F("range", True), "variant": F("text", True), "cuda": F("version", True),
        "index": F("text", True), "code_for": F("cc_list"), "no_code_for": F("cc_list")}),
    "onnxruntime": (("onnxruntime", "cuda"), {
        "onnxruntime": F("range", True), "cuda": F("version", True), "cudnn": F("version", True),
        "pypi": F("bool", True)}),
    # onnxruntime's TensorRT execution provider: the TensorRT major.minor a release is built with
    "onnxruntime_tensorrt": (("onnxruntime",), {
        "onnxruntime": F("range", True), "tensorrt": F("version", True)}),
    "triton": (("triton",), {
        "triton": F("range", True), "ptxas": F("version", True),
        "ptxas_blackwell": F("version")}),
    "triton_pins": (("torch",), {
        "torch": F("range", True), "triton": F("version", True)}),
    # gpu_minimums: packages: more distributions the row covers (a suite's), each also under
    # its -cuNN wheel name unless listed with one
    "gpu_minimums": (("package", "versions"), {
        "package": F("text", True), "versions": F("range", True), "min_cc": F("cc", True),
        "severity": F("choice", True, "error", "warning"), "feature": F("text", True),
        "symptom": F("text", True), "fix": F("text", True), "fixed": F("version"),
        "all_releases": F("bool"), "packages": F("list_text")}),
    "cupy": (("package",), {
        "package": F("text", True), "cupy": F("range", True), "cuda": F("range", True),
        "install": F("text", True)}),
    # cupy_gpus: GPU generations (an architectures row's cc) -> the first CuPy release with
    # code of its own for them, and the releases whose run-time (NVRTC) kernels fail on them
    "cupy_gpus": (("cc",), {
        "cc": F("cc_list", True), "first": F("version", True), "fails": F("range")}),
    "package_conflicts": (("name",), {
        "name": F("text", True), "pattern": F("regex", True),
        "severity": F("choice", True, "error", "warning"), "why": F("text", True),
        "fix": F("text", True)}),
    # xformers: a release as written ("0.0.29.post2"); torch: the release its wheels pin;
    # later_torch: built against torch's stable ABI, so later torch releases load it too
    "xformers": (("xformers",), {
        "xformers": F("text", True), "torch": F("version", True), "later_torch": F("bool")}),
    # pyg_wheels: a torch line ("2.1") -> the data.pyg.org/whl index PyG's extension wheels
    # for it are on (torch-<index>+<variant>.html) and the variants that index carries
    "pyg_wheels": (("torch",), {
        "torch": F("version", True), "index": F("version", True),
        "variants": F("list_text", True)}),
    # bitsandbytes_cuda: releases -> the CUDA releases (major.minor) whose native library its
    # wheels carry; same_major: a missing minor falls back to another library of its major;
    # first: the first release of the range with these libraries, where it is a post release
    "bitsandbytes_cuda": (("bitsandbytes",), {
        "bitsandbytes": F("range", True), "cuda": F("list_text", True), "same_major": F("bool"),
        "first": F("text")}),
    # dgl: releases -> the torch they are documented for, and the torch below which
    # `import dgl` raises (python/dgl/backend/pytorch/tensor.py); index: the pip find-links
    # page of its CUDA builds, {torch} = torch's major.minor, {variant} = cuXYZ
    "dgl": (("dgl",), {
        "dgl": F("range", True), "torch": F("range", True), "raises_below": F("version", True),
        "index": F("text", True)}),
    # dgl_wheels: DGL releases (and, from 2.2, torch lines) -> the +cuXYZ builds published
    # for them; releases: the releases of the range
    "dgl_wheels": (("dgl", "torch"), {
        "dgl": F("range", True), "torch": F("range"), "variants": F("list_text", True),
        "releases": F("list_text", True)}),
    # jaxlib_minimum: jax releases -> the oldest jaxlib their import check accepts, and whether
    # it also rejects a jaxlib newer than jax (from 0.3.0)
    "jaxlib_minimum": (("jax",), {
        "jax": F("range", True), "jaxlib": F("version", True), "rejects_newer": F("bool", True)}),
    # vllm_torch: vLLM releases -> their wheels' torch requirement; built_line: the torch line
    # a wheel whose requirement is only a floor was built against
    "vllm_torch": (("vllm",), {
        "vllm": F("range", True), "torch": F("range", True), "built_line": F("version")}),
    # mmdet_mmcv: MMDetection releases -> the mmcv range its import asserts; upper: the
    # comparison with the maximum ("<=" in 2.x, "<" in 3.x)
    "mmdet_mmcv": (("mmdet",), {
        "mmdet": F("list_text", True), "mmcv_min": F("text", True), "mmcv_max": F("text", True),
        "upper": F("choice", True, "<=", "<")}),
    # prebuilt_pins: prebuilt add-on packages whose compiled code is built for one torch line
    # (against: torch) or needs the CUDA runtime of one release (against: cuda); releases: the
    # releases of the row; build: that torch line or CUDA release; bundled: a CUDA build of the
    # same releases that brings its own runtime (so a mismatch is only likely); install: the
    # command for one of these releases, {release} and {tag} (build without dots) filled in;
    # index: the extra pip index of a torch CUDA variant ({variant}: cu118), added to the
    # command where the variant of the torch here is known
    "prebuilt_pins": (("package", "releases", "build"), {
        "package": F("text", True), "releases": F("list_text", True),
        "against": F("choice", True, "torch", "cuda"), "build": F("version", True),
        "bundled": F("version"), "install": F("text", True), "index": F("text")}),
    # broken_releases: a release whose build for one OS is broken (it installs, then fails),
    # the failure as users see it, and the release that fixes it
    "broken_releases": (("package", "release", "os"), {
        "package": F("text", True), "release": F("version", True),
        "os": F("choice", True, "windows", "linux", "macos"), "symptom": F("text", True),
        "fixed_in": F("version", True)}),
    # libcuda_paths: a libcuda the loader finds first that is not the driver's (match: a
    # pattern of its path, e.g. a toolkit's stubs directory)
    "libcuda_paths": (("name",), {
        "name": F("text", True), "match": F("regex", True), "what": F("text", True),
        "symptom": F("text", True)}),
    # library_dlls: a library's releases that load a DLL / shared library nothing installs
    # with them on one OS; brought_by: the sources of a copy that does bring it (torch:, conda:)
    "library_dlls": (("library", "versions", "os"), {
        "library": F("text", True), "versions": F("range", True),
        "os": F("choice", True, "windows", "linux"), "dll": F("text", True),
        "symptom": F("text", True), "fix": F("text", True), "brought_by": F("list_text")}),
    # tensorrt_builds: TensorRT releases -> the CUDA majors they are built for (one build per
    # major, linked against that major's libraries), those of them with a tensorrt-cuNN pip
    # wheel, and the CUDA libraries its libnvinfer links where a source names them
    "tensorrt_builds": (("tensorrt",), {
        "tensorrt": F("range", True), "cuda_majors": F("list_text", True),
        "pip_majors": F("list_text"), "libraries": F("list_text")}),
    # undriven_gpus: why a driver can see fewer GPUs than the machine has; below_cc: GPUs
    # under this compute capability are the ones it leaves out (absent: any GPU); check: the
    # commands that tell which cause it is; fix: what to do when it is this one
    "undriven_gpus": (("cause",), {
        "cause": F("text", True), "below_cc": F("version"), "what": F("text", True),
        "check": F("text", True), "fix": F("text", True)}),
    # conda_cuda_runtimes: a conda package built for one CUDA release (its build string says
    # cudaX.Y) whose CUDA runtime comes from another conda package (runtime) of that release
    "conda_cuda_runtimes": (("package", "releases"), {
        "package": F("text", True), "releases": F("range", True), "runtime": F("text", True),
        "install": F("text", True)}),
    # gpu_packages: packages that ship CUDA code of their own: what their build is tied to
    # (built_for) and how to check it (check), said where no rule judged them; packages: more
    # names, each also under a -cuNN wheel name; tabled: a table of its own judges it
    "gpu_packages": (("package",), {
        "package": F("text", True), "packages": F("list_text"), "built_for": F("text", True),
        "check": F("text", True), "tabled": F("bool")}),
    # tensorrt_gpus: TensorRT releases -> the oldest and newest compute capability they
    # support (compat/limits.yaml); cc_uncertain: capabilities the sources leave open
    "tensorrt_gpus": (("tensorrt",), {
        "tensorrt": F("range", True), "min_cc": F("cc"), "max_cc": F("cc"),
        "cc_uncertain": F("cc_list")}),
    # source_build_floors: the lowest compute capability a framework's own build accepts
    "source_build_floors": (("framework",), {
        "framework": F("text", True), "min_cc": F("cc", True)}),
    # os_builds: package families with no native build for an OS, only through ``via``
    "os_builds": (("package", "os"), {
        "package": F("text", True), "os": F("choice", True, "windows", "macos"),
        "via": F("text", True), "packages": F("list_text"), "family": F("text", True),
        "fix": F("text", True)}),
    # conda_cpu_builds: a package whose conda-forge build for an OS has no CUDA (conda_names:
    # its conda-forge package names; error: what GPU use then raises)
    "conda_cpu_builds": (("package", "os"), {
        "package": F("text", True), "os": F("choice", True, "windows", "linux", "macos"),
        "conda_names": F("list_text", True), "error": F("text", True), "fix": F("text", True)}),
    # error_messages: error messages users see -> what they mean and what causes them
    # (compat/errors.yaml, doctor --error): match: patterns of the message (named groups capture
    # what a cause's check reads); example: the message as its source quotes it; component:
    # what raises it; causes: CAUSE_FIELDS; implies: snapshot facts the message itself states;
    # severity: of a decided cause (default error; warning: the program's choice, not the
    # installation)
    # cuda_error_codes: a CUDA error's number -> its names in the runtime (cudaError_t) and
    # the driver API (CUresult), for messages that print only the number ("cudart init
    # failure: 802"); only numbers that mean the same in both, and in runtimes before CUDA
    # 10.1's renumbering, are listed
    "cuda_error_codes": (("code",), {
        "code": F("int", True), "runtime": F("text", True), "driver": F("text")}),
    "error_messages": (("id",), {
        "id": F("text", True), "match": F("regex_list", True), "example": F("text", True),
        "component": F("text", True), "meaning": F("text", True),
        "causes": F("cause_list", True), "fix": F("text", True), "implies": F("list_text"),
        "severity": F("choice", False, "error", "warning")}),
}
# One cause of an error message: cause (what happened), fact (the check of dnnctl.doctor's
# error_facts that reads it from a snapshot, "name" or "name:argument"), codes (doctor
# findings that establish it, "code" or "code@component"), tell (how to tell it from the
# others by hand), fix (what to do when it is this one)
CAUSE_FIELDS = {"cause": F("text", True), "fact": F("text"), "codes": F("list_text"),
                "tell": F("text"), "fix": F("text")}


def row_key(table: str, row: dict[str, Any]) -> tuple[str, ...]:
    """The identity of a row: an overlay row with the same key replaces the bundled one."""
    fields = TABLES[table][0]
    return tuple(_norm_key(row.get(f)) for f in fields)


def _norm_key(value: Any) -> str:
    text = str(value).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)*", text):  # "12.0" and "12" are the same release
        return ".".join(map(str, Version.parse(text).key))
    return re.sub(r"\s+", "", text)


def validate_row(table: str, row: Row) -> None:
    """Raise InputFileError (file:line, field) when the row does not fit its table."""
    spec = {**TABLES[table][1], **_COMMON}
    if not isinstance(row, dict):
        _fail(row, table, None, "a row must be a mapping")
    for name in row:
        if name not in spec:
            _fail(row, table, name, f"unknown field {name!r}",
                  hint=f"fields of {table}: {', '.join(sorted(spec))}")
    for name, field in spec.items():
        if name not in row or row[name] is None:
            if field.required and not (field.kind == "text_or_null" and name in row):
                _fail(row, table, name, f"missing required field {name!r}")
            continue
        problem = _check(field, row[name])
        if problem:
            _fail(row, table, name, f"field {name!r}: {problem}")
    if not str(row.get("source", "")).strip():
        _fail(row, table, "source", "every row needs a source (URL or document + section)")


def _fail(row: Any, table: str, field: str | None, message: str, hint: str | None = None) -> None:
    file = getattr(row, "file", "?")
    line = getattr(row, "line", None)
    where = f"table {table}" + (f", field {field}" if field else "")
    raise InputFileError(file, message, hint or "see compat/README.md for the matrix schema",
                         line=line, where=where)


def _check(field: Field, value: Any) -> str | None:
    k = field.kind
    try:
        if k in ("text", "text_or_null"):
            return None if isinstance(value, str) and value.strip() else "expected text"
        if k == "certainty":
            return None if value in CERTAINTIES else f"expected one of {', '.join(CERTAINTIES)}"
        if k == "choice":
            return None if value in field.choices else f"expected one of {', '.join(field.choices)}"
        if k == "int":
            return None if isinstance(value, int) and not isinstance(value, bool) else "expected an integer"
        if k == "bool":
            return None if isinstance(value, bool) else "expected true or false"
        if k == "version":
            return _version_text(value)
        if k == "release":
            if not isinstance(value, str):
                return 'quote releases ("0.12.0rc1")'
            release_key(value)
            return None
        if k == "range":
            VersionRange.parse(str(value))
            return None
        if k == "cc":
            CC.parse(value)
            return None if isinstance(value, str) else 'quote compute capabilities ("9.0")'
        if k == "regex":
            return check_pattern(value)
        if k in ("list_text", "regex_list", "cc_list", "target_list"):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                return "expected a list of strings"
            for v in value:
                if k == "regex_list" and check_pattern(v):
                    return check_pattern(v)
                elif k == "cc_list":
                    CC.parse(v)
                elif k == "target_list":
                    Target.parse(v)
            return None
        if k in ("version_map", "cc_map", "cc_version_map"):
            if not isinstance(value, dict):
                return "expected a mapping"
            for a, b in value.items():
                if k == "version_map":
                    Version.parse(a)
                    if _version_text(b):
                        return _version_text(b)
                elif k == "cc_map":
                    CC.parse(a), CC.parse(b)
                else:
                    CC.parse(a)
                    Version.parse(b)
            return None
        if k == "cause_list":
            return _cause_list(value)
    except (UsageError, re.error) as exc:
        return str(getattr(exc, "message", exc))
    return f"unknown field kind {k}"


def _cause_list(value: Any) -> str | None:
    """Why ``value`` is not a list of causes (mappings of CAUSE_FIELDS), or None."""
    if not isinstance(value, list) or not value:
        return "expected a list of causes"
    for i, cause in enumerate(value):
        if not isinstance(cause, dict):
            return f"cause {i + 1}: expected a mapping"
        for name in cause:
            if name not in CAUSE_FIELDS:
                return f"cause {i + 1}: unknown field {name!r} (fields: {', '.join(CAUSE_FIELDS)})"
        for name, field in CAUSE_FIELDS.items():
            if cause.get(name) is None:
                if field.required:
                    return f"cause {i + 1}: missing {name!r}"
                continue
            problem = _check(field, cause[name])
            if problem:
                return f"cause {i + 1}, {name}: {problem}"
    return None


def _version_text(value: Any) -> str | None:
    if not isinstance(value, str):
        return 'quote versions ("570.26"): YAML would read 12.10 as the number 12.1'
    Version.parse(value)
    return None
