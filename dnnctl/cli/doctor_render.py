"""Rendering of a doctor report (no typer here: the fast path in dnnctl.cli.fast uses it).

One block per component (✓ / ⚠ / ✗, the fix under each problem), then the verdict and the
probe notes; ``exit_code`` maps the verdict to the process status.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from dnnctl.cli.render import console, print_commands, split_commands
from dnnctl.doctor.parse import driver_branch, mig_profile
from dnnctl.errors import ExitCode

if TYPE_CHECKING:
    from dnnctl.doctor.model import DoctorReport, EnvSnapshot, Finding

COMPONENTS = ("doctor", "errors", "driver", "gpu", "fabric", "cuda", "toolchain", "cudnn", "cublas", "nccl",
              "nvjitlink", "nvrtc", "torch", "tensorflow", "jax", "cupy", "ctranslate2",
              "packages")
MARKS = {"error": "[bold red]✗[/]", "warning": "[bold yellow]⚠[/]", "info": "[green]✓[/]",
         "none": "[dim]–[/]", "not-judged": "[bold]?[/]", "see": "[bold cyan]→[/]"}


def exit_code(verdict: str, strict: bool) -> ExitCode:
    if verdict == "fail" or (strict and verdict == "warn"):
        return ExitCode.FAIL
    return ExitCode.OK


def render(report: DoctorReport, saved: Path | None = None) -> None:
    """The human report: one block per component, findings with their fix under it."""
    env = report.env
    origin = ("this machine" if report.origin == "detected"
              else f"snapshot {escape(report.origin)}")
    # only what the snapshot gives (no "Python ?" for a Python it does not name)
    about = [escape(env.os)] if env.os else []
    about += [f"Python {escape(env.python)}"] if env.python else []
    console.print(f"[bold]dnnctl doctor[/] — {origin}"
                  + (f" [dim]({'; '.join(about)})[/]" if about else ""))
    by_comp: dict[str, list[Finding]] = {}
    for f in report.findings:
        by_comp.setdefault(f.component, []).append(f)
    comps = list(COMPONENTS) + sorted(c for c in by_comp if c not in COMPONENTS)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=1)
    grid.add_column(width=max([10] + [len(c) for c in comps if c in by_comp]), no_wrap=True)
    grid.add_column(overflow="fold")
    commands: list[tuple[str, str]] = []
    for comp in comps:
        lines = summary(env, comp)
        found = sorted(by_comp.get(comp, []), key=_rank)
        if not lines and not found:
            continue
        worst = found[0].severity if found else ("info" if lines[0][1] else "none")
        if found and all(f.code == "not-judged" for f in found):
            worst = "not-judged"  # found but not judged: never shown as a pass
        elif worst == "info" and comp == "errors":
            worst = "see"  # an error message another finding explains: never a ✓
        body = [text for text, _ in lines] or ["[dim]unknown[/]"]
        grid.add_row(MARKS.get(worst, MARKS["none"]), f"[bold]{comp}[/]", "\n".join(body))
        for f in found:
            grid.add_row("", "", _finding(f, commands))
    console.print(grid)
    _verdict(report)
    print_commands(commands)
    if env.notes:
        console.print("[dim]probe notes:[/]")
        notes = Table.grid(padding=(0, 1))  # a wrapped note stays indented under its bullet
        notes.add_column(width=3, justify="right")
        notes.add_column(overflow="fold")
        for note in env.notes:
            notes.add_row("[dim]·[/]", f"[dim]{escape(note)}[/]")
        console.print(notes)
    if saved is not None:
        console.print(f"snapshot saved to [bold]{escape(str(saved))}[/] "
                      f"[dim](judge it anywhere: dnnctl doctor --from {escape(saved.name)})[/]")


def _rank(f: Finding) -> int:
    order = ("error", "warning", "info")
    return order.index(f.severity) if f.severity in order else len(order)


def _finding(f: Finding, commands: list[tuple[str, str]]) -> Table:
    """A finding: the message, then its fix, evidence and source, aligned under it; the
    fix's commands go to ``commands`` (printed whole after the verdict) as [n]."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=1)
    grid.add_column(overflow="fold")
    mark = "not-judged" if f.code == "not-judged" else "see" if (
        f.code == "error-message" and f.severity == "info") else f.severity
    grid.add_row(MARKS.get(mark, MARKS["none"]),
                 f"{escape(f.message)} [dim]\\[{escape(f.code)}][/]")
    if f.fix:
        prose, cmds = split_commands(f.fix, len(commands) + 1)
        commands.extend((f"{f.code} ({f.component})", cmd) for cmd in cmds)
        grid.add_row("", f"[bold]fix:[/] {escape(prose)}"
                     + (" [dim](commands below)[/]" if cmds else ""))
    if f.evidence and f.code != "ok":
        ev = ", ".join(f"{k}={_short(v)}" for k, v in f.evidence.items())
        grid.add_row("", f"[dim]evidence: {escape(ev)}[/]")
    if f.source:
        grid.add_row("", f"[dim]source: {escape(f.source)}[/]")
    return grid


