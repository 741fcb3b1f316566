"""Test doubles for doctor's probes: an injected command runner, NVML, a filesystem root, a
site-packages folder, and a replay of the H200 server captured in ../h200-server/.

Only what cannot run on a GPU-less CI box is faked (NVML, the tools' outputs); files are real
files under a temporary root, and distributions are real ``*.dist-info`` folders read by
``importlib.metadata``. Loaded by the tests with ``load_fakes()`` (see test_probe_*.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dnnctl.doctor.deep import SCRIPTS
from dnnctl.doctor.host import CmdResult, Host, run_command
from dnnctl.doctor.native import LIBCUDA_QUERY
from dnnctl.doctor.probe_cuda import CUDNN_QUERY

HERE = Path(__file__).resolve().parent
H200 = HERE.parent / "h200-server"


def canned(name: str) -> str:
    """A canned output from this folder (or ../h200-server/ with the "h200/" prefix)."""
    if name.startswith("h200/"):
        return (H200 / name[5:]).read_text()
    return (HERE / name).read_text(errors="replace")


# -- command runner -----------------------------------------------------------------------


@dataclass
class FakeRunner:
    """Answers argv lists from canned outputs; records every call.

    ``commands``: program basename -> stdout text, CmdResult, or None (not installed).
    ``cudnn``: library path suffix -> cudnnGetVersion() int, "crash" (the helper dies with
    SIGSEGV there) or "hang" (the helper times out there), or an error string.
    ``deep``: framework -> the helper's stdout text, or a CmdResult.
    """

    commands: dict[str, Any] = field(default_factory=dict)
    cudnn: dict[str, Any] = field(default_factory=dict)
    deep: dict[str, Any] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)

    def __call__(self, argv: Sequence[str], timeout: float) -> CmdResult | None:
        argv = list(argv)
        self.calls.append(argv)
        if "-c" in argv:
            i = argv.index("-c")
            script, args = argv[i + 1], argv[i + 2:]
            if script == CUDNN_QUERY:
                return self._cudnn(args, timeout)
            if script == LIBCUDA_QUERY:  # the real child, against a compiled stand-in library
                return run_command([sys.executable, *argv[1:]], timeout)
            for fw, text in SCRIPTS.items():
                if script == text:
                    return self._answer(self.deep.get(fw, CmdResult(
                        1, "", f"ModuleNotFoundError: No module named '{fw}'\n")))
            return CmdResult(1, "", "unexpected script")
        name = os.path.basename(argv[0])
        if name not in self.commands:
            return None
        return self._answer(self.commands[name])

    @staticmethod
    def _answer(value: Any) -> CmdResult | None:
        if value is None or isinstance(value, CmdResult):
            return value
        return CmdResult(0, str(value), "")

    def _cudnn(self, paths: list[str], timeout: float) -> CmdResult:
        lines = []
        for p in paths:
            answer = next((v for k, v in self.cudnn.items() if p.endswith(k)), None)
            if answer == "crash":
                return CmdResult(-11, "\n".join(lines), "")
            if answer == "hang":
                return CmdResult(None, "\n".join(lines), "", f"timed out after {timeout:g} s")
            if isinstance(answer, int):
                lines.append(json.dumps({"path": p, "version": answer}))
            else:
                lines.append(json.dumps({"path": p, "error": answer or
                                         f"OSError: {p}: invalid ELF header"}))
        return CmdResult(0, "\n".join(lines) + "\n", "")

    def ran(self, program: str) -> bool:
        return any(os.path.basename(c[0]) == program for c in self.calls)


# -- NVML ---------------------------------------------------------------------------------

NVML_MESSAGES = {4: "Insufficient Permissions", 9: "Driver Not Loaded",
                 12: "NVML Shared Library Not Found", 15: "GPU is lost",
                 18: "RM has detected an NVML/RM version mismatch.", 999: "Unknown Error"}


class FakeNvml:
    """The slice of nvidia-ml-py's ``pynvml`` module that doctor calls, with canned answers."""

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            return NVML_MESSAGES.get(self.value, f"NVML error {self.value}")

    def __init__(self, driver: str = "580.159.04", cuda: int = 13000,
                 gpus: Sequence[dict[str, Any]] = (), init_error: int | None = None,
                 lost: Sequence[int] = ()) -> None:
        self.driver, self.cuda, self.gpus = driver, cuda, list(gpus)
        self.init_error, self.lost = init_error, set(lost)
        self.initialized = self.shutdown = False

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:  # noqa: N802
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        if i in self.lost:
            raise self.NVMLError(15)
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:  # noqa: N802 - old bindings return bytes
        return self.gpus[h]["name"].encode()

    def nvmlDeviceGetUUID(self, h: int) -> str:  # noqa: N802
        return self.gpus[h].get("uuid", f"GPU-0000000{h}")

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:  # noqa: N802
        return self.gpus[h]["cc"]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(total=self.gpus[h]["memory"], free=0, used=0)

    def nvmlDeviceGetComputeMode(self, h: int) -> int:  # noqa: N802
        if "compute_mode" not in self.gpus[h]:
            raise self.NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED
        return self.gpus[h]["compute_mode"]

    def nvmlDeviceGetDisplayActive(self, h: int) -> int:  # noqa: N802
        if "display_active" not in self.gpus[h]:
            raise self.NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED
        return self.gpus[h]["display_active"]


