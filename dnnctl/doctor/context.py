"""The snapshot resolved against the matrix, shared by every rule module.

``build_context`` turns an EnvSnapshot into a :class:`Context` (driver, GPUs with their matrix
rows, platform, forward compatibility); ``finding`` / ``unknown`` build Findings citing the row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dnnctl.compat.drivers import driver_need
from dnnctl.compat.gpus import GpuInfo, resolve_gpu
from dnnctl.compat.matrix import Matrix
from dnnctl.compat.schema import Row
from dnnctl.compat.versions import CC, MAX_MINOR, Version
from dnnctl.doctor.model import EnvSnapshot, Finding
from dnnctl.doctor.parse import canonical_name, driver_branch, wsl_version

__all__ = ["Context", "GpuInfo", "build_context", "finding", "flag", "unknown"]


@dataclass
class Context:
    """The snapshot resolved against the matrix, shared by every rule."""

    env: EnvSnapshot
    matrix: Matrix
    driver: Version | None
    driver_present: bool | None
    gpus: list[GpuInfo] = field(default_factory=list)
    platform: str | None = None  # "x86_64" | "aarch64" | None (unknown)
    forward_compat: Version | None = None  # the cuda-compat version in use, if any
    # a driver known by its branch alone ("535", "r535"): ``driver`` is then None, and what
    # every driver of the branch shares is judged (driver_span, driver_at_least)
    driver_branch: int | None = None

    @property
    def driver_major(self) -> int | None:
        """The driver's branch (R535 for 535.54.03), exact or given alone."""
        return self.driver.major if self.driver is not None else self.driver_branch

    @property
    def driver_span(self) -> tuple[Version, Version] | None:
        """The oldest and newest driver the snapshot may mean: the exact one twice, a bare
        branch's first and last possible version (Linux numbering: a Windows driver's version
        does not start with its branch, R535 is 53x.xx there), None when unknown."""
        if self.driver is not None:
            return self.driver, self.driver
        if self.driver_branch is None or self.windows:
            return None
        return Version((self.driver_branch,)), Version((self.driver_branch, MAX_MINOR))

    def driver_at_least(self, need: Version) -> bool | None:
        """Whether the driver is ``need`` or newer; None when unknown, or when a bare branch
        holds drivers on both sides of ``need`` (R535 against 535.54.03)."""
        span = self.driver_span
        if span is None:
            return None
        if span[0] >= need:
            return True
        return False if span[1] < need else None

    @property
    def driver_label(self) -> str:
        """'535.54.03', or 'of the R535 branch (exact version unknown)'."""
        if self.driver is not None:
            return str(self.driver)
        if self.driver_branch is not None:
            return f"of the R{self.driver_branch} branch (exact version unknown)"
        return "of unknown version"

    def branch_cuda(self) -> tuple[Version | None, Version | None]:
        """For a bare branch: the newest CUDA every driver of it fully supports, and the
        newest any of them does (R535: 12.1 and 12.2, as 12.2 needs 535.54.03)."""
        span = self.driver_span
        if span is None:
            return None, None
        lo, _ = self.matrix.driver_cuda(span[0], windows=self.windows)
        hi, _ = self.matrix.driver_cuda(span[1], windows=self.windows)
        return lo, hi

    @property
    def driver_cuda(self) -> tuple[Version | None, bool]:
        """The CUDA the driver fully supports (forward-compat package included); for a bare
        branch, what every driver of it supports, unsure when a later one supports more."""
        if self.driver is None:  # a snapshot may know only what the driver reports
            reported = Version.maybe((self.env.driver or {}).get("cuda"))
            if reported is None and self.driver_span is not None:
                lo, hi = self.branch_cuda()
                return lo, lo != hi
            return (reported.trunc(2) if reported else None), False
        best, unsure = self.matrix.driver_cuda(self.driver, windows=self.windows)
        if self.forward_compat is not None and self.fc_eligible and \
                (best is None or self.forward_compat > best):
            return self.forward_compat.trunc(2), False
        return best, unsure

    @property
    def fc_eligible(self) -> bool:
        """Whether every GPU may use the forward-compatibility package in use (its class, and
        the driver branch its libcuda comes from: see :meth:`fc_too_new`)."""
        return self.fc_usable(self.forward_compat)

    def fc_usable(self, cuda: Version | None) -> bool:
        """Whether every GPU may use cuda-compat for ``cuda`` (None: the class alone)."""
        row = self.matrix.forward_compat()
        if row is None or not self.gpus:
            return False
        return all(g.gpu_class in row["gpu_classes"] for g in self.gpus) and \
            not self.fc_too_new(cuda)

    def fc_branch(self, cuda: Version | None) -> int | None:
        """The driver branch of cuda-compat for ``cuda``: the package is built from the driver
        that fully supports that CUDA release (11.7 -> R515), None when that is unknown."""
        if cuda is None or cuda.major == 0:
            return None
        full = driver_need(self.matrix, cuda).full
        return full.major if full is not None else None

    def fc_too_new(self, cuda: Version | None) -> list[tuple[GpuInfo, int]]:
        """(GPU, its last driver branch) for each GPU whose architecture the cuda-compat libcuda
        for ``cuda`` no longer supports (Kepler's last branch is R470: compat 11.5+ fails)."""
        branch = self.fc_branch(cuda)
        if branch is None:
            return []
        return [(g, g.arch["last_driver_branch"]) for g in self.gpus
                if g.arch is not None and g.arch.get("last_driver_branch") is not None
                and branch > g.arch["last_driver_branch"]]

    def newest_cuda_of_branch(self, branch: int) -> Version | None:
        """The newest CUDA release whose own (full-support) Linux driver is of ``branch`` or
        older: what a GPU whose last branch is ``branch`` can still run (R470 -> 11.4)."""
        fit = [Version.parse(r["version"]).trunc(2) for r in self.matrix.rows("cuda_releases")
               if r.get("driver_linux") and not r.uncertain
               and Version.parse(r["driver_linux"]).major <= branch]
        return max(fit) if fit else None

    @property
    def packages(self) -> dict[str, str]:
        """The installed packages by canonical (PEP 503) name, versions as text ("" unknown);
        a new dict each time, so a rule may add to its own."""
        return {canonical_name(n): str(v or "") for n, v in (self.env.packages or {}).items()}

    @property
    def windows(self) -> bool:
        """Windows and WSL report the Windows driver, numbered apart from Linux's."""
        text = (self.env.os or "").lower()
        return "windows" in text or self.wsl is not None

    @property
    def wsl(self) -> int | None:
        """1 or 2 inside WSL 1 / WSL 2, 0 inside WSL of unknown generation, None elsewhere."""
        return wsl_version(self.env.os)

    @property
    def container(self) -> bool:
        """In a container: ``system.container`` names its runtime (detection finds the
        marks: /.dockerenv, /run/.containerenv), else ``os`` says so."""
        given = (self.env.system or {}).get("container")
        if given is not None:
            return given not in (False, "false", "no", "none", "")
        text = (self.env.os or "").lower()
        return "container" in text or "docker" in text or "podman" in text

    @property
    def os_kind(self) -> str | None:
        """'windows' (native), 'macos', 'linux' (WSL included), or None when the snapshot's
        ``os`` does not say (most hand-written ones: rules then keep their Linux defaults)."""
        text = (self.env.os or "").lower()
        if "linux" in text or "wsl" in text:
            return "linux"
        if "windows" in text or text.startswith("win"):
            return "windows"
        if "darwin" in text or "macos" in text or "mac os" in text:
            return "macos"
        return None

    @property
    def python(self) -> Version | None:
        """The snapshot's Python as major.minor (None when not given): what every wheel a
        fix names must have been published for."""
        v = Version.maybe(self.env.python)
        return v.trunc(2) if v is not None and len(v.key) >= 2 else None

    @property
    def tegra(self) -> bool:
        """Jetson boards: the L4T driver's version (e.g. 580.00 on Thor) is not on the desktop
        driver's scale, and CUDA support follows the JetPack release instead."""
        return any(g.gpu_class == "jetson" for g in self.gpus)

    @property
    def known_ccs(self) -> list[GpuInfo]:
        """One GpuInfo per distinct compute capability (rules judge per CC)."""
        seen: dict[CC, GpuInfo] = {}
        for g in self.gpus:
            if g.cc is not None and g.cc not in seen:
                seen[g.cc] = g
        return list(seen.values())


