"""``dnnctl-env/1`` snapshot files: validated loading and atomic saving.

Files are parsed with PyYAML's SafeLoader into nodes (``yaml.compose``), which keeps line
numbers for error messages and the exact text of every scalar, so an unquoted ``cuda: 12.10``
stays "12.10" instead of becoming the float 12.1. No tag outside YAML's core schema is
accepted and nothing is ever constructed from one. Every field is checked; an error names
the file, the line and the field. Any field may be absent (= unknown), so a hand-written
planned deployment such as ``{gpus: [{name: B200}], frameworks: {torch: {version:
2.2.0+cu121}}}`` loads as it is. A ``dnnctl-doctor/1`` JSON report is accepted too (its env).
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from dnnctl.compat.inputs import check_yaml_shape, read_input
from dnnctl.compat.versions import Version
from dnnctl.doctor import requirements
from dnnctl.doctor.model import (
    COMPUTE_MODES,
    DOCTOR_SCHEMA,
    DRIVER_FIELDS,
    ENV_SCHEMA,
    ENVIRONMENT_FIELDS,
    EXTENSION_FIELDS,
    FABRIC_FIELDS,
    FABRIC_STATES,
    FRAMEWORK_FIELDS,
    KERNEL_MODULE_TYPES,
    LIBRARIES,
    MIG_FIELDS,
    SEARCHED,
    SYSTEM_FIELDS,
    TOOLCHAIN_FIELDS,
    Component,
    EnvSnapshot,
    Gpu,
    compute_mode,
    fabric_state,
)
from dnnctl.doctor.parse import driver_branch, msc_ver_span
from dnnctl.errors import InputFileError, UsageError

# kinds of field whose value is one of a few words: (reader -> the word or None, the words,
# what the field is, how nvidia-smi's own spelling is read)
_CHOICES: dict[str, tuple[Any, tuple[str, ...], str, str]] = {
    "fabric_state": (fabric_state, FABRIC_STATES, "fabric state",
                     " (nvidia-smi -q's 'In Progress' is read as in_progress)"),
    "compute_mode": (compute_mode, COMPUTE_MODES, "compute mode",
                     " (nvidia-smi's 'Exclusive_Process' is read as exclusive_process)"),
    "module_type": (lambda t: t.strip().lower() if t.strip().lower() in KERNEL_MODULE_TYPES
                    else None, KERNEL_MODULE_TYPES, "kernel module type", ""),
}

_CORE = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map",
                                             "seq")}
GPU_FIELDS = {"index": "int", "name": "str", "compute_capability": "cc", "memory_mib": "int",
              "uuid": "str", "mig": MIG_FIELDS, "fabric": FABRIC_FIELDS,
              "compute_mode": "compute_mode", "display_active": "bool", "watchdog": "bool"}
COMPONENT_FIELDS = {"version": "version", "source": "str", "path": "str", "loaded_first": "bool"}
TOP_FIELDS = ("schema", "os", "python", "driver", "gpus", "environment", "toolchain", "system",
              "cuda_runtimes", "cudnn", "libraries", "frameworks", "extensions", "live",
              "packages", "requires", "errors", "notes")
MAX_VALUE = 8192  # characters in one scalar (paths included)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
HINT = ("see `dnnctl doctor --save env.yaml` for the format; every field is optional "
        "(absent = unknown)")


class _Reader:
    """Walks the node tree of one file, raising InputFileError with line and field."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, node: yaml.Node | None, where: str, message: str,
             hint: str | None = HINT) -> InputFileError:
        line = node.start_mark.line + 1 if node is not None else None
        return InputFileError(str(self.path), message, hint, line=line, where=where or None)

    def mapping(self, node: yaml.Node, where: str, allowed: tuple[str, ...] | dict
                ) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, where, f"expected a mapping, got {_kind(node)}")
        out: dict[str, yaml.Node] = {}
        for knode, vnode in node.value:
            key = self.scalar_text(knode, where)
            if key in out:
                raise self.fail(knode, where, f"duplicate key '{key}'")
            if allowed and key not in allowed:
                near = difflib.get_close_matches(key, list(allowed), n=1)
                raise self.fail(knode, _join(where, key), f"unknown field '{key}'"
                                + (f" (did you mean '{near[0]}'?)" if near else ""),
                                "allowed here: " + ", ".join(allowed))
            out[key] = vnode
        return out

    def scalar_text(self, node: yaml.Node, where: str) -> str:
        self.check_tag(node, where)
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, where, f"expected a single value, got {_kind(node)}")
        if len(node.value) > MAX_VALUE:
            raise self.fail(node, where, f"value longer than {MAX_VALUE} characters")
        return str(node.value)

    def check_tag(self, node: yaml.Node, where: str) -> None:
        if node.tag not in _CORE:
            raise self.fail(node, where, f"YAML tag {node.tag!r} is not allowed",
                            "snapshots hold plain values only")

    def value(self, node: yaml.Node, kind: str, where: str) -> Any:
        """One typed field: str (exact text), int, bool, strlist, archlist (a list, or one
        TORCH_CUDA_ARCH_LIST string such as "7.0;8.0+PTX") or cc (compute capability)."""
        self.check_tag(node, where)
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            return None
        if kind == "archlist":
            if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":str"):
                return [self.scalar_text(node, where)]
            kind = "strlist"
        if kind == "strlist":
            if not isinstance(node, yaml.SequenceNode):
                raise self.fail(node, where, f"expected a list, got {_kind(node)}")
            return [self.scalar_text(n, f"{where}[{i}]") for i, n in enumerate(node.value)]
        text = self.scalar_text(node, where)
        if kind == "str":
            return text
        if kind == "int":
            if node.tag.endswith(":int") and re.fullmatch(r"[+]?\d{1,9}", text):
                return int(text)
            raise self.fail(node, where, f"expected a whole number, got {_show(text)}")
        if kind in ("version_or_bool", "str_or_bool", "msvc_or_bool") and \
                node.tag.endswith(":bool"):
            return text.lower() in ("true", "yes", "on", "y")
        if kind == "str_or_bool":
            return text
        if kind == "msvc_or_bool":
            if msc_ver_span(text) is None:
                raise self.fail(node, where, f"not an MSVC version: {_show(text)}",
                                'write cl.exe\'s "19.29.30133", _MSC_VER "1929", the toolset '
                                '"14.29" or Visual Studio\'s "VS 2022 17.10"')
            return text
        if kind == "driver_version":
            if Version.maybe(text) is None and driver_branch(text) is None:
                raise self.fail(node, where, f"not a version: {_show(text)}",
                                'write it as "580.159.04", or its branch alone as "580"')
            return text
        if kind in ("version", "version_or_bool"):
            if Version.maybe(text) is None:
                raise self.fail(node, where, f"not a version: {_show(text)}",
                                'write dotted numbers, e.g. "580.159.04" or "2.5.1+cu124"')
            return text
        if kind == "bool":
            if node.tag.endswith(":bool"):
                return text.lower() in ("true", "yes", "on", "y")
            raise self.fail(node, where, f"expected true or false, got {text!r}")
        if kind in _CHOICES:
            read, choices, what, note = _CHOICES[kind]
            value = read(text)
            if value is None:
                raise self.fail(node, where, f"not a {what}: {_show(text)}",
                                "one of " + ", ".join(choices) + note)
            return value
        if kind == "cc":
            cc = normalize_cc(text)
            if cc is None:
                raise self.fail(node, where, f"not a compute capability: {text!r}",
                                'write it as "9.0" (or sm_90)')
            return cc
        raise AssertionError(kind)

    def record(self, node: yaml.Node, where: str, spec: dict[str, Any]) -> dict[str, Any]:
        """A mapping of typed fields; a field whose kind is a dict is a nested record, one
        whose kind is ``[dict]`` a list of such records (a bare value names its ``name``)."""
        out = {}
        for key, vnode in self.mapping(node, where, spec).items():
            kind = spec[key]
            if isinstance(vnode, yaml.ScalarNode) and vnode.tag.endswith(":null"):
                continue  # absent = unknown
            if isinstance(kind, list):
                value = [_shorthand(self, n, f"{_join(where, key)}[{i}]", kind[0], "name")
                         for i, n in enumerate(self.items(vnode, _join(where, key)))]
                out[key] = value
                continue
            value = (self.record(vnode, _join(where, key), kind) if isinstance(kind, dict)
                     else self.value(vnode, kind, _join(where, key)))
            if value is not None:
                out[key] = value
        return out

    def items(self, node: yaml.Node, where: str) -> list[yaml.Node]:
        self.check_tag(node, where)
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            return []
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, where, f"expected a list, got {_kind(node)}")
        return list(node.value)


