"""The NVIDIA GPUs on the PCI bus, and which flavor of the nvidia kernel module is loaded.

NVIDIA's open GPU kernel modules drive Turing and later GPUs only (they need the GPU System
Processor); an older GPU beside them is on the bus but missing from nvidia-smi. What is read,
cheap file reads only, never raising:

- the flavor: the first line of ``/proc/driver/nvidia/version`` says "NVIDIA UNIX Open Kernel
  Module for x86_64" for the open flavor and "NVIDIA UNIX x86_64 Kernel Module" for the
  proprietary one (the driver README's "Open Linux Kernel Modules" chapter); where that file
  cannot be read, the module's taint flags in ``/sys/module/nvidia/taint``: a non-GPL module
  taints the kernel ``P`` (proprietary), the open flavor (Dual MIT/GPL) does not;
- the GPUs: each ``/sys/bus/pci/devices/*`` of vendor 0x10de whose class is a VGA (0x0300)
  or 3D (0x0302) controller, the kernel driver bound to it (its ``driver`` link: nvidia,
  nouveau, vfio-pci), named from the pci.ids database when one is installed (the file lspci
  reads), only when there is such a GPU.
"""

from __future__ import annotations

import re
from typing import Any

from dnnctl.doctor.host import Host

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA compatible / 3D controller (the class's first 16 bits)
PCI_IDS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")
MAX_DEVICES = 4096  # PCI functions looked at, at most
PCI_IDS_MAX = 4 << 20  # pci.ids is about 1.4 MB
_OPEN = re.compile(r"NVRM version:.*\bOpen Kernel Module\b")
_PROPRIETARY = re.compile(r"NVRM version:.*\bKernel Module\b")


def kernel_module_type(host: Host) -> str | None:
    """"open" / "proprietary" for the loaded nvidia.ko, None when neither file says."""
    text, _ = host.read_text("/proc/driver/nvidia/version")
    if text:
        if _OPEN.search(text):
            return "open"
        if _PROPRIETARY.search(text):
            return "proprietary"
    taint, _ = host.read_text("/sys/module/nvidia/taint")
    if taint is None or not host.exists("/sys/module/nvidia/version"):
        return None
    return "proprietary" if "P" in taint.strip() else "open"


def pci_gpus(host: Host) -> list[dict[str, Any]]:
    """The NVIDIA display / 3D controllers on the PCI bus: ``{slot, device_id, name}``."""
    out: list[dict[str, Any]] = []
    for i, dev in enumerate(host.glob("/sys/bus/pci/devices/*")):
        if i >= MAX_DEVICES:
            break
        vendor, _ = host.read_text(f"{dev}/vendor")
        if (vendor or "").strip().lower() != NVIDIA_VENDOR:
            continue
        klass, _ = host.read_text(f"{dev}/class")
        if not (klass or "").strip().lower().startswith(GPU_CLASSES):
            continue
        device, _ = host.read_text(f"{dev}/device")
        gpu: dict[str, Any] = {"slot": dev.rsplit("/", 1)[-1]}
        m = re.fullmatch(r"0x([0-9a-f]{4})", (device or "").strip().lower())
        if m:
            gpu["device_id"] = m.group(1)
        bound = host.realpath(f"{dev}/driver")
        if bound != f"{dev}/driver" and host.exists(f"{dev}/driver"):
            gpu["bound"] = bound.rsplit("/", 1)[-1]  # .../bus/pci/drivers/nvidia -> nvidia
        out.append(gpu)
    ids = [g["device_id"] for g in out if g.get("device_id")]
    names = pci_names(host, ids) if ids else {}
    for g in out:
        if g.get("device_id") in names:
            g["name"] = names[g["device_id"]]
    return out


def pci_names(host: Host, device_ids: list[str]) -> dict[str, str]:
    """pci.ids' names of NVIDIA device ids ("1b82" -> "GP104 [GeForce GTX 1070 Ti]")."""
    for path in PCI_IDS:
        text, _ = host.read_text(path, PCI_IDS_MAX)
        if text is None:
            continue
        start = text.find("\n10de  ")
        if start < 0:
            return {}
        wanted, found = set(device_ids), {}
        for line in text[start + 1:].splitlines()[1:]:
            if not line.startswith("\t"):
                break  # the next vendor
            m = re.match(r"\t([0-9a-f]{4})\s+(.+)$", line)
            if m and m.group(1) in wanted:
                found[m.group(1)] = m.group(2).strip()
        return found
    return {}


def probe_pci(host: Host) -> dict[str, Any]:
    """Driver fields: kernel_module_type and pci_gpus, where known."""
    out: dict[str, Any] = {}
    flavor = kernel_module_type(host)
    if flavor:
        out["kernel_module_type"] = flavor
    gpus = pci_gpus(host)
    if gpus:
        out["pci_gpus"] = gpus
    return out
