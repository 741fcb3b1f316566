"""Compiled torch CUDA extensions (detectron2, mmcv, apex, pytorch3d, a source-built
torch-scatter, any ``CUDAExtension``): which architectures their libraries carry, without
importing them.

A distribution is one when a shared object it installed links torch's CUDA libraries
(``libc10_cuda`` / ``libtorch_cuda``, as every ``CUDAExtension`` does) and carries GPU code
(a ``.nv_fatbin`` section, read by dnnctl.doctor.fatbin). Its libraries come from its RECORD;
an editable or ``setup.py develop`` install (whose RECORD lists none) is searched in its
source folder, a few levels deep. torch itself, the NVIDIA, JAX, TensorFlow and CuPy wheels
(none links torch) and torch's own torchvision / torchaudio wheels (judged with torch) are
skipped; a torchvision built from source is listed. Every read is bounded, and doctor's
deadline stops the search with a note. Windows' ``.pyd`` (PE) files are not read yet.

``built_from_source`` (absent when it cannot be told):
- ``direct_url.json`` (PEP 610: pip installed a URL or a path, not an index name): a local
  folder or a VCS checkout, or an archive that is not a ``.whl`` (an sdist), is a build here;
  a wheel's URL is not;
- an ``.egg-info`` (``setup.py install`` / ``develop``) is a build here;
- else the ``WHEEL`` file's tag: a ``manylinux`` / ``musllinux`` / ``macosx`` wheel was
  published; a plain ``linux_*`` wheel was built by pip from a source release on this machine
  (an index refuses those), unless its version has a local tag (``+cu118``, ``+pt21cu121``):
  a project's own wheel index (PyG, detectron2's, download.pytorch.org) publishes those. A
  ``win`` wheel may be either: unknown. An ``INSTALLER`` of ``conda`` is a prebuilt package.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from dnnctl.doctor.distinfo import Dist, headers, read_version
from dnnctl.doctor.fatbin import read_library, sort_targets
from dnnctl.doctor.host import Host
from dnnctl.doctor.parse import canonical_name

TORCH_CUDA = re.compile(r"lib(c10_cuda|torch_cuda(_cu|_cpp)?)\.so\b")
_SKIP_PREFIXES = ("nvidia-", "cupy", "jax", "tensorflow", "tf-", "tensorrt")
_SKIP = {"torch", "triton", "pytorch-triton", "dnnctl", "onnxruntime-gpu", "paddlepaddle-gpu"}
TORCH_OWN = {"torchvision", "torchaudio"}  # listed only when built from source
_WALK_SKIP = {".git", "build", "dist", "__pycache__", "node_modules", "docs", "tests", "test",
              "third_party", ".eggs"}
MAX_LIBS = 256  # shared objects looked at in one distribution
MAX_WALK = 5000  # folder entries looked at in one source folder
MAX_RECORD = 16 << 20  # bytes of RECORD read


def wanted(name: str) -> bool:
    """Might this distribution be a torch CUDA extension? (a name filter, before any read)"""
    return name not in _SKIP and not name.startswith(_SKIP_PREFIXES)


def probe_extensions(host: Host) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """({name: {version, arch_list, built_from_source, path}}, notes)."""
    out: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for info_dir in _info_dirs(host):
        left = host.remaining()
        if left is not None and left <= 0.1:
            return out, [*notes, "probe failed: compiled torch extensions: doctor's time "
                         "limit was reached before every installed package was read"]
        try:
            found = _one(info_dir)
        except Exception as exc:  # one odd package must not cost the others, nor doctor
            notes.append(f"probe failed: compiled torch extensions: {info_dir.name}: "
                         f"{type(exc).__name__}: {exc}")
            continue
        if found:
            name, entry = found
            out.setdefault(name, entry)
    return out, notes


def _info_dirs(host: Host) -> list[Path]:
    """Every ``*.dist-info`` / ``*.egg-info`` on the path worth a look, first copy winning."""
    seen_names: set[str] = set()
    out: list[Path] = []
    for name, _, info in host.metadata_dirs():
        if name in seen_names:
            continue
        seen_names.add(name)
        if wanted(name):
            out.append(info)
    return out


def _one(info_dir: Path) -> tuple[str, dict[str, Any]] | None:
    libs = _libraries(info_dir)
    if not libs:
        return None
    read = [(p, read_library(p, linking=TORCH_CUDA)) for p in libs[:MAX_LIBS]]
    ext = [(p, lib) for p, lib in read if any(TORCH_CUDA.match(n) for n in lib.needed)]
    if not ext:
        return None
    # a library with no .nv_fatbin has no kernels of its own; an unread one might have
    code = [(p, lib) for p, lib in ext if lib.has_fatbin or lib.error]
    first = (code or ext)[0][0]
    lists = [lib.targets for _, lib in code]
    version = read_version(info_dir)
    if not version:
        return None
    dist = Dist(canonical_name(info_dir.name.rsplit(".", 1)[0].split("-", 1)[0]), version,
                info_dir.parent, info_dir)
    source = built_from_source(dist)
    if dist.name in TORCH_OWN and source is not True:
        return None
    entry: dict[str, Any] = {"version": version, "path": str(first)}
    if lists and all(lists):  # every library read: the targets all of them have
        common = set(lists[0] or ())
        for t in lists[1:]:
            common &= set(t or ())
        if common:
            entry["arch_list"] = list(sort_targets(common))
    if source is not None:
        entry["built_from_source"] = source
    return dist.name, entry


def _libraries(info_dir: Path) -> list[Path]:
    """The shared objects a distribution installed: from its RECORD, else (an editable or
    develop install) found in its source folder."""
    source = _source_dir(info_dir)
    if info_dir.suffix == ".dist-info" and source is None:
        try:
            with open(info_dir / "RECORD", "rb") as fh:
                data = fh.read(MAX_RECORD)
        except OSError:
            return []
        return sorted(info_dir.parent / rel for rel in _record_libraries(data))
    if source is not None:
        return sorted(set(_walk(source)))
    # an .egg-info in a site folder (``setup.py install``): its top-level names, there;
    # apex's are modules too: amp_C.cpython-310-x86_64-linux-gnu.so
    libs: list[Path] = []
    for t in _top_level(info_dir):
        root = info_dir.parent / t
        libs += _walk(root) if root.is_dir() else []
        libs += [p for p in _glob(info_dir.parent, t + ".") if p.name.endswith(".so")]
    return sorted(set(libs))


def _record_libraries(data: bytes) -> list[str]:
    """The ``.so`` paths of RECORD rows (``path,hash,size``), found with bytes.find: most
    distributions have none, and ray's RECORD is megabytes."""
    out: list[str] = []
    end = data.find(b".so,")
    while end >= 0:
        start = data.rfind(b"\n", 0, end) + 1
        rel = data[start:end + 3].strip(b"\r")
        if b"," not in rel and not rel.startswith(b"../"):
            out.append(rel.decode("utf-8", "replace"))
        end = data.find(b".so,", end + 4)
    return out