def _show(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text)} characters)"


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"the value {node.value!r}" if node.value != "" else "nothing"


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def normalize_cc(text: str) -> str | None:
    """"9.0", "9", "sm_90", "90", "sm_100a", "12.0" -> "9.0" / "10.0" / "12.0"."""
    t = text.strip().lower()
    m = re.fullmatch(r"(\d{1,2})\.(\d)[af]?", t)
    if m:
        return f"{int(m.group(1))}.{m.group(2)}"
    m = re.fullmatch(r"(?:sm_|compute_)?(\d{1,2})(\d)[af]?", t)
    if m:
        return f"{int(m.group(1))}.{m.group(2)}"
    m = re.fullmatch(r"(\d{1,2})", t)
    return f"{int(m.group(1))}.0" if m else None


def load_env(path: str | os.PathLike[str]) -> EnvSnapshot:
    """Read and validate a ``dnnctl-env/1`` snapshot (or a doctor JSON report)."""
    p = Path(path)
    text = read_input(p, hint="write one with `dnnctl doctor --save env.yaml`")
    return parse_env(text, p)


def parse_env(text: str, path: str | os.PathLike[str] = "<snapshot>") -> EnvSnapshot:
    """Validate snapshot text; errors name ``path``, the line and the field."""
    reader = _Reader(Path(path))
    check_yaml_shape(text, path, _LOADER)
    try:
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputFileError(str(path), f"not valid YAML: {problem}", HINT, line=line) from None
    if root is None:
        raise InputFileError(str(path), "the file is empty", HINT)
    top = reader.mapping(root, "", ())
    if "schema" in top:
        schema = reader.scalar_text(top["schema"], "schema")
        if schema == DOCTOR_SCHEMA:  # a saved `dnnctl doctor --json` report
            if "env" not in top:
                raise reader.fail(root, "env", f"a {DOCTOR_SCHEMA} report without 'env'")
            top = reader.mapping(top["env"], "env", ())
            schema = reader.scalar_text(top["schema"], "env.schema") if "schema" in top \
                else ENV_SCHEMA
        if schema != ENV_SCHEMA:
            raise reader.fail(top.get("schema", root), "schema",
                              f"unsupported schema {schema!r}", f"expected '{ENV_SCHEMA}'")
    for key, node in top.items():
        if key not in TOP_FIELDS:
            near = difflib.get_close_matches(key, TOP_FIELDS, n=1)
            raise reader.fail(node, key, f"unknown field '{key}'"
                              + (f" (did you mean '{near[0]}'?)" if near else ""),
                              "allowed: " + ", ".join(TOP_FIELDS))
    return _build(reader, top)