def flag(value: Any) -> bool | None:
    """A yes/no field as written by a probe or by hand (True, "true", "no", ...)."""
    if isinstance(value, bool) or value is None:
        return value
    text = str(value).strip().lower()
    return True if text in ("true", "yes", "1", "on") else False if text in (
        "false", "no", "0", "off") else None


def build_context(env: EnvSnapshot, matrix: Matrix) -> Context:
    driver = env.driver or {}
    branch = driver_branch(driver.get("version"))
    version = None if branch is not None else Version.maybe(driver.get("version"))
    present = flag(driver.get("present"))
    if present is None and (version is not None or branch is not None):
        present = True
    ctx = Context(env, matrix, version, present, driver_branch=branch)
    for i, gpu in enumerate(env.gpus):
        ctx.gpus.append(resolve_gpu(matrix, gpu.name, gpu.compute_capability, index=i))
    ctx.platform = _platform(env, ctx.gpus)
    ctx.forward_compat = _forward_compat(env)
    return ctx


def _platform(env: EnvSnapshot, gpus: list[GpuInfo]) -> str | None:
    text = f"{env.os or ''}".lower()
    if "aarch64" in text or "arm64" in text:
        return "aarch64"
    if "x86_64" in text or "amd64" in text:
        return "x86_64"
    fixed = {g.model.get("platform") for g in gpus if g.model and g.model.get("platform")}
    return fixed.pop() if len(fixed) == 1 else None


