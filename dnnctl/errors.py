"""One error hierarchy for the whole library, rendered once at the CLI edge.

Every error carries a short machine-readable ``code``, a human ``message`` saying what is
wrong, and a ``hint`` saying how to fix it. The CLI maps ``exit_code`` to the process status.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit statuses used by every ``dnnctl`` command."""

    OK = 0  # success; for doctor: verdict pass
    FAIL = 1  # the check ran and found a problem (doctor fail, tune with unplanned problems)
    USAGE = 2  # bad usage or unreadable input (bad flag, malformed file)
    UNAVAILABLE = 3  # the requested device/backend is not available here
    INTERRUPTED = 130  # Ctrl-C; a journal keeps what was done


class DnnctlError(Exception):
    """Base of every error dnnctl raises on purpose."""

    code = "error"
    exit_code = ExitCode.FAIL

    def __init__(self, message: str, hint: str | None = None, *, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"

    def to_dict(self) -> dict[str, str | None]:
        return {"code": self.code, "message": self.message, "hint": self.hint}


class UsageError(DnnctlError):
    """The caller asked for something malformed: a bad flag, key, dtype, shape or layout."""

    code = "usage"
    exit_code = ExitCode.USAGE


class InputFileError(UsageError):
    """A file given to dnnctl (plan, workload, env snapshot, matrix overlay) cannot be used."""

    code = "bad-file"

    def __init__(self, path: str, message: str, hint: str | None = None, *,
                 line: int | None = None, where: str | None = None):
        loc = str(path) + (f":{line}" if line is not None else "")
        if where:
            loc += f" ({where})"
        super().__init__(f"{loc}: {message}", hint)
        self.path = str(path)
        self.line = line
        self.where = where


class PlanError(InputFileError):
    """A plan file is malformed, hostile or refers to unknown ops/variants/parameters."""

    code = "bad-plan"


class StalePlanError(DnnctlError):
    """A plan was made on another device, driver or kernels digest and strict mode refuses it."""

    code = "stale-plan"
    exit_code = ExitCode.FAIL


class ShapeError(UsageError):
    """Arrays passed to an op have the wrong shape, dtype, layout or device."""

    code = "bad-input"


class UnsupportedError(DnnctlError):
    """A variant or op does not support the problem; ``reason`` says why."""

    code = "unsupported"
    exit_code = ExitCode.USAGE


class BackendUnavailableError(DnnctlError):
    """The requested backend or device cannot be used on this machine."""

    code = "backend-unavailable"
    exit_code = ExitCode.UNAVAILABLE


class KernelBuildError(DnnctlError):
    """A bundled CUDA kernel failed to compile (NVRTC log attached to the message)."""

    code = "kernel-build"


class KernelLaunchError(DnnctlError):
    """A kernel launch failed (bad launch configuration, illegal address, ...)."""

    code = "kernel-launch"