def no_pynvml() -> Any:
    raise ImportError("No module named 'pynvml'")


# -- filesystem root and site-packages ----------------------------------------------------


@dataclass(frozen=True)
class Link:
    target: str


def make_root(root: Path, files: dict[str, str | bytes | Link | None]) -> Path:
    """Create files (text, bytes, symlink, or None = empty) under ``root`` by logical path."""
    for logical, content in files.items():
        p = root / logical.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            p.symlink_to(content.target)
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content or "")
    return root


def make_dist(site: Path, name: str, version: str, files: dict[str, str | None] | None = None,
              requires: Sequence[str] = (), installer: str = "pip") -> Path:
    """A real ``name-version.dist-info`` folder (METADATA, INSTALLER, RECORD) plus its files."""
    info = site / f"{re.sub(r'[-.]+', '_', name)}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(meta + "\nA package.\n")
    (info / "INSTALLER").write_text(installer + "\n")
    record = []
    for rel, text in (files or {}).items():
        p = site / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text or "")
        record.append(f"{rel},,")
    record.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(record) + "\n")
    return info


def make_host(tmp: Path, *, files: dict[str, Any] | None = None, environ: dict | None = None,
              runner: FakeRunner | None = None, nvml: Callable[[], Any] | None = None,
              site: Path | None = None, **kw: Any) -> Host:
    root = make_root(tmp / "root", files or {})
    site = site or (tmp / "site")
    site.mkdir(parents=True, exist_ok=True)
    return Host(root=root, environ=environ if environ is not None else {"PATH": "/usr/bin"},
                runner=runner or FakeRunner(), site_paths=[str(site)], python="python3",
                nvml=nvml or no_pynvml, **kw)


# -- the H200 server, replayed from ../h200-server/ ---------------------------------------


def h200_site(site: Path) -> None:
    """site-packages as captured by tools/device_facts.sh (python-meta.txt)."""
    meta = canned("h200/python-meta.txt")
    version_py = meta.split("== torch/version.py\n", 1)[1].split("\ntorch/lib:", 1)[0]
    requires = json.loads(re.search(r"^REQUIRES (.*)$", meta, re.M).group(1))
    nvlibs = [m.split("/site-packages/", 1)[1] for m in re.findall(r"^NVLIB (\S+)", meta, re.M)]
    for m in re.finditer(r"^DIST (\S+) (\S+) ", meta, re.M):
        name, version = m.group(1), m.group(2)
        files: dict[str, str | None] = {}
        if name == "torch":
            files = {"torch/version.py": version_py, "torch/__init__.py": None}
        elif name == "nvidia-cudnn-cu13":
            files = {p: None for p in nvlibs if p.startswith("nvidia/cudnn/")}
        elif name == "nvidia-cuda-runtime":
            files = {p: None for p in nvlibs if re.search(r"/libcudart", p)}
        elif name == "cupy-cuda13x":
            files = {"cupy/__init__.py": None}
        make_dist(site, name, version, files, requires if name == "torch" else ())


