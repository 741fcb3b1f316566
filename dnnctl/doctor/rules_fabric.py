"""NVSwitch systems: nvidia-fabricmanager of the driver's exact version must run.

On a DGX/HGX NVSwitch baseboard every CUDA program fails with cudaErrorSystemNotReady (802,
"system not yet initialized") until Fabric Manager has set up the NVLink fabric, and Fabric
Manager refuses to start beside a driver of another version. On Linux (WSL, Windows and macOS
have no such nodes):

- the node is known to have NVSwitches when the driver lists some (``driver.nvswitches``), an
  NVLink 5 switch port is there (``driver.nvlink5_switch``) or a GPU reports a fabric state
  (``gpus[].fabric``); it only may have them when a GPU's name is one sold on NVSwitch
  boards (compat/fabric.yaml ``nvswitch_gpus``). A fabric state ``not_supported`` on those GPUs,
  or a driver that lists no NVSwitch for GPUs whose switches it would list, says it has none;
- the GPUs' fabric state decides first: ``completed`` is the fabric set up (a pass; a failed
  status is an error), ``not_started`` an error and ``in_progress`` a warning;
- then what the snapshot says of Fabric Manager: another version than the driver's is an
  error (a warning while the fabric is already set up: it fails at the next start); known not
  running or not installed is an error where the node has NVSwitches or names a whole board's
  GPUs (the baseboard's GPU count), a conditional warning otherwise; running is a pass;
  unknown is a warning naming the requirement, never a pass of the driver alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor import os_fixes
from dnnctl.doctor.context import Context, cite, finding
from dnnctl.doctor.model import Finding, Gpu

ON_FABRIC = ("not_started", "in_progress", "completed")
NOT_READY = "cudaErrorSystemNotReady, 802, 'system not yet initialized'"
SOURCE = (
    "https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html (Fabric "
    "Manager for NVSwitch-based HGX and DGX systems); CUDA runtime API, cudaErrorSystemNotReady "
    "= 802: 'the system is not yet ready to start any CUDA work ... verify the system "
    "configuration is in a valid state and all required driver daemons are actively "
    "running'; NVIDIA/gpu-operator#375 and #545 (shivamerla: 'this error will happen if "
    "nvidia-fabricmanager service is not running on the host')")
MISMATCH_SOURCE = (
    "NVIDIA/gpu-driver-container#735 (driver 580.126.09 with Fabric Manager 590.48.01: "
    "'fabric manager NVIDIA GPU driver interface version 590.48.01 don't match with driver "
    "version 580.126.09. Please update with matching NVIDIA driver package', then NVSwitch "
    "fabric initialization fails on H200/HGX nodes); NVIDIA/gpu-operator#544; siderolabs/pkgs#720")
STATE_SOURCE = (
    "NVML nvmlDeviceGetGpuFabricInfo (nvml.h: state NOT_STARTED / IN_PROGRESS / COMPLETED; "
    "status 'must be checked only if state returns complete'); NVIDIA/NVSentinel#883 (each GPU "
    "goes 'Not Started' -> 'In Progress' -> 'Completed' as Fabric Manager registers it)")
OPERATOR = ("under the GPU Operator, its driver container starts Fabric Manager itself when the "
            "driver lists NVSwitches: use a driver image of this driver version")
NVLINK5 = ("on NVLink 5 systems (HGX B200 on) Fabric Manager also needs the nvlsm package and "
           "the ib_umad kernel module (`modprobe ib_umad`)")
NVLINK5_SOURCE = ("NVIDIA/gpu-driver-container ubuntu24.04/install.sh (nvlink5_pkgs_install: "
                  "'nvlsm infiniband-diags'); spectrocloud/CanvOS#700 (HGX B200: ib_umad must "
                  "be loaded before nv-fabricmanager starts)")


def check(ctx: Context) -> list[Finding]:
    """Fabric Manager on a node that has, or may have, NVSwitches."""
    if ctx.os_kind in ("windows", "macos") or ctx.wsl is not None or ctx.tegra \
            or ctx.driver_present is False:
        return []
    drv = ctx.env.driver or {}
    gpus = [g for g in ctx.env.gpus if not (g.mig or {}).get("profile")]  # physical GPUs
    named = [(g, ctx.matrix.nvswitch_rows(g.name)) for g in gpus if g.name]
    named = [(g, rows) for g, rows in named if rows]
    fabric = [g for g in gpus if _state(g) in ON_FABRIC]
    switches = bool(drv.get("nvswitches")) or drv.get("nvlink5_switch") is True
    if not (named or fabric or switches):
        return []
    rows = _unique(r for _, rs in named for r in rs)
    if not (fabric or switches) and _none_here(drv, named, rows):
        return []
    node = _Node(ctx, named, rows, fabric, switches)
    return node.findings()


def _state(g: Gpu) -> str | None:
    return (g.fabric or {}).get("state")


def _unique(rows: Iterable[Row]) -> list[Row]:
    out: list[Row] = []
    for r in rows:
        if all(r is not o for o in out):
            out.append(r)
    return out


def _none_here(drv: dict[str, object], named: list[tuple[Gpu, list[Row]]], rows: list[Row]) -> bool:
    """The snapshot says these GPUs sit on no fabric: NVML reports fabric not supported on
    each, or the driver lists no NVSwitch where it would list the boards' switches."""
    if all(_state(g) == "not_supported" for g, _ in named):
        return True
    return drv.get("nvswitches") == 0 and drv.get("nvlink5_switch") is not True \
        and all(r["switches"] == "driver" for r in rows)


