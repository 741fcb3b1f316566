"""Inter-process locks for plan, workload and journal files, that say who holds them.

Every read-modify-write of a dnnctl file holds the lock of that file's absolute path (a
``filelock`` lock file in ``$TMPDIR/dnnctl-locks``, so nothing piles up next to plans). The
holder writes a small JSON sidecar (pid, host, command, since) beside the lock file, so a
writer that cannot get the lock in time names who holds it. On release the holder removes
the sidecar and the lock file while it still holds the lock; a waiter that then wins the
lock on the removed file notices (the path no longer names its file) and tries again, so
removing lock files never lets two processes in at once.

Taking the lock of ``path`` also removes the temp files (``.<name>.*.tmp``) that an atomic
write of ``path`` left behind when its process was killed: every writer of ``path`` holds
this lock, so under it such a file can only be an orphan.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from dnnctl.errors import DnnctlError

_MKSTEMP_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_")


class LockedError(DnnctlError):
    """Another process holds the lock of a dnnctl file for longer than we may wait."""

    code = "locked"


def lock_dir() -> Path:
    """Where lock files and their sidecars live (one per locked path, while locked)."""
    d = Path(tempfile.gettempdir()) / "dnnctl-locks"
    d.mkdir(exist_ok=True)
    return d


def lock_paths(path: str | os.PathLike[str]) -> tuple[str, Path, Path]:
    """(absolute path, lock file, info sidecar) for ``path``."""
    absolute = os.path.abspath(os.fspath(path))
    tag = hashlib.sha256(absolute.encode()).hexdigest()[:20]
    d = lock_dir()
    return absolute, d / f"{tag}.lock", d / f"{tag}.info"


def holder(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Who holds the lock of ``path`` according to its sidecar (None if nobody says)."""
    _, _, info = lock_paths(path)
    try:
        data = json.loads(info.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe_holder(info: dict[str, Any] | None) -> str:
    """'pid 123 on host (dnnctl tune ...) since 12:00:00Z' or 'another process'."""
    if not info:
        return "another process"
    text = f"pid {info.get('pid')} on {info.get('host')}"
    if info.get("command"):
        text += f" ({info['command']})"
    if info.get("since"):
        text += f" since {info['since']}"
    return text


@contextlib.contextmanager
def path_lock(path: str | os.PathLike[str], timeout: float = 60.0, purpose: str = "write"
              ) -> Iterator[None]:
    """Hold the lock of ``path``; LockedError naming the holder after ``timeout`` seconds
    (0: fail at once)."""
    absolute, lock_file, info = lock_paths(path)
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        lock = FileLock(str(lock_file), timeout=max(0.0, deadline - time.monotonic()))
        try:
            lock.acquire()
        except Timeout:
            who = describe_holder(holder(absolute))
            waited = f"waited {timeout:.0f} s" if timeout >= 1 else "not waiting"
            raise LockedError(f"{absolute} is locked by {who}; {waited}",
                              hint="wait for that dnnctl command to finish (or stop it), "
                                   "then run this one again") from None
        if _still_named(lock, lock_file):
            break
        lock.release()  # we won the lock of a file its holder had just removed
    try:
        _write_info(info, absolute, purpose)
        _sweep_orphans(Path(absolute))
        yield
    finally:
        for p in (info, lock_file):
            try:
                p.unlink()
            except OSError:
                pass
        lock.release()


def _still_named(lock: FileLock, lock_file: Path) -> bool:
    """True when ``lock_file`` still names the file whose lock we hold."""
    fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
    try:
        here = os.stat(lock_file)
    except OSError:
        return False
    if fd is None:  # a filelock without the descriptor: trust it
        return True
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (here.st_dev, here.st_ino)


def _write_info(info: Path, absolute: str, purpose: str) -> None:
    command = " ".join([Path(sys.argv[0]).name if sys.argv else "python", *sys.argv[1:]])
    data = {"pid": os.getpid(), "host": socket.gethostname(), "command": command[:300],
            "purpose": purpose, "path": absolute,
            "since": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    with contextlib.suppress(OSError):  # the sidecar only improves a message
        info.write_text(json.dumps(data), encoding="utf-8")


def _sweep_orphans(path: Path) -> None:
    directory = path.parent
    try:
        names = os.listdir(directory)
    except OSError:
        return
    prefix = f".{path.name}."
    for name in names:
        # exactly write_atomic's mkstemp names: prefix + 8 random [a-z0-9_] + '.tmp'
        middle = name[len(prefix):-4]
        if name.startswith(prefix) and name.endswith(".tmp") and len(middle) == 8 and \
                set(middle) <= _MKSTEMP_CHARS:
            with contextlib.suppress(OSError):
                os.unlink(directory / name)