def h200_host(tmp: Path) -> tuple[Host, FakeRunner, FakeNvml]:
    nvml_line = canned("h200/nvml.txt").splitlines()
    driver, cuda = nvml_line[0].split()
    name_cc_mem = re.match(r"(.+) \((\d+), (\d+)\) (\d+)", nvml_line[1])
    nvml = FakeNvml(driver, int(cuda), [{
        "name": name_cc_mem.group(1), "cc": (int(name_cc_mem.group(2)),
                                             int(name_cc_mem.group(3))),
        "memory": int(name_cc_mem.group(4)), "uuid": "GPU-1668e940-dc6b-2441-ccc2-bc8ea0dff08d"}])
    env = dict(line.split("=", 1) for line in canned("h200/env.txt").splitlines() if "=" in line)
    files: dict[str, Any] = {
        "/proc/driver/nvidia/version": canned("h200/proc-driver-nvidia-version.txt"),
        "/sys/module/nvidia/version": canned("h200/sys-module-nvidia-version.txt"),
        "/dev/nvidia0": None, "/dev/nvidiactl": None, "/dev/nvidia-uvm": None,
        "/usr/local/nvidia/lib64/libcuda.so.580.159.04": None,
        "/usr/local/nvidia/lib64/libcuda.so.1": Link("libcuda.so.580.159.04"),
        "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04": None,
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1": Link("libnvidia-ml.so.580.159.04"),
        "/usr/local/cuda-13.0/bin/nvcc": "#!/bin/sh\n",
        "/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcudart.so.13.0.96": None,
        "/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcudart.so.13":
            Link("libcudart.so.13.0.96"),
        "/usr/local/cuda-13.0/lib64": Link("targets/x86_64-linux/lib"),
        "/etc/alternatives/cuda": Link("/usr/local/cuda-13.0"),
        "/etc/alternatives/cuda-13": Link("/usr/local/cuda-13.0"),
        "/usr/local/cuda": Link("/etc/alternatives/cuda"),
        "/usr/local/cuda-13": Link("/etc/alternatives/cuda-13"),
        "/lib/x86_64-linux-gnu/libcudnn.so.9": None,
        "/sbin/ldconfig": "#!/bin/sh\n",
        # env.txt: PATH ends with /opt/gcc/bin and CUDAHOSTCXX=/opt/gcc/bin/g++; the capture
        # has no `gcc --version`, so the replayed gcc answers nothing (version unknown)
        "/opt/gcc/bin/gcc": "#!/bin/sh\n", "/opt/gcc/bin/g++": "#!/bin/sh\n",
        "/etc/os-release": 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nNAME="Ubuntu"\n',
        "/.dockerenv": None,
    }
    runner = FakeRunner(
        commands={"ldconfig": canned("h200/ldconfig-p.txt"),
                  "nvcc": canned("h200/nvcc-version.txt"),
                  "nvidia-smi": canned("h200/nvidia-smi-query.csv")},
        cudnn={"nvidia/cudnn/lib/libcudnn.so.9": int(canned("h200/cudnn-ctypes.txt").split()[1]),
               # not captured on the server: pretend the helper could not load it
               "/lib/x86_64-linux-gnu/libcudnn.so.9": "OSError: libz.so.1: cannot open"},
    )
    site = tmp / "site-packages"
    h200_site(site)
    runner.deep = {"torch": "DNNCTL_JSON " + _deep_torch(site),
                   "cupy": "DNNCTL_JSON " + _deep_cupy()}
    host = make_host(tmp, files=files, environ=env, runner=runner, nvml=lambda: nvml,
                     site=site)
    for d in ("/usr/local/cuda-13.0/bin", "/sbin", "/opt/gcc/bin"):
        for f in host.path(d).iterdir():
            f.chmod(0o755)
    return host, runner, nvml


def _deep_torch(site: Path) -> str:
    d = json.loads(canned("h200/torch-deep.json"))
    return json.dumps({"version": d["v"], "cuda": d["cuda"], "cudnn": d["cudnn"],
                       "arch_list": d["arch"], "cuda_available": True, "device_count": 1,
                       "capability": d["cap"],
                       "cudnn_libs": [f"{site}/nvidia/cudnn/lib/libcudnn.so.9"]})


def _deep_cupy() -> str:
    d = json.loads(canned("h200/cupy-deep.json"))
    return json.dumps({"version": d["v"], "runtime": d["rt"], "driver": d["drv"],
                       "local_runtime": d["local"], "nvrtc": [13, 0], "device_count": 1})


def argv_text(argv: Sequence[str]) -> str:
    return shlex.join(argv)


def compile_lib(path: Path, c_source: str) -> Path | None:
    """Build a real shared library (for ctypes probes); None when no C compiler is here."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_name(path.name + ".c")
    src.write_text(c_source)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(path), str(src)], check=True,
                   capture_output=True)
    return path


FAKE_LIBCUDA = "int cuDriverGetVersion(int *v) {{ *v = {version}; return 0; }}\n"
FAKE_LIBCUDNN = "#include <stddef.h>\nsize_t cudnnGetVersion(void) {{ return {version}; }}\n"
CRASHING_LIBCUDNN = ("#include <stddef.h>\n#include <stdlib.h>\n"
                     "size_t cudnnGetVersion(void) { abort(); return 0; }\n")