def _build(r: _Reader, top: dict[str, yaml.Node]) -> EnvSnapshot:
    env = EnvSnapshot()
    for key in ("os", "python"):
        if key in top:
            setattr(env, key, r.value(top[key], "str", key))
    if "driver" in top:
        env.driver = _shorthand(r, top["driver"], "driver", DRIVER_FIELDS, "version")
    if "gpus" in top:
        env.gpus = [Gpu(**_shorthand(r, n, f"gpus[{i}]", GPU_FIELDS, "name"))
                    for i, n in enumerate(r.items(top["gpus"], "gpus"))]
    if "environment" in top:
        env.environment = r.record(top["environment"], "environment", ENVIRONMENT_FIELDS)
    if "toolchain" in top:
        env.toolchain = r.record(top["toolchain"], "toolchain", TOOLCHAIN_FIELDS)
    if "system" in top:
        env.system = r.record(top["system"], "system", SYSTEM_FIELDS)
    for key in SEARCHED:  # ``cudnn: []`` = looked and found none; ``cudnn: null`` = unknown
        if key in top:
            setattr(env, key, [
                Component(**_shorthand(r, n, f"{key}[{i}]", COMPONENT_FIELDS, "version"))
                for i, n in enumerate(r.items(top[key], key))])
            if isinstance(top[key], yaml.SequenceNode) and not getattr(env, key):
                env.listed.append(key)
    if "libraries" in top:
        for name, node in r.mapping(top["libraries"], "libraries",
                                    {k: "list" for k in LIBRARIES}).items():
            env.libraries[name] = [
                Component(**_shorthand(r, n, f"libraries.{name}[{i}]", COMPONENT_FIELDS,
                                       "version"))
                for i, n in enumerate(r.items(node, f"libraries.{name}"))]
    if "live" in top:
        env.live = _live(r, top["live"])
    if "frameworks" in top:
        for name, node in r.mapping(top["frameworks"], "frameworks", FRAMEWORK_FIELDS).items():
            env.frameworks[name] = _shorthand(r, node, f"frameworks.{name}",
                                              FRAMEWORK_FIELDS[name], "version")
    if "extensions" in top:  # any package name: a compiled torch CUDA extension
        for name, node in r.mapping(top["extensions"], "extensions", ()).items():
            env.extensions[name] = _shorthand(r, node, f"extensions.{name}", EXTENSION_FIELDS,
                                              "version")
    if "packages" in top:  # name: null (or "") = installed, version unknown
        env.packages = {k: "" if _blank(v) else r.value(v, "version", f"packages.{k}")
                        for k, v in r.mapping(top["packages"], "packages", ()).items()}
    if "requires" in top:
        env.requires = _requires(r, top["requires"])
    for key in ("errors", "notes"):  # lists of text: messages seen, probe remarks
        if key in top:
            node = top[key]
            if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:str":
                setattr(env, key, [r.scalar_text(node, key)])  # one text: a list of one
                continue
            setattr(env, key, [r.scalar_text(n, f"{key}[{i}]")
                               for i, n in enumerate(r.items(node, key))])
    return env


