"""The machine as the probes see it, with every access injectable for tests.

A :class:`Host` bundles the command runner (argv lists, never a shell), the filesystem root
(tests point it at a directory of canned ``/proc``, ``/sys``, ``/usr/local/cuda*`` files),
the environment variables, the Python ``site`` directories whose installed distributions are
read, the NVML module and the ``ctypes`` loader. Probes only go through it, and every
accessor returns ``None`` or an error string instead of raising.
"""

from __future__ import annotations

import glob as _glob
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from dnnctl.doctor import spawn, timing
from dnnctl.doctor.distinfo import Dist, read_version
from dnnctl.doctor.parse import canonical_name

__all__ = ["CmdResult", "Dist", "Host", "Runner", "run_command"]

MAX_READ = 1 << 20  # text files we read are small; never slurp something huge


@dataclass(frozen=True)
class CmdResult:
    """What a command did. ``error`` is set when it did not finish (timeout, no permission)."""

    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], timeout: float) -> CmdResult | None:
        """Run ``argv``; ``None`` when the program does not exist."""
        ...


MAX_OUTPUT = 1 << 20  # bytes kept of each stream of a command (nvidia-smi, ldconfig -p)


def run_command(argv: Sequence[str], timeout: float) -> CmdResult | None:
    """The real runner: no shell, no stdin, a hard timeout, at most MAX_OUTPUT bytes kept of
    stdout and of stderr (a command printing more is stopped), decoded leniently. A process
    the command line started early for the same argv (dnnctl.doctor.spawn) is taken over."""
    try:
        proc = spawn.claim(argv) or spawn.popen(argv)
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        return CmdResult(None, "", "", f"permission denied: {exc.filename or argv[0]}")
    except OSError as exc:
        return CmdResult(None, "", "", f"{type(exc).__name__}: {exc}")
    bufs: dict[int, bytearray] = {}
    fds = (proc.stdout.fileno(), proc.stderr.fileno())  # type: ignore[union-attr]
    error = None
    deadline = time.monotonic() + max(timeout, 0.0)
    with proc, selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream, selectors.EVENT_READ)
            bufs[stream.fileno()] = bytearray()
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                error = f"timed out after {timeout:g} s"
                break
            for key, _ in sel.select(min(left, 0.5)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.fd]
                buf += chunk[:max(0, MAX_OUTPUT - len(buf))]
                if len(buf) >= MAX_OUTPUT and len(chunk) and error is None:
                    error = f"printed more than {MAX_OUTPUT >> 20} MiB: stopped"
            if error:
                break
        if error:
            spawn.kill_group(proc)
        try:
            code = proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            spawn.kill_group(proc)
            code = proc.wait()
            error = error or f"timed out after {timeout:g} s"
    out, err = (bufs[fd].decode(errors="replace") for fd in fds)
    return CmdResult(None if error and "timed out" in error else code, out, err, error)


