"""The one table of driver minimums: what a CUDA release needs from the driver.

Every consumer (doctor's rules, ``compat check``, ``compat suggest``, ``compat show``) asks
:func:`driver_need`, so they cannot disagree. Two numbers per CUDA release, both from the
CUDA release notes:

- ``minimum``: the oldest driver that runs code built with this CUDA. From CUDA 11 on that is
  the minor-version-compatibility floor of its major (Table 2: 11.x >= 450.80.02, 12.x >=
  525.60.13, 13.x >= 580.65.06); before CUDA 11 there was no MVC and it is the release's own
  driver (Table 3).
- ``full``: the driver bundled with the release (Table 3): all of its features, and PTX
  from its compiler JIT-compiles (under MVC alone that PTX fails with
  cudaErrorUnsupportedPtxVersion).

A GPU may need more (Blackwell needs R570 whatever the CUDA): :func:`with_gpu` folds the
architecture's minimum in.
"""

from __future__ import annotations

from dataclasses import dataclass

from dnnctl.compat.matrix import Matrix
from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version


@dataclass(frozen=True)
class DriverNeed:
    """What CUDA ``cuda`` needs from the driver (None where the matrix does not know)."""

    cuda: Version
    minimum: Version | None  # runs prebuilt code (MVC floor, or the release's driver pre-11)
    full: Version | None  # full support: the release's bundled driver
    mvc: bool  # minor-version compatibility applies to this major
    major_row: Row | None
    release_row: Row | None

    @property
    def known(self) -> bool:
        return self.minimum is not None

    def fully_supported(self, driver: Version, have: Version | None) -> bool:
        """A driver reporting CUDA ``have`` fully supports this CUDA: it reports at least
        this CUDA and, before CUDA 11, is at or past the release's own driver (an update
        release may need more than its GA: CUDA 8.0.61 against 8.0.44)."""
        return have is not None and have >= self.cuda and (
            self.mvc or self.full is None or driver >= self.full)

    @property
    def row(self) -> Row | None:
        """The row to cite for ``minimum``."""
        return self.major_row if self.mvc else self.release_row

    def to_dict(self) -> dict[str, str | None]:
        return {"min_driver": str(self.minimum) if self.minimum else None,
                "full_driver": str(self.full) if self.full else None}


def driver_need(matrix: Matrix, cuda: Version, *, windows: bool = False) -> DriverNeed:
    """The driver minimums of CUDA ``cuda`` (Linux numbering unless ``windows``)."""
    major = matrix.cuda_major(cuda.major)
    rel = matrix.cuda_release(cuda)
    key = "driver_windows" if windows else "driver_linux"
    full = Version.maybe(rel.get(key)) if rel is not None and not rel.uncertain else None
    if full is not None and not windows:
        # an update release that needs a newer driver than its GA (``updates``: the update's
        # version -> its Linux driver, e.g. CUDA 8.0.61 GA2 >= 375.26 where 8.0.44 needs
        # 367.48): a runtime at or past the update needs that driver
        for update, driver in (rel.get("updates") or {}).items():
            upd, drv = Version.maybe(update), Version.maybe(driver)
            if upd is not None and drv is not None and cuda >= upd and drv > full:
                full = drv
    floor_key = "mvc_min_driver_windows" if windows else "mvc_min_driver"
    floor = Version.maybe(major.get(floor_key)) if major is not None else None
    mvc = major is not None and major.get("mvc", True) is not False
    if not mvc:
        floor = full  # before CUDA 11 every minor release needs its own driver
    return DriverNeed(cuda.trunc(2), floor, full, mvc, major, rel)


def arch_min_driver(matrix: Matrix | None, arch: Row | None, *,
                    windows: bool = False) -> Version | None:
    """The driver a GPU architecture needs whatever the CUDA: its ``min_driver``, the driver
    bundled with its ``min_cuda`` (Linux numbering); on Windows that release's Windows driver."""
    if arch is None or not arch.get("min_driver"):
        return None
    if not windows:
        return Version.maybe(arch["min_driver"])
    rel = matrix.cuda_release(Version.parse(arch["min_cuda"]))
    return Version.maybe(rel.get("driver_windows")) if rel is not None and not rel.uncertain \
        else None


def with_gpu(need: DriverNeed, arch: Row | None, *, matrix: Matrix | None = None,
             windows: bool = False) -> DriverNeed:
    """``need`` raised to what the GPU architecture itself needs (:func:`arch_min_driver`;
    ``windows`` needs the matrix to number it as Windows drivers are)."""
    gpu = arch_min_driver(matrix, arch, windows=windows and matrix is not None)
    if gpu is None:
        return need
    # an unknown CUDA floor stays unknown (the GPU's own minimum is not the whole answer)
    lo = need.minimum if need.minimum is not None and need.minimum >= gpu else (
        gpu if need.minimum is not None else None)
    hi = need.full if need.full is not None and need.full >= gpu else (
        gpu if need.full is not None else None)
    return DriverNeed(need.cuda, lo, hi, need.mvc, need.major_row, need.release_row)


def driver_status(matrix: Matrix, driver: Version | None, cuda: Version,
                  *, windows: bool = False) -> str:
    """full | mvc | too-old | unknown for a driver against one CUDA version."""
    if driver is None:
        return "unknown"
    need = driver_need(matrix, cuda, windows=windows)
    have, unsure = matrix.driver_cuda(driver, windows=windows)
    if not unsure and need.fully_supported(driver, have):
        return "full"
    if need.minimum is None:
        return "unknown"
    if driver >= need.minimum and need.mvc and have is not None and have.major >= cuda.major:
        return "unknown" if need.full is None else "mvc"
    return "too-old"