def _glob(base: Path, prefix: str) -> list[Path]:
    try:
        return [base / n for n in os.listdir(base) if n.startswith(prefix)]
    except OSError:
        return []


def _walk(root: Path, depth: int = 3) -> list[Path]:
    """``*.so`` files under ``root``, at most ``depth`` folders down and MAX_WALK entries."""
    found: list[Path] = []
    todo, seen = [(root, 0)], 0
    while todo and seen < MAX_WALK:
        folder, level = todo.pop()
        try:
            with os.scandir(folder) as it:
                for e in it:
                    seen += 1
                    if seen > MAX_WALK:
                        break
                    if e.is_dir(follow_symlinks=False):
                        if level < depth and e.name not in _WALK_SKIP \
                                and not e.name.endswith((".egg-info", ".dist-info")):
                            todo.append((Path(e.path), level + 1))
                    elif e.name.endswith(".so") and e.is_file():
                        found.append(Path(e.path))
        except OSError:
            continue
    return found


def _read(path: Path, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return None


def _direct_url(info_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(_read(info_dir / "direct_url.json") or "null")
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _source_dir(info_dir: Path) -> Path | None:
    """The source folder of an editable install (PEP 610 ``dir_info.editable``), or the folder
    an ``.egg-info`` of ``setup.py develop`` sits in (not a site folder)."""
    data = _direct_url(info_dir)
    if data and isinstance(data.get("dir_info"), dict) and data["dir_info"].get("editable"):
        url = urlparse(str(data.get("url", "")))
        return Path(unquote(url.path)) if url.scheme == "file" else None
    parent = info_dir.parent
    if info_dir.suffix == ".egg-info" and parent.name not in ("site-packages", "dist-packages"):
        return parent
    return None


def _top_level(info_dir: Path) -> list[str]:
    text = _read(info_dir / "top_level.txt") or ""
    return [t.strip() for t in text.splitlines() if re.fullmatch(r"[\w.]+", t.strip())]


def built_from_source(dist: Dist) -> bool | None:
    """Was this distribution compiled on a machine by pip / setup.py? (module docstring)"""
    data = _direct_url(dist.info_dir)
    if data is not None:
        if "dir_info" in data or "vcs_info" in data:
            return True
        if "archive_info" in data:
            return not urlparse(str(data.get("url", ""))).path.endswith(".whl")
    if dist.info_dir.suffix == ".egg-info":
        return True
    if (dist.read_text("INSTALLER") or "").strip() == "conda":
        return False
    tags = headers(dist.read_text("WHEEL") or "").get("tag", [])
    platforms = {t.rsplit("-", 1)[-1] for t in tags}
    if not platforms or any(p.startswith("win") or p == "any" for p in platforms):
        return None
    if any(p.startswith(("manylinux", "musllinux", "macosx")) for p in platforms):
        return False
    return "+" not in dist.version