@dataclass
class Host:
    """Everything a probe may touch. The defaults are this machine and this interpreter."""

    root: Path = Path("/")
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    runner: Runner = run_command
    site_paths: Sequence[str] = field(default_factory=lambda: list(sys.path))
    python: str = sys.executable
    nvml: Callable[[], Any] | None = None  # None: ask NVML in a child (dnnctl.doctor.native)
    load_library: Callable[[str], Any] | None = None  # None: load libcuda in a child only
    timeout: float = 2.0  # one command's limit
    deadline: float | None = None  # time.monotonic() by which every probe must be done

    # -- filesystem (logical absolute paths, mapped under ``root``) -----------------------

    def path(self, logical: str) -> Path:
        """Where a logical absolute path is on this filesystem (links resolved in ``root``)."""
        if str(self.root) == "/":
            return Path(logical)
        return self._raw(self.realpath(logical))

    def _raw(self, logical: str) -> Path:
        return Path(logical) if str(self.root) == "/" else self.root / logical.lstrip("/")

    def exists(self, logical: str) -> bool:
        try:
            return self.path(logical).exists()
        except OSError:
            return False

    def is_dir(self, logical: str) -> bool:
        try:
            return self.path(logical).is_dir()
        except OSError:
            return False

    def read_text(self, logical: str, limit: int = MAX_READ) -> tuple[str | None, str | None]:
        """(text, None), or (None, why): "missing", "permission denied", "unreadable: ...".
        At most ``limit`` bytes are read."""
        try:
            with open(self.path(logical), "rb") as fh:
                return fh.read(limit).decode("utf-8", errors="replace"), None
        except FileNotFoundError:
            return None, "missing"
        except PermissionError:
            return None, "permission denied"
        except OSError as exc:
            return None, f"unreadable: {exc.strerror or exc}"

    def glob(self, pattern: str) -> list[str]:
        """Logical paths matching a glob pattern, sorted."""
        hits = _glob.glob(str(self.path(pattern)))
        if str(self.root) == "/":
            return sorted(hits)
        base = str(self.root).rstrip("/")
        return sorted("/" + os.path.relpath(h, base) for h in hits)

    def listdir(self, logical: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(logical)))
        except OSError:
            return []

    def realpath(self, logical: str) -> str:
        """Resolve symlinks component by component inside ``root`` (absolute links too)."""
        stack = list(reversed(PurePosixPath(logical).parts[1:]))
        resolved = PurePosixPath("/")
        hops = 0
        while stack:
            part = stack.pop()
            if part in ("", "."):
                continue
            if part == "..":
                resolved = resolved.parent
                continue
            candidate = resolved / part
            real = self._raw(str(candidate))
            if hops < 40 and real.is_symlink():
                hops += 1
                try:
                    target = PurePosixPath(os.readlink(real))
                except OSError:
                    resolved = candidate
                    continue
                if target.is_absolute():
                    resolved = PurePosixPath("/")
                    stack.extend(reversed(target.parts[1:]))
                else:
                    stack.extend(reversed(target.parts))
            else:
                resolved = candidate
        return str(resolved)

    def which(self, program: str) -> str | None:
        for d in self.environ.get("PATH", "").split(os.pathsep):
            if d and os.access(self.path(os.path.join(d, program)), os.X_OK):
                return os.path.join(d, program)
        return None

    def env_paths(self, name: str) -> list[str]:
        """A PATH-like variable as a list of directories (empty entries dropped)."""
        return [p for p in self.environ.get(name, "").split(os.pathsep) if p]

    # -- processes ------------------------------------------------------------------------

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def run(self, argv: Sequence[str], timeout: float | None = None,
            label: str | None = None) -> CmdResult | None:
        """Run a command under its own limit and doctor's overall deadline (timed as
        ``run: LABEL``, default the program's name, when timing is on)."""
        limit = timeout if timeout is not None else self.timeout
        left = self.remaining()
        if left is not None:
            if left <= 0.05:
                return CmdResult(None, "", "", "skipped: doctor's time limit was reached")
            limit = min(limit, left)
        name = label or " ".join(os.path.basename(str(a)) for a in list(argv)[:2])
        try:
            with timing.span(f"run: {name}"):
                return self.runner(list(argv), limit)
        except Exception as exc:  # an injected runner must not take doctor down either
            return CmdResult(None, "", "", f"{type(exc).__name__}: {exc}")

    # -- installed Python distributions ---------------------------------------------------

    def distributions(self, wanted: Callable[[str], bool]) -> tuple[dict[str, Dist], list[str]]:
        """Distributions whose canonical name passes ``wanted``, first on the path winning.

        Returns ({name: Dist}, notes about shadowed duplicates). Only folder names are
        listed for everything; metadata is read for the wanted ones only (fast).
        """
        found: dict[str, Dist] = {}
        notes: list[str] = []
        for name, base, info in self.metadata_dirs():
            if not wanted(name):
                continue
            version = read_version(info)
            if not version:
                continue
            if name in found:
                first = found[name]
                if first.info_dir != info:
                    notes.append(f"{name} is installed twice: {first.version} in "
                                 f"{first.location} (imported) and {version} in {base}")
                continue
            found[name] = Dist(name, str(version), base, info)
        return found, notes

    def metadata_dirs(self) -> Iterator[tuple[str, Path, Path]]:
        """(canonical name, site folder, its ``*.dist-info`` / ``*.egg-info``) of every
        distribution on the path, in import order (each folder once; a name may repeat:
        the first one is what an import finds). Only folder names are listed."""
        seen_dirs: set[str] = set()
        for entry in self.site_paths:
            base = Path(entry or ".")
            try:
                key = str(base.resolve())
                if key in seen_dirs or not base.is_dir():
                    continue
                seen_dirs.add(key)
                names = sorted(os.listdir(base))
            except OSError:
                continue
            for fname in names:
                if fname.endswith((".dist-info", ".egg-info")):
                    yield canonical_name(fname.rsplit(".", 1)[0].split("-", 1)[0]), base, \
                        base / fname
