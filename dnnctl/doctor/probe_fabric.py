"""nvidia-fabricmanager and the NVSwitches, as far as this machine shows them.

An NVSwitch system runs CUDA only once Fabric Manager (of the driver's exact version) has set
up the NVLink fabric. What is read, cheapest first, never raising:

- the NVSwitches: the entries of ``/proc/driver/nvidia-nvswitch/devices`` (the driver lists
  NVLink 4 and earlier switches there) and, for NVLink 5 (HGX B200 on), an InfiniBand device
  whose VPD carries ``SW_MNG`` (the checks NVIDIA's driver container makes before it starts
  Fabric Manager: gpu-driver-container's nvidia-driver, ``_assert_nvswitch_system`` and
  ``_assert_nvlink5_system``);
- only when one of those, the ``nv-fabricmanager`` program or its systemd unit is here: the
  program's version (``nv-fabricmanager --version``), a running ``nv-fabricmanager`` process
  (the host sees the GPU Operator's driver container's one too), and, when none is seen,
  whether systemd says the ``nvidia-fabricmanager`` service is not running.

``installed`` / ``active`` are set False only where that was seen: a container without systemd
answers neither, and its host's Fabric Manager stays unknown.
"""

from __future__ import annotations

import re
from typing import Any

from dnnctl.doctor.host import Host

PROGRAM = "nv-fabricmanager"
PROGRAM_PATHS = ("/usr/bin/nv-fabricmanager", "/usr/sbin/nv-fabricmanager")
UNIT = "nvidia-fabricmanager"
UNIT_FILES = tuple(f"{d}/nvidia-fabricmanager.service" for d in (
    "/usr/lib/systemd/system", "/lib/systemd/system", "/etc/systemd/system"))
COMM = PROGRAM[:15]  # /proc/PID/comm keeps the first 15 characters of the program name
NVSWITCH_DIR = "/proc/driver/nvidia-nvswitch/devices"
MAX_PROCESSES = 20000  # /proc entries read at most (a few ms each thousand)
_VERSION = re.compile(r"Fabric Manager version is\s*:\s*(\d+(?:\.\d+)+)", re.IGNORECASE)


def probe_fabric(host: Host) -> tuple[dict[str, Any], list[str]]:
    """(driver fields: fabric_manager, nvswitches, nvlink5_switch; notes)."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    if not host.is_dir("/proc/driver/nvidia"):  # no nvidia kernel module: nothing to judge
        return out, notes
    if host.is_dir(NVSWITCH_DIR):
        out["nvswitches"] = len(host.listdir(NVSWITCH_DIR))
    nvlink5 = nvlink5_switch(host)
    if nvlink5 is not None:
        out["nvlink5_switch"] = nvlink5
    program = host.which(PROGRAM) or next((p for p in PROGRAM_PATHS if host.exists(p)), None)
    unit = any(host.exists(u) for u in UNIT_FILES)
    if not (out.get("nvswitches") or nvlink5 or program or unit):
        return out, notes  # nothing here has or wants a fabric manager
    fm: dict[str, Any] = {}
    if program:
        fm["installed"] = True
        version, note = program_version(host, program)
        if version:
            fm["version"] = version
        if note:
            notes.append(note)
    if running(host):
        fm["active"] = True
    else:
        service = systemd_active(host)
        if service is not None:
            fm["active"] = service
            fm.setdefault("installed", unit)  # systemd answered: this is the host itself
    if fm:
        out["fabric_manager"] = fm
    return out, notes


def nvlink5_switch(host: Host) -> bool | None:
    """True when an InfiniBand device's VPD says SW_MNG (an NVLink 5 switch's management
    port); False when every such VPD was read and none does; None when none could be read."""
    vpds = host.glob("/sys/class/infiniband/*/device/vpd")
    unread = False
    for vpd in vpds:
        text, _ = host.read_text(vpd)
        if text is None:
            unread = True
        elif "SW_MNG" in text:
            return True
    return None if unread or not vpds else False


def program_version(host: Host, program: str) -> tuple[str | None, str | None]:
    """(``nv-fabricmanager --version``'s version, a note when it could not be read)."""
    res = host.run([program, "--version"], label="nv-fabricmanager --version")
    if res is None:
        return None, None
    m = _VERSION.search(f"{res.stdout}\n{res.stderr}")
    if m:
        return m.group(1), None
    why = res.error or f"exit status {res.returncode}"
    failed = "probe failed: " if res.error and "timed out" in res.error else ""
    return None, f"{failed}fabric manager: {program} --version gave no version ({why})"


def running(host: Host) -> bool:
    """Whether a nv-fabricmanager process is visible in /proc."""
    for i, comm in enumerate(host.glob("/proc/[0-9]*/comm")):
        if i >= MAX_PROCESSES:
            break
        text, _ = host.read_text(comm)
        if text is not None and text.strip() == COMM:
            return True
    return False


def systemd_active(host: Host) -> bool | None:
    """``systemctl is-active nvidia-fabricmanager``: True (active), False (inactive, failed
    or no such unit), None when systemd did not answer (a container) or it is starting."""
    prog = host.which("systemctl")
    if prog is None:
        return None
    res = host.run([prog, "is-active", UNIT], label="systemctl is-active")
    if res is None or res.error:
        return None
    word = (res.stdout.split() or [""])[0]
    if word == "active" and res.returncode == 0:
        return True
    if word in ("inactive", "failed") and res.returncode != 0:
        return False
    return None
