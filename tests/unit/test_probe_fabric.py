"""The fabric manager / NVSwitch probe against canned /proc, /sys and command answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _doctor_helpers import probe_fakes

from dnnctl.doctor.host import CmdResult, Host
from dnnctl.doctor.probe_fabric import probe_fabric

fakes = probe_fakes()
DRIVER = {"/proc/driver/nvidia/version": "NVRM version: 535.161.08\n"}
SWITCHES = {f"/proc/driver/nvidia-nvswitch/devices/0000:0{i}:00.0": "" for i in range(6)}
FM_VERSION = "Fabric Manager version is : 535.161.08\n"


def _host(tmp_path: Path, files: dict[str, Any], commands: dict[str, Any]) -> tuple[Host, Any]:
    runner = fakes.FakeRunner(commands=commands)
    host = fakes.make_host(tmp_path, files=files, runner=runner)
    for program in ("/usr/bin/nv-fabricmanager", "/usr/bin/systemctl"):
        if host.exists(program):
            host.path(program).chmod(0o755)
    return host, runner


def test_hgx_host_with_fabric_manager_running(tmp_path):
    host, _ = _host(tmp_path, {**DRIVER, **SWITCHES, "/usr/bin/nv-fabricmanager": "",
                               "/proc/4242/comm": "nv-fabricmanage\n",
                               "/proc/1/comm": "systemd\n"},
                    {"nv-fabricmanager": FM_VERSION})
    out, notes = probe_fabric(host)
    assert out == {"nvswitches": 6, "fabric_manager": {
        "installed": True, "version": "535.161.08", "active": True}}
    assert notes == []


def test_service_stopped_is_known_not_running(tmp_path):
    host, runner = _host(tmp_path, {**DRIVER, **SWITCHES, "/usr/bin/nv-fabricmanager": "",
                                    "/usr/bin/systemctl": "", "/proc/1/comm": "systemd\n"},
                         {"nv-fabricmanager": FM_VERSION,
                          "systemctl": CmdResult(3, "failed\n", "")})
    out, _ = probe_fabric(host)
    assert out["fabric_manager"] == {"installed": True, "version": "535.161.08",
                                     "active": False}
    assert ["/usr/bin/systemctl", "is-active", "nvidia-fabricmanager"] in runner.calls


def test_nvswitches_without_fabric_manager_on_a_systemd_host(tmp_path):
    host, _ = _host(tmp_path, {**DRIVER, **SWITCHES, "/usr/bin/systemctl": ""},
                    {"systemctl": CmdResult(3, "inactive\n", "")})
    out, _ = probe_fabric(host)
    assert out["fabric_manager"] == {"active": False, "installed": False}


def test_container_without_systemd_leaves_the_host_unknown(tmp_path):
    host, _ = _host(tmp_path, {**DRIVER, **SWITCHES, "/usr/bin/systemctl": ""},
                    {"systemctl": CmdResult(1, "offline\n", "System has not been booted with "
                                            "systemd as init system (PID 1). Can't operate.\n")})
    out, _ = probe_fabric(host)
    assert out == {"nvswitches": 6}


def test_gpu_operator_host_sees_the_driver_containers_fabric_manager(tmp_path):
    """No program or unit on the host; the driver container's daemon is a host process."""
    host, _ = _host(tmp_path, {**DRIVER, **SWITCHES, "/usr/bin/systemctl": "",
                               "/proc/777/comm": "nv-fabricmanage\n"},
                    {"systemctl": CmdResult(3, "inactive\n", "")})
    out, _ = probe_fabric(host)
    assert out["fabric_manager"] == {"active": True}


def test_a_pcie_host_runs_no_command(tmp_path):
    host, runner = _host(tmp_path, {**DRIVER, "/proc/driver/nvidia-nvswitch/devices/.keep": ""},
                         {})
    host.path("/proc/driver/nvidia-nvswitch/devices/.keep").unlink()
    out, notes = probe_fabric(host)
    assert out == {"nvswitches": 0} and notes == [] and runner.calls == []


def test_no_driver_no_probe(tmp_path):
    host, runner = _host(tmp_path, {"/usr/bin/nv-fabricmanager": ""}, {})
    assert probe_fabric(host) == ({}, []) and runner.calls == []


def test_nvlink5_switch_port_from_infiniband_vpd(tmp_path):
    host, _ = _host(tmp_path, {**DRIVER, "/sys/class/infiniband/mlx5_0/device/vpd":
                               b"\x82\x10CX7 bridge\x90SW_MNG\x00",
                               "/sys/class/infiniband/mlx5_1/device/vpd": b"\x82\x04NIC1"}, {})
    out, _ = probe_fabric(host)
    assert out["nvlink5_switch"] is True


def test_an_unparsable_version_is_a_note(tmp_path):
    host, _ = _host(tmp_path, {**DRIVER, **SWITCHES, "/usr/bin/nv-fabricmanager": ""},
                    {"nv-fabricmanager": CmdResult(1, "", "error while loading shared "
                                                   "libraries\n")})
    out, notes = probe_fabric(host)
    assert "version" not in out["fabric_manager"]
    assert notes and "nv-fabricmanager --version gave no version (exit status 1)" in notes[0]


def test_detect_merges_the_fabric_fields_into_the_driver(tmp_path):
    """The replayed H200 server with six NVSwitches and a running Fabric Manager added."""
    from dnnctl.doctor.detect import detect

    host, runner, _ = fakes.h200_host(tmp_path)
    fakes.make_root(host.root, {**SWITCHES, "/usr/bin/nv-fabricmanager": "",
                                "/proc/4242/comm": "nv-fabricmanage\n"})
    host.path("/usr/bin/nv-fabricmanager").chmod(0o755)
    runner.commands["nv-fabricmanager"] = "Fabric Manager version is : 580.159.04\n"
    env = detect(host=host)
    assert env.driver["nvswitches"] == 6
    assert env.driver["fabric_manager"] == {"installed": True, "version": "580.159.04",
                                            "active": True}
