"""Which GPU architectures a compiled library carries, read from its ELF without CUDA's tools.

nvcc embeds each translation unit's device code in the host object as a *fatbin container*;
the linker concatenates those containers into the library's ``.nv_fatbin`` section (one per
``.cu`` file, so a section holds many). Each entry of a container is one cubin (machine code
for one ``sm_XY``) or one PTX text (for ``compute_XY``), and its fixed header names the kind
and the architecture, so a list like ``cuobjdump --list-elf --list-ptx`` prints needs only the
section header table and a few dozen bytes per entry: no payload is read or decompressed.

The layout (little-endian), as public readers describe it: n-eiling/cuda-fatbin-decompression
``fatbin-decompress.h`` (structs ``fat_elf_header`` and ``fat_text_header``; flag 0x2000, a
compressed payload), GrigoryEvko/nvopen-tools ``fatbin/FORMAT_SPECIFICATION.md`` (many
containers a section, entry headers of 64, 80 or 112 bytes, flag 0x8000, zstd), and the Rust
crate jiegec/fatbinary, which follows the first::

    container header, 16 bytes
      0  u32  magic 0xBA55ED50
      4  u16  version (1)
      6  u16  header size (16): the first entry starts here
      8  u64  size of the entries that follow
    entry header, 64 bytes or more (sm_100 and newer add an extension)
      0  u16  kind: 1 PTX, 2 cubin (ELF)
      2  u16  (0x0101)
      4  u32  header size: the payload starts this far from the entry
      8  u64  payload size, padded to 8: the next entry starts at header size + this
     16  u32  compressed size
     24  u16  code version minor, 26 u16 major
     28  u32  arch: 10 * major + minor of the compute capability (80: sm_80 / compute_80)
     40  u64  flags: 0x1 64-bit, 0x2000 LZ4 or 0x8000 zstd compressed payload
     56  u64  uncompressed size

Only the payload is ever compressed, so a compressed entry's arch reads the same. The
architecture-specific suffix of ``sm_90a`` is not in this header: such a cubin reads as
``sm_90`` (it runs on the same GPUs). Every read is bounded and a malformed file gives
``None``, never an exception.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

FATBIN_MAGIC = 0xBA55ED50
SECTION_NAMES = (b".nv_fatbin", b".nv.fatbin")  # GCC/ld name it .nv_fatbin
KIND_PTX, KIND_CUBIN = 1, 2
FLAG_COMPRESSED = 0x2000 | 0x8000
MAX_LIBRARY = 1 << 30  # bytes: a larger file's GPU code is not read (arch list unknown)
MAX_SECTIONS = 1 << 16
MAX_ENTRIES = 1 << 16  # entries read in one library (cuBLASLt has ~5,000)
MAX_NEEDED = 256
_SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_ENTRY = struct.Struct("<HHIQI4xHHI")  # kind, _, header size, payload, compressed, minor, major, arch
_ENTRY_SIZE = 64


@dataclass(frozen=True)
class Library:
    """What one shared object says about itself."""

    needed: tuple[str, ...] = ()  # DT_NEEDED: the libraries it links
    targets: tuple[str, ...] | None = None  # sm_XY / compute_XY; None: no readable GPU code
    has_fatbin: bool = False
    error: str | None = None  # why it could not be read (too big, not ELF, truncated, ...)


def _at(fh: BinaryIO, offset: int, size: int) -> bytes:
    fh.seek(offset)
    data = fh.read(size)
    if len(data) != size:
        raise ValueError("truncated")
    return data


def read_library(path: str | os.PathLike[str], max_size: int | None = None,
                 linking: re.Pattern[str] | None = None) -> Library:
    """The linked libraries and the GPU code targets of the ELF64 shared object ``path``.

    With ``linking``, the GPU code is read only when a linked library's name matches it; a
    file larger than ``max_size`` (default MAX_LIBRARY) has its GPU code left unread.
    """
    limit = MAX_LIBRARY if max_size is None else max_size
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            return _read(fh, size, limit, linking)
    except (OSError, ValueError, struct.error) as exc:
        return Library(error=f"unreadable: {exc}")


def _read(fh: BinaryIO, size: int, limit: int, linking: re.Pattern[str] | None) -> Library:
    ident = fh.read(64)
    if len(ident) < 64 or ident[:4] != b"\x7fELF":
        return Library(error="not an ELF file")
    if ident[4] != 2 or ident[5] != 1:
        return Library(error="not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", ident, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
    if not shoff or shentsize != _SHDR.size or not 0 < shnum <= MAX_SECTIONS \
            or shstrndx >= shnum or shoff + shnum * shentsize > size:
        return Library(error="no section header table")
    table = _at(fh, shoff, shnum * shentsize)
    sections = [s for s in (_SHDR.unpack_from(table, i * shentsize) for i in range(shnum))
                if s[1] == 8 or s[4] + s[5] <= size]  # SHT_NOBITS occupies no file bytes
    names = _SHDR.unpack_from(table, shstrndx * shentsize)
    strtab = _at(fh, names[4], min(names[5], 1 << 20)) if names[4] + names[5] <= size else b""

    def name(sec: tuple[int, ...]) -> bytes:
        end = strtab.find(b"\0", sec[0])
        return strtab[sec[0]:end if end >= 0 else len(strtab)]

    needed: tuple[str, ...] = ()
    for sec in sections:
        if sec[1] == 6 and sec[6] < shnum:  # SHT_DYNAMIC; sh_link is its string table
            needed = _needed(fh, sec[4], sec[5], _SHDR.unpack_from(table, sec[6] * shentsize))
    fatbins = [s for s in sections if s[1] != 8 and name(s) in SECTION_NAMES]
    if not fatbins:
        return Library(needed)
    if linking is not None and not any(linking.match(n) for n in needed):
        return Library(needed, None, True)
    if size > limit:
        return Library(needed, None, True, f"larger than {limit} bytes: its GPU code was not read")
    found: set[str] = set()
    for sec in fatbins:
        targets = _fatbin_targets(fh, sec[4], sec[5])
        if targets is None:
            return Library(needed, None, True, "its .nv_fatbin section is malformed")
        found |= targets
    return Library(needed, sort_targets(found) or None, True)


def _needed(fh: BinaryIO, offset: int, length: int, strsec: tuple[int, ...]) -> tuple[str, ...]:
    """DT_NEEDED names: each read straight from .dynstr (which may be megabytes)."""
    data = _at(fh, offset, min(length, 16 * 4096))
    out: list[str] = []
    for pos in range(0, len(data) - 15, 16):
        tag, val = struct.unpack_from("<qQ", data, pos)
        if tag == 0:  # DT_NULL
            break
        if tag == 1 and val < strsec[5] and len(out) < MAX_NEEDED:  # DT_NEEDED
            fh.seek(strsec[4] + val)
            raw = fh.read(256)
            out.append(raw.split(b"\0", 1)[0].decode("utf-8", errors="replace"))
    return tuple(out)


def _fatbin_targets(fh: BinaryIO, start: int, length: int) -> set[str] | None:
    """Walk the containers of one fatbin section, reading only their headers; None when the
    section is not a sequence of well-formed containers (a partial list would understate)."""
    found: set[str] = set()
    end, pos, entries = start + length, start, 0
    try:
        while pos + 16 <= end:
            magic, _version, head, body = struct.unpack("<IHHQ", _at(fh, pos, 16))
            if magic != FATBIN_MAGIC:
                if magic == 0 and _version == 0 and head == 0:  # padding between containers
                    pos += 8
                    continue
                return None
            if head < 16 or pos + head + body > end:
                return None
            entry, stop = pos + head, pos + head + body
            while entry < stop:
                entries += 1
                if entries > MAX_ENTRIES or entry + _ENTRY_SIZE > stop:
                    return None
                kind, _, size, payload, _, _, _, arch = _ENTRY.unpack(
                    _at(fh, entry, _ENTRY.size))
                if size < _ENTRY_SIZE or entry + size + payload > stop:
                    return None
                if 10 <= arch < 1000 and kind in (KIND_PTX, KIND_CUBIN):
                    found.add(f"{'compute' if kind == KIND_PTX else 'sm'}_{arch}")
                entry += size + payload
            pos = stop
    except (ValueError, struct.error):
        return None
    return found


def sort_targets(targets: Iterable[str]) -> tuple[str, ...]:
    """sm_70, sm_80, compute_80, sm_90: by architecture, the cubin before the PTX."""
    def key(t: str) -> tuple[int, int]:
        kind, _, num = t.partition("_")
        return int(num) if num.isdigit() else 0, kind != "sm"

    return tuple(sorted(set(targets), key=key))