def _requires(r: _Reader, node: yaml.Node) -> dict[str, list[str]]:
    """``requires: {package: ["torch==2.4.1", ...]}``: each line a PEP 508 requirement."""
    out: dict[str, list[str]] = {}
    for name, vnode in r.mapping(node, "requires", ()).items():
        where = f"requires.{name}"
        lines = r.value(vnode, "strlist", where) or []
        for i, line in enumerate(lines):
            if requirements.parse(line) is None:
                raise r.fail(vnode.value[i], f"{where}[{i}]", f"not a requirement: {_show(line)}",
                             "write it as its Requires-Dist line, e.g. \"torch==2.4.1\"")
        out[name] = lines
    return out


def _blank(node: yaml.Node) -> bool:
    """A null or empty scalar (a package listed without its version)."""
    return isinstance(node, yaml.ScalarNode) and (node.tag.endswith(":null") or (
        node.tag.endswith(":str") and node.value == ""))


LIVE_FIELDS = {"torch": "str", "cudnn": "version", "cudnn_library": "str", "error": "str"}


def _live(r: _Reader, node: yaml.Node) -> dict[str, Any]:
    """``live:`` as doctor --deep writes it: per-backend SDPA results, per-GPU launches."""
    out: dict[str, Any] = {}
    for key, vnode in r.mapping(node, "live", (*LIVE_FIELDS, "sdpa", "launch")).items():
        if key in LIVE_FIELDS:
            out[key] = r.value(vnode, LIVE_FIELDS[key], f"live.{key}")
        else:
            out[key] = {k: r.value(v, "str", f"live.{key}.{k}")
                        for k, v in r.mapping(vnode, f"live.{key}", ()).items()}
    return out


def _shorthand(r: _Reader, node: yaml.Node, where: str, spec: dict[str, str],
               key: str) -> dict[str, Any]:
    """A record, or a bare value standing for its main field (``gpus: [B200]``)."""
    if isinstance(node, yaml.ScalarNode) and not node.tag.endswith(":null"):
        return {key: r.value(node, spec[key], where)}
    return r.record(node, where, spec)


def save_env(env: EnvSnapshot, path: str | os.PathLike[str]) -> Path:
    """Write ``env`` as ``dnnctl-env/1`` YAML atomically (temp file + rename)."""
    p = Path(path)
    text = ("# dnnctl-env/1 snapshot: judge it anywhere with `dnnctl doctor --from "
            f"{p.name}`\n" + yaml.safe_dump(env.to_dict(), sort_keys=False,
                                            allow_unicode=True, width=100))
    parent = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise UsageError(f"cannot write {p}: {exc.strerror or exc}",
                         "choose a writable directory for --save") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write {p}: {exc.strerror or exc}",
                         "choose a writable path for --save") from None
    return p

