"""CUDA runtimes and cuDNN copies: where each one is, its version, and which one loads first.

cuDNN versions are asked of the libraries themselves (``cudnnGetVersion``) in a subprocess
with a timeout, so a broken library cannot crash or hang doctor; the header and the file
name are fallbacks.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from dnnctl.doctor import parse
from dnnctl.doctor.host import Dist, Host
from dnnctl.doctor.model import Component

CUDART_PIP = ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime-cu12",
              "nvidia-cuda-runtime-cu13")
_MAIN_CUDNN = re.compile(r"libcudnn\.so\.(\d+)$")

# Runs in a fresh interpreter (-I -S: no site, nothing imported beyond ctypes/json).
CUDNN_QUERY = r"""
import ctypes, json, sys
for p in sys.argv[1:]:
    r = {"path": p}
    try:
        lib = ctypes.CDLL(p, mode=ctypes.RTLD_LOCAL)
        f = lib.cudnnGetVersion
        f.restype = ctypes.c_size_t
        r["version"] = int(f())
        try:
            g = lib.cudnnGetCudartVersion
            g.restype = ctypes.c_size_t
            r["cudart"] = int(g())
        except AttributeError:
            pass
    except Exception as e:
        r["error"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(r), flush=True)
"""


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


# -- CUDA runtimes ------------------------------------------------------------------------


def _pip_lib_dir(dist: Dist, pattern: str, guesses: tuple[str, ...]) -> str | None:
    rx = re.compile(pattern)
    for f in dist.files():
        if rx.fullmatch(f.name):
            return str(f.parent)
    for g in guesses:
        d = dist.location / g
        if d.is_dir():
            return str(d)
    return None


def pip_cuda_runtimes(dists: dict[str, Dist]) -> list[Component]:
    """nvidia-cuda-runtime[-cu1x] wheels (cu13 layout: nvidia/cu13/lib)."""
    out = []
    for name in CUDART_PIP:
        d = dists.get(name)
        if d:
            lib = _pip_lib_dir(d, r"libcudart\.so\.\d+(?:\.0)?", ("nvidia/cuda_runtime/lib",
                                                          "nvidia/cu13/lib"))
            out.append(Component(version=d.version, source=f"pip:{name}", path=lib))
    return out


def toolkit_dirs(host: Host) -> list[str]:
    """Candidate CUDA toolkit roots: /usr/local/cuda*, /opt/cuda, $CUDA_HOME / $CUDA_PATH."""
    cands = host.glob("/usr/local/cuda-*") + host.glob("/usr/local/cuda") + ["/opt/cuda"]
    cands += [host.environ[k] for k in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")
              if host.environ.get(k)]
    out, seen = [], set()
    # real versioned folders first, so /usr/local/cuda (a link) collapses onto cuda-13.0
    for c in sorted(cands, key=lambda p: (host.realpath(p) != p, not re.search(r"cuda-\d", p),
                                          p)):
        real = host.realpath(c)
        if real in seen or not host.is_dir(c):
            continue
        seen.add(real)
        out.append(c)
    return out


def toolkit_version(host: Host, root: str) -> str | None:
    """A toolkit's version: version.json, version.txt, libcudart's file name, dist-info, dir."""
    text, _ = host.read_text(f"{root}/version.json")
    version = parse.cuda_version_json(text)
    if version:
        return version
    text, _ = host.read_text(f"{root}/version.txt")
    version = parse.cuda_version_txt(text)
    if version:
        return version
    for lib_dir in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
        for lib in host.glob(f"{root}/{lib_dir}/libcudart.so.*"):
            v = parse.soname_version(os.path.basename(host.realpath(lib)), "libcudart")
            if v and v.count(".") >= 1:
                return v
    for info in host.glob(f"{root}/dist-info/nvidia_cuda_runtime*-*.dist-info"):
        m = re.search(r"-(\d+(?:\.\d+)+)\.dist-info$", info)
        if m:
            return m.group(1)
    m = re.search(r"cuda-(\d+\.\d+)$", host.realpath(root))
    return m.group(1) if m else None


def system_cuda_runtimes(host: Host, ldconfig: dict[str, list[str]]) -> list[Component]:
    """System toolkits, other libcudart copies in the ld cache, nvcc on PATH, conda."""
    out: list[Component] = []
    roots = toolkit_dirs(host)
    for root in roots:
        out.append(Component(version=toolkit_version(host, root), source=f"system:{root}",
                             path=root))
    real_roots = [host.realpath(r).rstrip("/") + "/" for r in roots]

    def inside_toolkit(path: str) -> bool:
        real = host.realpath(path)
        return any(real.startswith(r) for r in real_roots)

    for soname, paths in sorted(ldconfig.items()):
        if not re.fullmatch(r"libcudart\.so\.\d+(?:\.0)?", soname):  # CUDA 11: .so.11.0
            continue
        for p in paths:
            if not inside_toolkit(p):
                v = parse.soname_version(os.path.basename(host.realpath(p)), "libcudart")
                out.append(Component(version=v, source="system:ldconfig", path=p))
    nvcc = host.which("nvcc")
    if nvcc and not inside_toolkit(nvcc):
        res = host.run([nvcc, "--version"])
        version = parse.nvcc_version(res.stdout) if res and res.ok else None
        if version:
            out.append(Component(version=version, source=f"nvcc:{nvcc}", path=nvcc))
    out += conda_cuda_runtimes(host)
    return out


def conda_cuda_runtimes(host: Host) -> list[Component]:
    """cuda-cudart / cudatoolkit packages recorded in $CONDA_PREFIX/conda-meta."""
    prefix = host.environ.get("CONDA_PREFIX")
    if not prefix:
        return []
    for meta in host.listdir(f"{prefix}/conda-meta"):
        m = re.fullmatch(r"(cuda-cudart|cudatoolkit)-(\d+(?:\.\d+)+)-.*\.json", meta)
        if m:
            return [Component(version=m.group(2), source=f"conda:{prefix}",
                              path=f"{prefix}/lib")]
    return []


# -- cuDNN --------------------------------------------------------------------------------


@dataclass
class _Copy:
    path: str  # as shown to the user (logical for system files, real for site-packages)
    fs: Path  # where it is on this filesystem
    real: str  # symlink-resolved identity, for de-duplication
    source: str
    major: int
    rank: int  # lower = the loader reaches it earlier
    pip_version: str | None = None


def _cudnn_copies(host: Host, dists: dict[str, Dist],
                  ldconfig: dict[str, list[str]]) -> list[_Copy]:
    copies: list[_Copy] = []
    seen: set[str] = set()

    def add_real(path: Path, source: str, rank: int, pip_version: str | None = None) -> None:
        m = _MAIN_CUDNN.search(path.name)
        if not m or not path.exists():
            return
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            copies.append(_Copy(str(path), path, real, source, int(m.group(1)), rank,
                                pip_version))

    def add_logical(path: str, source: str, rank: int) -> None:
        m = _MAIN_CUDNN.search(os.path.basename(path))
        if not m or not host.exists(path):
            return
        real = host.realpath(path)
        if real not in seen:
            seen.add(real)
            copies.append(_Copy(path, host.path(path), real, source, int(m.group(1)), rank))

    for i, d in enumerate(host.env_paths("LD_LIBRARY_PATH")):
        for p in host.glob(f"{d}/libcudnn.so.*"):
            add_logical(p, "env:LD_LIBRARY_PATH", i)
    base = 1000
    for name in sorted(n for n in dists if n.startswith("nvidia-cudnn-cu")):
        d = dists[name]
        files = [f for f in d.files() if _MAIN_CUDNN.search(f.name)]
        if not files:
            files = sorted(d.location.glob("nvidia/*/lib/libcudnn.so.*"))
        for f in files:
            add_real(f, f"pip:{name}", base, d.version)
    torch = dists.get("torch")
    if torch:
        for f in sorted((torch.location / "torch" / "lib").glob("libcudnn.so.*")):
            add_real(f, "torch:bundled", base + 1)
    prefix = host.environ.get("CONDA_PREFIX")
    if prefix:
        for p in host.glob(f"{prefix}/lib/libcudnn.so.*"):
            add_logical(p, f"conda:{prefix}", base + 2)
    for soname, paths in sorted(ldconfig.items()):
        if _MAIN_CUDNN.fullmatch(soname):
            for p in paths:
                add_logical(p, "system:ldconfig", 2000)
    for root in toolkit_dirs(host):
        for p in host.glob(f"{root}/lib64/libcudnn.so.*") + host.glob(f"{root}/lib/libcudnn.so.*"):
            add_logical(p, f"system:{root}", 3000)
    return copies


def ask_cudnn(host: Host, paths: list[str]) -> dict[str, dict]:
    """cudnnGetVersion for each library, in subprocesses; a crash costs only that library."""
    answers: dict[str, dict] = {}
    todo = list(paths)
    while todo:
        res = host.run([host.python, "-I", "-S", "-c", CUDNN_QUERY, *todo],
                       label=f"cuDNN child (python -I -S, {len(todo)} libraries)")
        if res is None:
            for p in todo:
                answers[p] = {"error": f"cannot run {host.python}"}
            break
        for line in res.stdout.splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and r.get("path") in todo:
                answers[r["path"]] = r
        todo = [p for p in todo if p not in answers]
        if todo:  # the next one crashed or hung the helper: blame it, retry the rest
            why = res.error or (f"crashed (exit status {res.returncode})"
                                if res.returncode else "no answer")
            answers[todo.pop(0)] = {"error": why}
    return answers


def _file_version(real: str) -> str | None:
    """``libcudnn.so.8.9.7`` -> "8.9.7" (a bare ``libcudnn.so.9`` says only the major)."""
    v = parse.soname_version(os.path.basename(real), "libcudnn")
    return v if v and "." in v else None


def _header_version(host: Host, copy: _Copy) -> str | None:
    names = (f"cudnn_version_v{copy.major}.h", "cudnn_version.h", f"cudnn_v{copy.major}.h",
             "cudnn.h")
    inc = copy.fs.parent.parent / "include"
    texts = [_read(inc / n) for n in names]
    for d in ("/usr/include", "/usr/include/x86_64-linux-gnu", "/usr/include/aarch64-linux-gnu",
              "/usr/local/cuda/include"):
        texts += [host.read_text(f"{d}/{n}")[0] for n in names]
    for text in texts:
        v = parse.cudnn_header_version(text)
        if v and v.split(".")[0] == str(copy.major):
            return v
    return None


def probe_cudnn(host: Host, dists: dict[str, Dist],
                ldconfig: dict[str, list[str]]) -> tuple[list[Component], list[str]]:
    """Every cuDNN copy with its version; ``loaded_first`` marks what dlopen finds first."""
    copies = _cudnn_copies(host, dists, ldconfig)
    notes: list[str] = []
    answers = ask_cudnn(host, [str(c.fs) for c in copies]) if copies else {}
    out: list[Component] = []
    first: dict[int, _Copy] = {}
    for c in sorted(copies, key=lambda c: c.rank):
        first.setdefault(c.major, c)
    for c in copies:
        ans = answers.get(str(c.fs), {})
        version = parse.cudnn_int_version(ans.get("version"))
        if not version:
            version = _header_version(host, c) or _file_version(c.real) or c.pip_version
            why = str(ans.get("error", "no answer"))
            failed = any(w in why for w in ("timed out", "crashed", "skipped"))
            notes.append(("probe failed: " if failed else "")
                         + f"cuDNN {c.path}: the library could not be asked for its version "
                         f"({why}); "
                         + (f"using {version} from its header / file name / package"
                            if version else "version unknown"))
        elif c.pip_version and c.pip_version.startswith(version.rsplit(".", 1)[0] + "."):
            version = c.pip_version  # the wheel's 4-part version is the more precise name
        elif c.pip_version:
            notes.append(f"cuDNN {c.path}: package {c.source[4:]} says {c.pip_version} but "
                         f"the library reports {version}")
        out.append(Component(version=version, source=c.source, path=c.path,
                             loaded_first=first[c.major] is c))
    return out, notes