def _forward_compat(env: EnvSnapshot) -> Version | None:
    """The CUDA version cuda-compat provides, when it is in use (detected snapshots say
    ``forward_compat: true`` and report the libcuda's CUDA version as ``driver.cuda``)."""
    driver = env.driver or {}
    fc = driver.get("forward_compat")
    if flag(fc) is True:
        return Version.maybe(driver.get("cuda")) or Version((0,), "unknown")
    v = Version.maybe(fc) if isinstance(fc, str) and flag(fc) is None else None
    if v is not None:
        return v
    for rt in env.cuda_runtimes:
        if "compat" in f"{rt.source or ''} {rt.path or ''}".lower():
            return Version.maybe(rt.version)
    return None


def cite(*rows: Row | None) -> str:
    """Matrix rows' citations, each with its certainty and where it lives, joined by '; '
    (None left out)."""
    return "; ".join(f"{r['source']} [{r['certainty']}; {r.where}]" for r in rows
                     if r is not None)


def finding(code: str, severity: str, component: str, message: str, *, fix: str | None = None,
            row: Row | None = None, source: str | None = None, **evidence: Any) -> Finding:
    """Build a Finding; the source is the matrix row's citation (and where it lives)."""
    cited = source or (cite(row) if row else None)
    ev = {k: (str(v) if isinstance(v, (Version, CC)) else v) for k, v in evidence.items()
          if v is not None}
    return Finding(code, severity, component, message, fix, ev, cited)


def unknown(component: str, message: str, *, row: Row | None = None, fix: str | None = None,
            **evidence: Any) -> Finding:
    """The matrix cannot say: report it, never guess."""
    return finding("unknown-version", "warning", component, message, row=row,
                   fix=fix or "check this combination by hand, or add a row for it with "
                   "--matrix extra.yaml (see compat/README.md)", **evidence)