def _short(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(str(v) for v in value) + "]"
    return str(value)


def _verdict(report: DoctorReport) -> None:
    n_err = sum(f.severity == "error" for f in report.findings)
    n_warn = sum(f.severity == "warning" for f in report.findings)
    n_not = sum(f.code == "not-judged" for f in report.findings)
    style = {"pass": "bold green", "warn": "bold yellow", "fail": "bold red"}[report.verdict]
    shown = report.verdict.upper() + (" for what was judged" if n_not and
                                       report.verdict == "pass" else "")
    console.print(f"verdict: [{style}]{shown}[/] "
                  f"[dim]({n_err} error{'s' * (n_err != 1)}, "
                  f"{n_warn} warning{'s' * (n_warn != 1)}"
                  + (f", {n_not} not judged" if n_not else "") + ")[/]")


def summary(env: EnvSnapshot, comp: str) -> list[tuple[str, bool]]:
    """What the snapshot says about one component: [(markup line, detected?)]."""
    if comp == "driver":
        return _driver_lines(env.driver)
    if comp == "doctor":  # its own probes: shown only when one failed
        failed = sum(n.startswith("probe failed:") for n in env.notes)
        return [(f"{failed} probe{'s' * (failed != 1)} failed or timed out", False)] \
            if failed else []
    if comp == "errors":  # the messages the user saw, as given
        return [(f"[dim]{escape(_quote(e))}[/]", False) for e in env.errors]
    if comp == "toolchain":  # what a build here would run: never a pass on its own
        line = _toolchain_line(env.toolchain or {})
        return [(escape(line), False)] if line else []
    if comp == "fabric":  # NVSwitches and Fabric Manager, where the snapshot says anything
        line = _fabric_line(env.driver or {})
        return [(escape(line), True)] if line else []
    if comp == "gpu":
        visible = (env.environment or {}).get("CUDA_VISIBLE_DEVICES")
        extra = [(f"[dim]CUDA_VISIBLE_DEVICES={escape(visible)}[/]", True)] \
            if visible is not None else []
        if env.gpus:
            return [(escape(_gpu_line(g)), True) for g in env.gpus] + extra
        if env.driver.get("present") is True:  # gpu_count: 0 is the driver's own "none"
            return [("no GPU visible to the driver" if str(env.driver.get("gpu_count")) == "0"
                     else "[dim]not listed (unknown)[/]", False)]
        return []
    if comp in ("cuda", "cudnn") or comp in env.libraries:
        items = (env.cuda_runtimes if comp == "cuda" else env.cudnn if comp == "cudnn"
                 else env.libraries[comp])
        listed = "cuda_runtimes" if comp == "cuda" else comp
        if not items and env.none_found(listed):
            return [("none found", False)]  # looked (an explicit []), unlike unknown
        return [(f"{escape(c.version or 'version unknown')}  [dim]{escape(c.source or '')}"
                 f"{'  ' + escape(c.path) if c.path and c.path not in (c.source or '') else ''}"
                 f"[/]" + ("  [cyan]← loaded first[/]" if c.loaded_first else ""), True)
                for c in items]
    if comp in env.frameworks:
        return [(escape(_framework_line(comp, env.frameworks[comp])), True)]
    for name in (comp, f"{comp}-gpu"):  # a package judged on its own (ctranslate2,
        if name in env.packages:         # onnxruntime-gpu)
            return [(f"{escape(env.packages[name])}  [dim]package {escape(name)}[/]", True)]
    return []


def _quote(text: str, width: int = 64) -> str:
    flat = " ".join(text.split())
    return f"'{flat}'" if len(flat) <= width else f"'{flat[:width - 1]}…'"


def _driver_lines(drv: dict[str, Any]) -> list[tuple[str, bool]]:
    if drv.get("present") is False:
        return [("[red]not found[/]" + (f" [dim]— {escape(drv['reason'])}[/]"
                                          if drv.get("reason") else ""), False)]
    if not drv:
        return []
    text = escape(drv.get("version") or "version unknown")
    if driver_branch(drv.get("version")) is not None:
        text += " (branch; exact version unknown)"
    if drv.get("cuda"):
        text += f" (supports CUDA ≤ {escape(drv['cuda'])})"
    extra = [f"{k.replace('_', ' ')} {drv[k]}" for k in ("kernel_module", "library")
             if drv.get(k) and drv[k] != drv.get("version")]
    if drv.get("kernel_module_type"):
        extra.append(f"{drv['kernel_module_type']} kernel module")
    init = drv.get("cuinit") or {}
    if init.get("code") not in (None, 0):
        extra.append(f"cuInit {init.get('name') or 'failed'} ({init['code']})")
    if drv.get("source"):
        extra.append(f"via {drv['source']}")
    lines = [(text + (f" [dim]{escape(', '.join(extra))}[/]" if extra else ""), True)]
    pci = drv.get("pci_gpus") or []
    if pci and isinstance(drv.get("gpu_count"), int) and len(pci) != drv["gpu_count"]:
        lines.append((f"[dim]{len(pci)} NVIDIA GPU{'s' * (len(pci) != 1)} on the PCI bus, "
                      f"{drv['gpu_count']} listed by the driver[/]", True))
    return lines


def _fabric_line(drv: dict[str, Any]) -> str | None:
    """'Fabric Manager 535.161.08, running; 6 NVSwitches' (what the snapshot says of them)."""
    fm = drv.get("fabric_manager") or {}
    bits = []
    if fm:
        state = {True: "running", False: "not running"}.get(fm.get("active"))
        if fm.get("installed") is False and fm.get("active") is not True:
            state = "not installed"
        bits.append("Fabric Manager " + ", ".join(
            str(b) for b in (fm.get("version"), state) if b) if fm.get("version") or state
            else "Fabric Manager: state unknown")
    if drv.get("nvswitches"):
        bits.append(f"{drv['nvswitches']} NVSwitch{'es' * (drv['nvswitches'] != 1)}")
    if drv.get("nvlink5_switch"):
        bits.append("NVLink 5 switch port")
    return "; ".join(bits) or None


def _gpu_line(g: Any) -> str:
    mig = g.mig or {}
    profile = mig.get("profile") or mig_profile(g.name)
    if profile:  # a MIG device, listed under its GPU as nvidia-smi -L does
        parts = ["  MIG device:" if mig.get("parent") else "MIG device:",
                 g.name or f"MIG {profile}"]
    else:
        parts = [f"GPU {g.index}:" if g.index is not None else "GPU:", g.name or "unknown model"]
        if mig.get("mode"):
            parts.append("(MIG mode)")
    if g.compute_capability:
        parts.append(f"sm_{g.compute_capability.replace('.', '')} "
                     f"({g.compute_capability})")
    if g.memory_mib:
        parts.append(f"{g.memory_mib} MiB")
    state = (getattr(g, "fabric", None) or {}).get("state")
    if state and state != "not_supported":
        parts.append(f"(fabric {state.replace('_', ' ')})")
    mode = getattr(g, "compute_mode", None)
    if mode and mode != "default":
        parts.append(f"(compute mode {mode.replace('_', ' ')})")
    if getattr(g, "watchdog", None) or getattr(g, "display_active", None):
        parts.append("(kernel run-time limit)" if getattr(g, "watchdog", None)
                     else "(display)")
    return " ".join(parts)


def _toolchain_line(tc: dict[str, Any]) -> str | None:
    """'gcc 11.4.0, no clang; nvcc host compiler g++-10 10.5.0; C compiler /usr/bin/gcc;
    Python.h missing' (what the snapshot says of the compilers a build here runs)."""
    bits = []
    for name in ("gcc", "clang"):
        if tc.get(name) is False:
            bits.append(f"no {name}")
        elif tc.get(name):
            bits.append(f"{name} {tc[name] if tc[name] is not True else '(version unknown)'}")
    ccbin = tc.get("nvcc_ccbin") or {}
    if ccbin:
        bits.append("nvcc host compiler " + " ".join(
            str(v) for v in (ccbin.get("path"), ccbin.get("version")) if v))
    if tc.get("c_compiler") is False:
        bits.append("no C compiler")
    elif isinstance(tc.get("c_compiler"), str):
        bits.append(f"C compiler {tc['c_compiler']}")
    if tc.get("python_h") is not None:
        bits.append("Python.h " + ("found" if tc["python_h"] else "missing"))
    return "; ".join(bits) or None


def _framework_line(name: str, info: dict[str, Any]) -> str:
    text = info.get("version") or "version unknown"
    if name == "cupy" and info.get("package"):
        text = f"{info['package']} {text}"
    bits = []
    if info.get("cuda_build") is False:
        bits.append("CPU-only build")
    if name == "xformers" and info.get("torch"):
        bits.append(f"built for torch {info['torch']}")
    for key, label in (("cuda", "CUDA"), ("cudnn", "cuDNN"), ("plugin", "plugin"),
                       ("runtime", "runtime")):
        if info.get(key):
            bits.append(f"{label} {info[key]}")
    if info.get("arch_list"):
        bits.append(" ".join(info["arch_list"]))
    if len(info.get("packages") or []) > 1:
        bits.append("installed: " + ", ".join(info["packages"]))
    return text + (f" ({'; '.join(bits)})" if bits else "")


def show_timings() -> None:
    """With ``--timings`` / ``$DNNCTL_PROFILE=1``: wall ms per step on stderr."""
    import sys

    from dnnctl.doctor import timing

    if not timing.enabled():
        return
    total = timing.process_ms()
    if total is not None:
        timing.record("total: exec to end of output", total)
    lines = timing.table(timing.spans())
    note = timing.bytecode_note()
    if note:
        lines.append(note)
    print("\n".join(lines), file=sys.stderr, flush=True)
