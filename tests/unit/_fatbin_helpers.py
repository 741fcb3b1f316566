"""Synthetic shared objects: a minimal ELF64 with a section header table, ``.dynamic`` /
``.dynstr`` naming the libraries it links, and a ``.nv_fatbin`` section of fatbin containers
written byte by byte after the layout dnnctl.doctor.fatbin documents."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

MAGIC = 0xBA55ED50
PTX, CUBIN = 1, 2
LZ4, ZSTD = 0x2000, 0x8000
TORCH_CUDA = ("libc10_cuda.so", "libtorch_cuda.so", "libc10.so", "libtorch.so")


def entry(kind: int, arch: int, payload: bytes = b"code", flags: int = 0x11,
          header: int = 64) -> bytes:
    """One fatbin entry: its header (``header`` bytes; sm_100+ ones are longer), then the
    payload padded to 8 bytes."""
    padded = payload + b"\0" * (-len(payload) % 8)
    head = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x0101, header, len(padded), len(payload),
                       0, arch % 10, arch // 10, arch, 0, 0, flags, 0, len(payload) * 3)
    return head + b"\0" * (header - 64) + padded


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", MAGIC, 1, 16, len(body)) + body


def standard_fatbin() -> bytes:
    """Two cubins (sm_70, and an LZ4-compressed sm_80 whose payload is noise) and the PTX
    of compute_80, in one container; a second translation unit's container after 8 bytes of
    padding repeats sm_80."""
    first = container(entry(CUBIN, 70, b"\x7fELF cubin for sm_70"),
                      entry(CUBIN, 80, bytes(range(200, 255)) * 3, flags=0x11 | LZ4),
                      entry(PTX, 80, b".version 8.0\n.target sm_80\n"))
    return first + b"\0" * 8 + container(entry(CUBIN, 80, b"another unit"))


def elf(needed: Sequence[str] = TORCH_CUDA, fatbin: bytes | None = None,
        section: str = ".nv_fatbin") -> bytes:
    """A little-endian ELF64 shared object holding only what the probe reads."""
    dynstr = b"\0"
    dyn = b""
    for name in needed:
        dyn += struct.pack("<qQ", 1, len(dynstr))  # DT_NEEDED
        dynstr += name.encode() + b"\0"
    dyn += struct.pack("<qQ", 0, 0)  # DT_NULL
    names = [b"", b".dynstr", b".dynamic", b".text"]
    datas = [b"", dynstr, dyn, b"\xc3" * 16]
    types = [0, 3, 6, 1]  # NULL, STRTAB, DYNAMIC, PROGBITS
    if fatbin is not None:
        names.append(section.encode())
        datas.append(fatbin)
        types.append(1)
    names.append(b".shstrtab")
    shstr = b"\0"
    name_off = []
    for n in names:
        name_off.append(len(shstr) if n else 0)
        shstr += (n + b"\0") if n else b""
    datas.append(shstr)
    types.append(3)
    body, offsets = b"", []
    for d in datas:
        body += b"\0" * (-len(body) % 8)
        offsets.append(64 + len(body) if d else 0)
        body += d
    body += b"\0" * (-len(body) % 8)
    shoff = 64 + len(body)
    table = b""
    for i, (n_off, t, off, d) in enumerate(zip(name_off, types, offsets, datas)):
        link = 1 if t == 6 else 0  # .dynamic's strings are in .dynstr
        table += struct.pack("<IIQQQQIIQQ", n_off, t, 0, 0, off, len(d), link, 0, 8,
                             16 if t == 6 else 0) if i else b"\0" * 64
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    head = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64,
                               len(datas), len(datas) - 1)
    return head + body + table


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
