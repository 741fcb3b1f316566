"""What :func:`dnnctl.torch.patch` reports: the modules it covered, the ones it left to
torch and why, the chains it fused, and the calls dnnctl refused at run time."""

from __future__ import annotations

from dataclasses import dataclass, field

from dnnctl.torch import kernels


@dataclass
class Fusion:
    """One chain patch rewrote into a single op."""

    head: str  # the conv / linear module's name
    folded: list[str]  # names of modules folded into it (bn, act modules)
    parts: list[str]  # what the epilogue took: bn, relu, residual, ...


@dataclass(frozen=True)
class Covered:
    name: str
    module: str  # the module's class name
    op: str  # the dnnctl op it runs
    note: str = ""


@dataclass(frozen=True)
class Skipped:
    name: str
    module: str
    reason: str


@dataclass
class PatchReport:
    """What ``patch`` routed to dnnctl, what it fused, and what it left to torch and why."""

    covered: list[Covered] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    fusions: list[Fusion] = field(default_factory=list)
    traced: bool = False
    trace_error: str = ""
    training: bool = False
    graphs: bool = False  # inference calls run as CUDA graphs (patch(..., graphs=True))
    # chains of elementwise ops run as one generated kernel each (inference): one line per
    # chain, "<root>: <n> ops (<ops>)"
    pointwise: list[str] = field(default_factory=list)
    _fallbacks_at: dict = field(default_factory=dict, repr=False)

    def fallbacks(self) -> dict[tuple[str, str], int]:
        """Calls since patching that dnnctl refused at run time (op, reason) -> count."""
        return {k: v - self._fallbacks_at.get(k, 0) for k, v in kernels.FALLBACKS.items()
                if v > self._fallbacks_at.get(k, 0)}

    def summary(self) -> str:
        """A few lines for people (the library itself never prints)."""
        how = "fx graph" if self.traced else f"module by module ({self.trace_error})"
        lines = [f"dnnctl.torch.patch ({'training' if self.training else 'inference'}, {how}):"
                 f" {len(self.covered)} modules on dnnctl, {len(self.fusions)} fused chains, "
                 f"{len(self.skipped)} left to torch"]
        if self.graphs:
            lines.append("  inference calls (grad off, CUDA) replayed as CUDA graphs")
        for f in self.fusions:
            lines.append(f"  fused {f.head} + {' + '.join(f.parts)}")
        for p in self.pointwise:
            lines.append(f"  one kernel for {p}"[:100])
        for s in self.skipped:
            lines.append(f"  skipped {s.name} ({s.module}): {s.reason}")
        return "\n".join(lines)
