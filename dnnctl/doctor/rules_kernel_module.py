"""The NVIDIA kernel module flavor against the GPUs here, and GPUs the driver does not list.

NVIDIA's Linux driver ships an open and a proprietary flavor of nvidia.ko (matrix table
``kernel_module_flavors``): the open one drives Turing and later only (it needs the GSP), the
proprietary one not Blackwell nor Grace Hopper. A GPU the loaded flavor does not drive stays
on the PCI bus but is missing from nvidia-smi and CUDA. On Linux (WSL, Windows and macOS run
no such module), with what the snapshot says:

- ``driver.kernel_module_type`` known: each GPU it names (the driver's, and outside a
  container the PCI bus's, ``driver.pci_gpus`` resolved by name) that flavor does not drive is
  an error, fixed by the other flavor when that one drives every GPU here;
- ``driver.gpu_count`` below the NVIDIA GPUs on the PCI bus (what detection reads from /sys;
  GPUs bound to vfio-pci are passed to a VM on purpose): an error naming the missing ones and
  the likely cause: a GPU bound to nouveau, or with the flavor unknown on a driver that has an
  open flavor (515 on, the default from 560), a GPU before Turing. More GPUs *named* than
  counted, with no bus list, is rules_gpu_count's.

In a container the bus shows the host's GPUs, not the ones given to the container: there only
the GPUs the driver lists are judged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dnnctl.compat.gpus import GpuInfo, resolve_gpu
from dnnctl.compat.inputs import bounded
from dnnctl.compat.schema import Row
from dnnctl.compat.versions import CC, Version
from dnnctl.doctor import os_fixes
from dnnctl.doctor.context import Context, cite, finding
from dnnctl.doctor.model import Finding

OPEN_FROM = Version.parse("515")  # the first branch with an open flavor
OPEN_DEFAULT_FROM = Version.parse("560")
PASSED_THROUGH = ("vfio-pci", "pci-stub")  # a GPU handed to a VM on purpose
NOT_DRIVEN = ("it stays on the PCI bus but is missing from nvidia-smi and CUDA (dmesg: 'NVRM: "
              "... is not supported by open nvidia.ko because it does not include the required "
              "GPU System Processor (GSP)')")
COUNT_SOURCE = ("NVIDIA/open-gpu-kernel-modules#696 (560.35.03 open modules with an RTX 2060 and "
                "a GTX 1070 Ti: nvidia-smi lists only the RTX 2060; the proprietary driver of "
                "the same version sees both); https://docs.nvidia.com/datacenter/tesla/"
                "driver-installation-guide/kernel-modules.html ('Starting in the 560 driver "
                "release series, the open kernel module flavor is the default')")
NOUVEAU_SOURCE = ("NVIDIA driver README, 'Installing the NVIDIA Driver' (the nouveau kernel "
                  "driver must not be bound to the GPU the NVIDIA driver is to drive)")


@dataclass
class _Gpu:
    label: str
    info: GpuInfo
    on_bus_only: bool = False
    bound: str | None = None

    @property
    def text(self) -> str:
        cc, arch = self.info.cc, (self.info.arch or {}).get("name")
        what = ", ".join(x for x in (f"compute capability {cc}" if cc else None, arch) if x)
        return f"{self.label} ({what})" if what else self.label


def check(ctx: Context) -> list[Finding]:
    """The flavor against the GPUs; GPUs present that the driver does not list."""
    if ctx.os_kind not in (None, "linux") or ctx.wsl is not None or ctx.driver_present is False:
        return []
    drv = ctx.env.driver or {}
    listed = [_Gpu(g.label, g) for g, raw in zip(ctx.gpus, ctx.env.gpus, strict=True)
              if not (raw.mig or {}).get("profile")]
    bus = [] if ctx.container else _bus(ctx, drv.get("pci_gpus") or [])
    unlisted = _unlisted(listed, bus)
    flavor = drv.get("kernel_module_type")
    count = drv.get("gpu_count") if isinstance(drv.get("gpu_count"), int) else None
    missing = _missing(listed, bus, unlisted, count)
    out: list[Finding] = []
    if flavor in ("open", "proprietary"):
        undriven = [g for g in listed + unlisted if not _drives(ctx, flavor, g.info)]
        if undriven:
            out.append(_flavor_error(ctx, flavor, undriven, listed + unlisted, count))
            missing = [g for g in missing if all(g is not u for u in undriven)]
    if missing and count is not None:
        out.append(_count_error(ctx, flavor, missing, count, len(listed), len(bus)))
    return out


def _bus(ctx: Context, pci: list[dict]) -> list[_Gpu]:
    out = []
    for i, p in enumerate(pci):
        if p.get("bound") in PASSED_THROUGH:
            continue
        name = p.get("name")
        label = name or (f"the NVIDIA GPU at {p.get('slot') or f'PCI slot {i}'}"
                         + (f" (device {p['device_id']})" if p.get("device_id") else ""))
        out.append(_Gpu(label, resolve_gpu(ctx.matrix, name, None, index=i), True,
                        p.get("bound")))
    return out


def _unlisted(listed: list[_Gpu], bus: list[_Gpu]) -> list[_Gpu]:
    """The bus GPUs with no counterpart in the driver's list (one listed GPU of the same
    model accounts for one bus GPU)."""
    left = [g.info.model for g in listed if g.info.model is not None]
    out = []
    for g in bus:
        match = next((i for i, m in enumerate(left) if m is g.info.model), None)
        if match is None:
            out.append(g)
        else:
            left.pop(match)
    return out


def _missing(listed: list[_Gpu], bus: list[_Gpu], unlisted: list[_Gpu],
             count: int | None) -> list[_Gpu]:
    """The GPUs on the bus that the driver does not list (empty unless its count says fewer;
    more GPUs named than counted is rules_gpu_count's to say)."""
    if count is None or len(bus) <= count or len(listed) > count:
        return []
    return unlisted or bus[count:]


def _pre_turing(g: _Gpu) -> bool:
    return g.info.cc is not None and g.info.cc < CC(7, 5)


def _drives(ctx: Context, flavor: str, info: GpuInfo) -> bool:
    """Whether ``flavor`` drives this GPU (True when its capability is unknown)."""
    row = ctx.matrix.kernel_flavor(flavor)
    if row is None or info.cc is None:
        return True
    if row.get("min_cc") and info.cc < CC.parse(row["min_cc"]):
        return False
    if row.get("below_cc") and info.cc >= CC.parse(row["below_cc"]):
        return False
    return not any(re.search(p, bounded(info.label or ""), re.IGNORECASE)
                   for p in row.get("not_match") or [])


def _flavor_error(ctx: Context, flavor: str, undriven: list[_Gpu], every: list[_Gpu],
                  count: int | None) -> Finding:
    other = "proprietary" if flavor == "open" else "open"
    row = ctx.matrix.kernel_flavor(flavor)
    names = "; ".join(g.text for g in undriven)
    why = ("the open modules need the GPU System Processor of Turing and later "
           "(compute capability 7.5)" if flavor == "open" else
           "the proprietary modules do not drive Blackwell (compute capability 10.0 and "
           "later) nor Grace Hopper")
    drv = f" (driver {ctx.driver_label})" if ctx.driver_major is not None else ""
    present = max(len(every), count or 0)
    seen = f"; the driver lists {count} of {present} GPUs" if count is not None and \
        count < present else ""
    both = all(_drives(ctx, other, g.info) for g in every)
    fix = (_switch(ctx, other) if both else
           f"no one flavor drives every GPU here: the {flavor} flavor misses {names}, the "
           f"{other} flavor misses "
           + "; ".join(g.text for g in every if not _drives(ctx, other, g.info))
           + ": run them on separate machines (or keep the GPUs the loaded flavor drives)")
    other_row = ctx.matrix.kernel_flavor(other)
    cited = cite(row, other_row)
    return finding(
        "kernel-module", "error", "driver",
        f"the {flavor} NVIDIA kernel module is loaded{drv} and does not drive {names}: {why}, "
        f"so {NOT_DRIVEN.replace('it stays', 'the GPU stays')}{seen}", fix=fix,
        source=cited or None, kernel_module_type=flavor,
        gpus=[g.label for g in undriven], gpu_count=count)


def _count_error(ctx: Context, flavor: str | None, missing: list[_Gpu], count: int,
                 n_listed: int, n_bus: int) -> Finding:
    present = n_bus
    where = "on the PCI bus"
    names = "; ".join(g.text for g in missing)
    gone = present - count
    if len(missing) > gone:  # which ones is not known (no names to match them by)
        names = f"{gone} of {names}"
    head = (f"the driver lists {count} of the {present} NVIDIA GPUs {where}: {names} "
            f"{'is' if gone == 1 else 'are'} missing from nvidia-smi and CUDA")
    nouveau = [g for g in missing if g.bound == "nouveau"]
    old = [g for g in missing if _pre_turing(g)]
    row = ctx.matrix.kernel_flavor("open")
    if nouveau:
        return finding(
            "kernel-module", "error", "driver", f"{head}: the nouveau driver is bound to "
            + ", ".join(g.label for g in nouveau),
            fix="blacklist nouveau (`echo blacklist nouveau | sudo tee "
            "/etc/modprobe.d/blacklist-nouveau.conf`, then `sudo update-initramfs -u` and "
            "reboot) so nvidia.ko takes the GPU", source=NOUVEAU_SOURCE, gpu_count=count,
            gpus=[g.label for g in missing])
    open_possible = flavor is None and ctx.driver_at_least(OPEN_FROM) is not False
    if old and open_possible and row is not None:
        default = ("the default flavor from 560" if ctx.driver_at_least(OPEN_DEFAULT_FROM)
                   is not False else "an option from 515")
        return finding(
            "kernel-module", "error", "driver",
            f"{head}; " + ", ".join(g.label for g in old) + " "
            + ("is" if len(old) == 1 else "are") + " older than Turing, which NVIDIA's open "
            f"kernel module ({default}) does not drive: if `head -1 /proc/driver/nvidia/"
            "version` says 'Open Kernel Module', that is why",
            fix=_switch(ctx, "proprietary"),
            source=f"{cite(row)}; {COUNT_SOURCE}",
            gpu_count=count, gpus=[g.label for g in missing])
    return finding(
        "kernel-module", "error", "driver", head,
        fix="read why in `sudo dmesg | grep NVRM` (a GPU this driver branch or module flavor "
        "does not support, one that fell off the bus, or one held by another driver: "
        "`lspci -k -d 10de:`)", source=COUNT_SOURCE, gpu_count=count,
        gpus=[g.label for g in missing])


def _switch(ctx: Context, flavor: str) -> str:
    """How to load ``flavor`` instead, in this distribution's commands, then reboot."""
    row: Row | None = ctx.matrix.kernel_flavor(flavor)
    if row is None:
        return f"install the {flavor} flavor of the NVIDIA kernel module and reboot"
    branch = str(ctx.driver_major) if ctx.driver_major is not None else "<branch>"
    text = (ctx.env.os or "").lower()
    if os_fixes.rpm_distro(ctx):
        cmd = (f"`sudo {row['install_dnf']}` (RHEL 10 / Fedora; RHEL 8/9: `sudo "
               f"{row['install_dnf_module'].format(branch=branch)}`)")
    elif "debian" in text:
        cmd = f"`sudo {row['install_apt_debian']}`"
    else:
        cmd = f"`sudo {row['install_apt']}`"
        if flavor == "proprietary":
            cmd += (f" (NVIDIA's repository; with Ubuntu's own packages install "
                    f"nvidia-driver-{branch} in place of nvidia-driver-{branch}-open)")
        else:
            cmd += (f" (NVIDIA's repository; with Ubuntu's own packages install "
                    f"nvidia-driver-{branch}-open)")
    return (f"load the {flavor} flavor of the same driver: {cmd}, or rerun the .run installer "
            f"with `{row['runfile']}`; then reboot")
