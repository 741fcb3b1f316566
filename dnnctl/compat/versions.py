"""Numeric versions, version ranges, compute capabilities and CUDA targets.

Everything here compares numerically: ``570.124.06`` is newer than ``570.26`` (a string
compare gets that wrong). torch versions carry a local tag (``2.2.0+cu121``); cuDNN reports
an integer (``8907`` = 8.9.7, ``90100`` = 9.1.0). A compute capability is ``major.minor``
(``"9.0"``); a build target is ``sm_90`` (a cubin), ``compute_90`` (PTX), with an optional
``a`` (arch-specific, runs only on that exact CC) or ``f`` (family: same major, minor >=).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import total_ordering
from typing import TypeVar

from dnnctl.errors import UsageError

_NUM = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")
MAX_PART_DIGITS = 9  # no real version has a longer component; bounds int() on hostile text
MAX_TEXT = 200
MAX_MINOR = 10**MAX_PART_DIGITS - 1  # above every real minor: "the end of major X"


_PARSED: dict[str, Version] = {}  # parse() results by text (Versions are immutable)
_PARSED_MAX = 8192


_P = TypeVar("_P", bound="_Parsed")


class _Parsed:
    """A value read from text by the class's ``parse``, which raises UsageError on garbage."""

    @classmethod
    def parse(cls: type[_P], text: object) -> _P:
        raise NotImplementedError

    @classmethod
    def maybe(cls: type[_P], text: object) -> _P | None:
        """Like parse, but None for None/garbage (probes report garbage sometimes)."""
        if text is None:
            return None
        try:
            return cls.parse(text)
        except UsageError:
            return None


@total_ordering
@dataclass(frozen=True)
class Version(_Parsed):
    """A dotted numeric version; trailing zeros do not matter (12.8 == 12.8.0)."""

    parts: tuple[int, ...]
    text: str = ""
    key: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = list(self.parts)
        while len(parts) > 1 and parts[-1] == 0:
            parts.pop()
        object.__setattr__(self, "key", tuple(parts))  # compared often: made once

    @classmethod
    def parse(cls, text: object) -> Version:
        """Parse ``"570.124.06"``, ``"2.2.0+cu121"`` (local tag ignored), ``12.8`` (a number)."""
        memo = cls is Version and text.__class__ is str
        if memo:
            hit = _PARSED.get(text)  # type: ignore[arg-type]
            if hit is not None:
                return hit  # the matrix's rules parse the same few hundred strings often
        s = str(text).strip()
        m = _NUM.match(s[:MAX_TEXT]) if len(s) <= MAX_TEXT else None
        if not m or any(len(p) > MAX_PART_DIGITS for p in m.group(1).split(".")):
            shown = s if len(s) <= 40 else f"{s[:20]}...({len(s)} characters)"
            raise UsageError(f"not a version: {shown!r}", hint="use dotted numbers, e.g. 12.8")
        v = cls(tuple(int(p) for p in m.group(1).split(".")), m.group(1))
        if memo and len(_PARSED) < _PARSED_MAX:
            _PARSED[text] = v  # type: ignore[index]
        return v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __lt__(self, other: Version) -> bool:
        return self.key < other.key

    @property
    def major(self) -> int:
        return self.parts[0]

    @property
    def minor(self) -> int:
        return self.parts[1] if len(self.parts) > 1 else 0

    @property
    def major_only(self) -> bool:
        """Only the major is known (``"12"`` from a ``jax-cuda12-plugin`` or ``cupy-cuda12x``
        name): not the same fact as ``"12.0"``, so it must not meet a minor bound as 12.0."""
        return len(self.parts) == 1

    def trunc(self, n: int) -> Version:
        """The first ``n`` components (``9.10.2.21`` -> ``9.10`` for n=2)."""
        parts = (self.parts + (0,) * n)[:n]
        return Version(parts, ".".join(map(str, parts)))

    def __str__(self) -> str:
        return self.text or ".".join(map(str, self.parts))


_RELEASE = re.compile(r"v?(\d{1,9}(?:\.\d{1,9})*)(?:[-_.]?(a|alpha|b|beta|rc|c)[-_.]?(\d{0,9}))?"
                      r"(?:[-_.]?(?:post|dev)[-_.]?\d{0,9})*", re.IGNORECASE)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "rc": 2, "c": 2}


def release_key(text: object) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """An ordering key that, unlike :class:`Version`, tells pre-releases apart (PEP 440):
    ``0.12.0rc0`` < ``0.12.0rc1`` < ``0.12.0`` == ``0.12``; a local tag is ignored. Raises
    UsageError on text that is no release."""
    m = _RELEASE.fullmatch(str(text).split("+", 1)[0].strip()[:MAX_TEXT])
    if not m:
        raise UsageError(f"not a release: {str(text)[:40]!r}",
                         hint='write it as released, e.g. "0.12.0rc1" or "1.15"')
    parts = Version.parse(m.group(1)).key
    if m.group(2) is None:
        return parts, (1,)
    return parts, (0, _PRE[m.group(2).lower()], int(m.group(3) or 0))


