#!/usr/bin/env python3
"""Compile bundled kernels with NVRTC (exactly as the cupy backend does) on a machine
without a GPU, and optionally show ptxas resource usage via nvcc.

    python tools/nvrtc_check.py kernels/softmax/warp_row.cu -D VEC=8 --name 'softmax_warp<float>'
    python tools/nvrtc_check.py kernels/gemm/mma.cu --ptxas      # registers / spills (nvcc)

Needs libnvrtc (pip install 'nvidia-cuda-nvrtc>=13,<14'); --ptxas needs nvcc on PATH.
Exit status 0 when every file compiles.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _libnvrtc() -> ctypes.CDLL:
    cands = []
    for base in sys.path:
        cands += glob.glob(os.path.join(base, "nvidia", "cu13", "lib", "libnvrtc.so*"))
        cands += glob.glob(os.path.join(base, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*"))
    cands += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    for c in cands:
        if "builtins" in c:
            continue
        try:
            return ctypes.CDLL(c)
        except OSError:
            continue
    sys.exit("libnvrtc not found: pip install 'nvidia-cuda-nvrtc>=13,<14'")


def nvrtc_compile(path: Path, options: list[str], names: list[str]) -> tuple[bool, str]:
    lib = _libnvrtc()
    prog = ctypes.c_void_p()
    src = path.read_bytes()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src, str(path).encode(), 0, None, None)
    if rc:
        return False, f"nvrtcCreateProgram rc={rc}"
    for n in names:
        lib.nvrtcAddNameExpression(prog, n.encode())
    opts = [o.encode() for o in options]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    log = buf.value.decode(errors="replace")
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc == 0, log


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("-D", dest="defines", action="append", default=[], help="NAME=VALUE")
    ap.add_argument("--name", action="append", default=[], help="name expression")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--ptxas", action="store_true", help="also run nvcc -Xptxas -v")
    args = ap.parse_args()
    cuda_inc = os.environ.get("CUDA_HOME", "/usr/local/cuda") + "/include"
    base = [f"-arch={args.arch}", "--std=c++17", f"-I{ROOT / 'kernels' / 'include'}",
            f"-I{cuda_inc}", "-DDNNCTL_HEADERS=0x0"]
    opts = base + [f"-D{d}" for d in args.defines]
    ok_all = True
    for f in args.files:
        ok, log = nvrtc_compile(f, opts, args.name)
        ok_all &= ok
        print(f"{'OK  ' if ok else 'FAIL'} {f}")
        if log.strip():
            print(log.rstrip())
        if args.ptxas:
            arch = args.arch.replace("sm_", "")
            cmd = ["nvcc", "-cubin", "-o", "/dev/null", f"-gencode=arch=compute_{arch},code=sm_{arch}",
                   "--std=c++17", "-Xptxas", "-v", f"-I{ROOT / 'kernels' / 'include'}",
                   "-DDNNCTL_HEADERS=0x0", *[f"-D{d}" for d in args.defines], str(f)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            print(res.stdout + res.stderr)
            ok_all &= res.returncode == 0
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