class _Node:
    """One node's NVSwitch evidence and its Fabric Manager, judged together."""

    def __init__(self, ctx: Context, named: list[tuple[Gpu, list[Row]]], rows: list[Row],
                 fabric: list[Gpu], switches: bool) -> None:
        self.ctx = ctx
        self.drv = ctx.env.driver or {}
        self.fm = self.drv.get("fabric_manager") or {}
        self.named, self.rows, self.fabric = named, rows, fabric
        self.certain = bool(fabric or switches)
        self.cite = cite(*rows)

    # -- what the node is -------------------------------------------------------------------

    def why(self) -> str:
        """Why this node needs Fabric Manager, in a few words."""
        if self.drv.get("nvswitches"):
            n = self.drv["nvswitches"]
            return f"the driver lists {n} NVSwitch{'es' * (n != 1)}"
        if self.drv.get("nvlink5_switch") is True:
            return "an NVLink 5 switch port is present"
        if self.fabric:
            return f"{self.fabric[0].name or 'a GPU'} is on an NVLink fabric"
        names = sorted({g.name or "" for g, _ in self.named})
        what = ("names an NVSwitch board" if any(r.get("board") for r in self.rows) else
                f"{'a GPU' if len(names) == 1 else 'GPUs'} of NVSwitch boards")
        return f"{', '.join(names)}: {what} ({'; '.join(r['model'] for r in self.rows)})"

    def whole_board(self) -> bool:
        """Where only names say so: a board named as one (HGX / DGX), or as many such GPUs as
        the smallest board carries."""
        if any(r.get("board") for r in self.rows):
            return True
        return bool(self.rows) and len(self.named) >= min(r["board_gpus"] for r in self.rows)

    def nvlink5(self) -> bool:
        return self.drv.get("nvlink5_switch") is True or any(
            r["switches"] == "nvlink5" for r in self.rows)

    # -- the findings ------------------------------------------------------------------------

    def findings(self) -> list[Finding]:
        states = [_state(g) for g in self.fabric]
        failed = [g for g in self.fabric if _state(g) == "completed"
                  and (g.fabric or {}).get("status") not in (None, "success")]
        if failed:
            g = failed[0]
            return [self._error(f"{g.name or 'a GPU'}: NVLink fabric set-up failed "
                                f"({g.fabric['status']}); CUDA on it fails ({NOT_READY})",
                                fix="read `journalctl -u nvidia-fabricmanager`, then restart "
                                "it: `systemctl restart nvidia-fabricmanager`",
                                source=STATE_SOURCE, status=g.fabric["status"])]
        out = self._mismatch("completed" in states)
        if "completed" in states:
            return out or [finding(
                "ok", "info", "fabric", "NVSwitch fabric set up by Fabric Manager (GPU fabric "
                "state completed)", source=STATE_SOURCE, fabric_state="completed")]
        if out:
            return out
        if "not_started" in states:
            return [self._error(f"{self.why()}, and its fabric is not started: Fabric Manager "
                                f"has not set it up, so CUDA fails ({NOT_READY})",
                                fix=self.install_fix(), source=f"{STATE_SOURCE}; {SOURCE}",
                                fabric_state="not_started")]
        if "in_progress" in states:
            return [finding("fabric-manager", "warning", "fabric", "NVSwitch fabric set-up is "
                            "still in progress: CUDA fails until it completes "
                            f"({NOT_READY})", fix="wait a minute and check again; if it stays "
                            "so, read `journalctl -u nvidia-fabricmanager`",
                            source=STATE_SOURCE, fabric_state="in_progress")]
        return self._service()

    def _mismatch(self, set_up: bool) -> list[Finding]:
        have, drv = Version.maybe(self.fm.get("version")), self.ctx.driver
        branch = self.ctx.driver_branch  # a bare branch: only another branch is sure to differ
        if have is None or (drv is None and (branch is None or have.major == branch)) \
                or have == drv:
            return []
        later = (": the fabric is set up now, but Fabric Manager will refuse to start at the "
                 "next boot or restart" if set_up else f", so the fabric is never set up and "
                 f"CUDA fails ({NOT_READY})")
        return [finding(
            "fabric-manager", "warning" if set_up else "error", "fabric",
            f"nvidia-fabricmanager {have} is not the driver's version "
            f"{drv or self.ctx.driver_label}: it refuses to "
            f"start beside it{later}", fix=self.install_fix(),
            source=f"{MISMATCH_SOURCE}; {self._package_cite()}", fabric_manager=str(have),
            driver=drv)]

    def _service(self) -> list[Finding]:
        active, installed = self.fm.get("active"), self.fm.get("installed")
        have = Version.maybe(self.fm.get("version"))
        if active is True:
            return [finding("ok", "info", "fabric", "nvidia-fabricmanager "
                            + (f"{have} " if have else "") + "is running", source=SOURCE,
                            fabric_manager=have)]
        missing = "not installed" if installed is False and active is not True else \
            "not running" if active is False else None
        if missing:
            sure = self.certain or self.whole_board()
            text = (f"{self.why()}, and nvidia-fabricmanager is {missing}: CUDA fails "
                    f"({NOT_READY})" if sure else
                    f"{self.why()}; nvidia-fabricmanager is {missing}: on an NVSwitch board "
                    f"CUDA fails ({NOT_READY})")
            return [finding("fabric-manager", "error" if sure else "warning", "fabric", text,
                            fix=self.install_fix(), source=self._source(), **self._evidence())]
        what = (f"nvidia-fabricmanager {have} (the driver's version) is installed, but whether "
                "it runs is not in the snapshot" if have else
                "nvidia-fabricmanager's state is not in the snapshot")
        if not (self.certain or self.whole_board()):
            # a few GPUs of a model also sold on boards without NVSwitches (4-GPU boards,
            # cloud VMs given one or two), nothing else known: nothing to say (a line on
            # every such snapshot would be noise; `doctor` on the machine itself reads the
            # switches, the GPUs' fabric state and the service)
            return []
        cond = "" if self.certain else "on an NVSwitch board "
        return [finding(
            "fabric-manager", "warning", "fabric",
            f"{self.why()}: {cond}CUDA runs only once nvidia-fabricmanager of exactly the "
            f"driver's version has set up the fabric ({NOT_READY}); {what}",
            fix=f"check `systemctl status nvidia-fabricmanager`; if it is missing or stopped: "
            f"{self.install_fix()}", source=self._source(), **self._evidence())]

    # -- fix and citations --------------------------------------------------------------------

    def install_fix(self) -> str:
        """Install Fabric Manager of the driver's version and start it (with the GPU
        Operator's and NVLink 5's variants)."""
        drv = self.ctx.driver
        row = self._package_row()
        if drv is not None and row is not None:
            fields = {"version": str(drv), "branch": str(drv.major)}
            pkg = (f"`dnf install {row['rpm'].format(**fields)}`" if os_fixes.rpm_distro(self.ctx)
                   else f"`apt-get install {row['apt'].format(**fields)}`")
            text = f"install Fabric Manager {drv} (the driver's version): {pkg}"
        else:
            text = ("install the nvidia-fabricmanager package of exactly the driver's version "
                    "(`nvidia-smi` shows it)")
        text += f", then `systemctl enable --now nvidia-fabricmanager`; {OPERATOR}"
        return text + (f"; {NVLINK5}" if self.nvlink5() else "")

    def _package_row(self) -> Row | None:
        drv = self.ctx.driver
        if drv is None:
            return None
        return next((r for r in self.ctx.matrix.rows("fabric_manager_packages")
                     if VersionRange.parse(r["driver"]).contains(drv)), None)

    def _package_cite(self) -> str:
        row = self._package_row()
        return cite(row) if row else SOURCE

    def _source(self) -> str:
        parts = [SOURCE] + ([self.cite] if self.cite else [])
        if self._package_row() is not None:
            parts.append(self._package_cite())
        return "; ".join(parts + ([NVLINK5_SOURCE] if self.nvlink5() else []))

    def _evidence(self) -> dict[str, object]:
        return {"nvswitches": self.drv.get("nvswitches"), "gpus": sorted(
                    {g.name for g, _ in self.named if g.name}) or None,
                "fabric_manager": self.fm or None, "driver": self.ctx.driver}

    def _error(self, message: str, *, fix: str, source: str, **evidence: object) -> Finding:
        return finding("fabric-manager", "error", "fabric", message, fix=fix, source=source,
                       **evidence)