def cmp_versions(a: object, b: object) -> int:
    """-1, 0 or 1 comparing two version strings numerically."""
    va, vb = Version.parse(a), Version.parse(b)
    return (va > vb) - (va < vb)


_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<|~=)?\s*([0-9][0-9.]*)(\.\*)?\s*$")


@dataclass(frozen=True)
class VersionRange:
    """A comma-separated set of clauses: ``">=9.11, <9.17"``, ``"==2.7.*"``, ``"12.8"``."""

    text: str
    clauses: tuple[tuple[str, Version, bool], ...]

    @classmethod
    def parse(cls, text: str) -> VersionRange:
        clauses = []
        for raw in str(text).split(","):
            if not raw.strip():
                continue
            m = _CLAUSE.match(raw)
            if not m:
                raise UsageError(f"not a version range: {text!r}",
                                 hint='write clauses like ">=9.11, <9.17" or "==2.7.*"')
            op = m.group(1) or "=="
            clauses.append((op, Version.parse(m.group(2)), bool(m.group(3))))
        if not clauses:
            raise UsageError(f"empty version range: {text!r}")
        return cls(str(text), tuple(clauses))

    def contains(self, version: Version | str) -> bool:
        v = version if isinstance(version, Version) else Version.parse(version)
        return all(_holds(op, v, ref, star) for op, ref, star in self.clauses)

    def admits(self, version: Version | str) -> bool:
        """``contains``, except that a major-only version (``"12"``) means "some 12.x": true
        when any release of that major can be in the range (">=12.1, <13" admits 12)."""
        v = version if isinstance(version, Version) else Version.parse(version)
        if not v.major_only:
            return self.contains(v)
        # the range's edges inside this major, and the points just above them, are the only
        # places where membership can change: testing those and both ends of X.y is exact
        major = v.major
        points = [Version((major, 0)), Version((major, MAX_MINOR))]
        for _, ref, _ in self.clauses:
            if ref.major == major:
                points += [ref, Version(ref.parts + (1,) if len(ref.parts) > 1 else (major, 0, 1))]
        return any(self.contains(p) for p in points)

    def lowest(self) -> Version | None:
        """The lowest version a ">=" or "==" clause names (a table row's first release)."""
        lows = [v for op, v, _ in self.clauses if op in (">=", "==")]
        return min(lows) if lows else None

    def upper(self) -> Version | None:
        """The smallest "<" bound (the first release past a table row), None without one."""
        highs = [v for op, v, _ in self.clauses if op == "<"]
        return min(highs) if highs else None

    def __str__(self) -> str:
        return self.text


def _holds(op: str, v: Version, ref: Version, star: bool) -> bool:
    if star or op == "~=":  # prefix match: ==2.7.* / ~=2.7 means 2.7.x
        n = len(ref.parts)
        prefix = v.trunc(n) == ref if star else (v >= ref and v.trunc(n - 1) == ref.trunc(n - 1))
        return prefix if op in ("==", "~=") else not prefix
    return {
        ">=": v >= ref, "<=": v <= ref, ">": v > ref, "<": v < ref, "==": v == ref, "!=": v != ref,
    }[op]


def cudnn_from_int(value: int | str) -> Version:
    """Decode ``cudnnGetVersion()``: 8907 -> 8.9.7 (v8: M*1000+m*100+p), 90100 -> 9.1.0."""
    n = int(value)
    if n >= 10000:  # cuDNN 9 and later: major*10000 + minor*100 + patch
        major, rest = divmod(n, 10000)
        minor, patch = divmod(rest, 100)
    else:
        major, rest = divmod(n, 1000)
        minor, patch = divmod(rest, 100)
    return Version((major, minor, patch), f"{major}.{minor}.{patch}")


def parse_cudnn(text: object) -> Version | None:
    """A cuDNN version from a dotted string or the integer encoding; None for garbage."""
    s = str(text).strip() if text is not None else ""
    if s.isdigit() and len(s) >= 4:
        return cudnn_from_int(s)
    return Version.maybe(s) if s else None


# the local tags of the wheels pytorch.org publishes (https://download.pytorch.org/whl/)
OFFICIAL_LOCAL = re.compile(r"cu\d{2,3}|cpu(\.cxx11\.abi)?|cpu_cxx11_abi|rocm[\d.]+|xpu")


@dataclass(frozen=True)
class TorchVersion:
    """A torch version split into its release and local tag (``2.2.0+cu121``)."""

    release: Version
    local: str | None  # "cu121", "cpu", "rocm6.2", or None for a PyPI default wheel
    text: str

    @classmethod
    def parse(cls, text: object) -> TorchVersion:
        s = str(text).strip()
        base, _, local = s.partition("+")
        release = Version.parse(base)
        return cls(release, local.lower() or None, s)

    @property
    def line(self) -> str:
        """The minor line, e.g. ``"2.2"`` (the PyTorch build matrix is fixed per line)."""
        return str(self.release.trunc(2))

    @property
    def is_dev(self) -> bool:
        return bool(re.search(r"(dev|a|b|rc)\d", self.text.partition("+")[0]))

    @property
    def custom(self) -> bool:
        """A build that is no PyPI / download.pytorch.org wheel: its local tag is a commit or
        a vendor's tag (an NGC container's ``2.2.0a0+<commit>``, JetPack's ``.nv23.06``), not a
        ``cuXYZ`` / ``cpu`` / ``rocmX.Y`` / ``xpu`` variant."""
        return self.local is not None and not OFFICIAL_LOCAL.fullmatch(self.local)

    @property
    def cuda(self) -> Version | None:
        """The CUDA version a ``cuXYZ`` tag names (cu121 -> 12.1, cu130 -> 13.0)."""
        return cuda_from_tag(self.local) if self.local else None


def cuda_from_tag(tag: str) -> Version | None:
    """``cu121`` -> 12.1, ``cu118`` -> 11.8, ``cu130`` -> 13.0; None for cpu/rocm/others."""
    m = re.fullmatch(r"cu(\d{2})(\d)", tag.strip().lower())
    if not m:
        return None
    return Version((int(m.group(1)), int(m.group(2))), f"{int(m.group(1))}.{m.group(2)}")


def tag_from_cuda(cuda: Version | str) -> str:
    """12.1 -> ``cu121``."""
    v = cuda if isinstance(cuda, Version) else Version.parse(cuda)
    return f"cu{v.major}{v.minor}"


@total_ordering
@dataclass(frozen=True)
class CC(_Parsed):
    """A compute capability, ``major.minor`` (``CC.parse("sm_90")`` == 9.0)."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: object) -> CC:
        s = str(text).strip().lower()[:MAX_TEXT]
        m = re.fullmatch(r"(?:sm_?|compute_?)?(\d{1,3})\.(\d)[af]?", s) or \
            re.fullmatch(r"(?:sm_?|compute_?)?(\d{1,3})(\d)[af]?", s)
        if not m:
            raise UsageError(f"not a compute capability: {text!r}",
                             hint='write it as "9.0", "sm_90" or "90"')
        return cls(int(m.group(1)), int(m.group(2)))

    def __lt__(self, other: CC) -> bool:
        return (self.major, self.minor) < (other.major, other.minor)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}"


@dataclass(frozen=True)
class Target:
    """One entry of a build's arch list: ``sm_86`` (cubin), ``compute_90`` (PTX), ``sm_90a``."""

    ptx: bool
    cc: CC
    suffix: str  # "", "a" (arch-specific) or "f" (family)

    @classmethod
    def parse(cls, text: str) -> Target:
        s = str(text).strip().lower()
        m = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", s)
        if not m:
            raise UsageError(f"not a CUDA target: {text!r}",
                             hint="write sm_86 for a cubin, compute_90 for PTX, sm_90a, sm_100f")
        return cls(m.group(1) == "compute", CC(int(m.group(2)), int(m.group(3))), m.group(4))

    def runs_on(self, gpu: CC) -> bool:
        """Whether this code can execute on ``gpu`` (cubin rule, PTX JIT, ``a``/``f``)."""
        if self.suffix == "a":  # arch-specific: that exact CC only, never forward
            return gpu == self.cc
        if self.ptx and not self.suffix:  # PTX JIT-compiles onto any newer GPU
            return gpu >= self.cc
        # cubins and family targets: same major, minor at least as high
        return gpu.major == self.cc.major and gpu.minor >= self.cc.minor

    def __str__(self) -> str:
        kind = "compute" if self.ptx else "sm"
        return f"{kind}_{self.cc.major}{self.cc.minor}{self.suffix}"


def parse_arch_list(items: list[str] | str) -> list[Target]:
    """Parse a torch-style arch list: ``['sm_80', 'compute_90']`` or ``"8.0;9.0+PTX"``."""
    if isinstance(items, str):
        out: list[Target] = []
        for part in re.split(r"[;,\s]+", items.strip()):
            if not part:
                continue
            if re.fullmatch(r"(sm|compute)_\d+[af]?", part.lower()):
                out.append(Target.parse(part))
                continue
            base, plus, _ = part.upper().partition("+PTX")
            cc = CC.parse(base.lower().rstrip("af"))
            sfx = base[-1].lower() if base[-1:].lower() in ("a", "f") else ""
            out.append(Target(False, cc, sfx))
            if plus:
                out.append(Target(True, cc, ""))
        return out
    return [Target.parse(t) for t in items]
