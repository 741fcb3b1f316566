"""NVSwitch systems need nvidia-fabricmanager of the driver's version (compat/fabric.yaml)."""

from __future__ import annotations

import pytest
from _doctor_helpers import doctor

from dnnctl.compat.matrix import load_matrix


@pytest.fixture(scope="module")
def m():
    return load_matrix()


def test_every_example_name_matches_its_row(m) -> None:
    for row in m.rows("nvswitch_gpus"):
        for name in row["examples"]:
            assert row in m.nvswitch_rows(name), (name, row["model"])


@pytest.mark.parametrize("name", [
    "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA A100 80GB PCIe",
    "NVIDIA A100-PCIE-40GB", "NVIDIA GH200 480GB", "NVIDIA GB200", "Tesla V100-SXM2-16GB",
    "NVIDIA GeForce RTX 4090", "H100", "NVIDIA H800 PCIe"])
def test_pcie_cards_and_boards_without_nvswitch_have_no_row(m, name) -> None:
    assert m.nvswitch_rows(name) == []


# -- the rule, through the real `dnnctl doctor --from` -----------------------------------

UBUNTU = "os: 'Ubuntu 22.04.4 LTS; Linux 5.15.0-105-generic x86_64'\n"
RHEL = "os: 'Rocky Linux 9.3 (Blue Onyx); Linux 5.14.0 x86_64'\n"


def _gpus(name: str, n: int = 1, extra: str = "") -> str:
    return "gpus:\n" + "".join(f"  - {{index: {i}, name: {name}{extra}}}\n" for i in range(n))


def _fm(d):
    return d.of("fabric-manager", "fabric")


def test_hgx_node_with_nothing_known_is_a_conditional_warning(tmp_path):
    """audit14 case 03 (NVIDIA/gpu-operator#375): an HGX A100 node, Fabric Manager unknown."""
    d = doctor(tmp_path, "os: 'CentOS 7.9, Kubernetes 1.21 node'\ndriver: {present: true}\n"
               + _gpus("NVIDIA A100 (HGX board)"))
    [f] = _fm(d)
    assert f["severity"] == "warning" and d.data["verdict"] == "warn"
    assert "on an NVSwitch board CUDA runs only once nvidia-fabricmanager of exactly the " \
        "driver's version" in f["message"] and "802" in f["message"]
    assert "`systemctl enable --now nvidia-fabricmanager`" in f["fix"]
    assert "GPU Operator" in f["fix"] and "gpu-operator#375" in f["source"]
    assert "fabric.yaml" in f["source"]


def test_listed_nvswitches_and_no_fabric_manager_fail_with_the_package_for_the_driver(tmp_path):
    d = doctor(tmp_path, UBUNTU + "driver: {version: 535.161.08, nvswitches: 6, "
               "fabric_manager: {installed: false, active: false}}\n"
               + _gpus("NVIDIA A100-SXM4-80GB", 8))
    [f] = _fm(d)
    assert f["severity"] == "error" and d.code == 1
    assert "the driver lists 6 NVSwitches, and nvidia-fabricmanager is not installed" \
        in f["message"]
    assert "`apt-get install nvidia-fabricmanager-535=535.161.08-1`" in f["fix"]
    assert f["evidence"]["nvswitches"] == 6


@pytest.mark.parametrize(("os", "driver", "command"), [
    (UBUNTU, "580.95.05", "`apt-get install nvidia-fabricmanager=580.95.05-1`"),
    (RHEL, "550.127.05", "`dnf install nvidia-fabricmanager-550.127.05`"),
])
def test_the_package_follows_the_branch_and_the_distribution(tmp_path, os, driver, command):
    d = doctor(tmp_path, os + f"driver: {{version: '{driver}', nvswitches: 4, "
               "fabric_manager: {active: false}}\n" + _gpus("NVIDIA H200", 8))
    [f] = _fm(d)
    assert f["severity"] == "error" and command in f["fix"]
    assert "not running" in f["message"]


def test_fabric_manager_of_another_version_refuses_to_start(tmp_path):
    """NVIDIA/gpu-operator#544: driver 530.41.03, fabricmanager-530 at 530.30.02."""
    d = doctor(tmp_path, UBUNTU + "driver: {version: 530.41.03, nvswitches: 4, "
               "fabric_manager: {version: 530.30.02, installed: true}}\n"
               + _gpus("NVIDIA H100 80GB HBM3", 8))
    [f] = _fm(d)
    assert f["severity"] == "error"
    assert "nvidia-fabricmanager 530.30.02 is not the driver's version 530.41.03" in f["message"]
    assert "`apt-get install nvidia-fabricmanager-530=530.41.03-1`" in f["fix"]
    assert "gpu-driver-container#735" in f["source"]


def test_a_set_up_fabric_with_a_mismatched_package_warns_of_the_next_start(tmp_path):
    d = doctor(tmp_path, UBUNTU + "driver: {version: 580.126.09, fabric_manager: "
               "{version: 590.48.01}}\n" + _gpus("NVIDIA H200", 1, ", fabric: {state: completed, "
                                                  "status: success}"))
    [f] = _fm(d)
    assert f["severity"] == "warning" and "next boot or restart" in f["message"]


def test_running_fabric_manager_of_the_drivers_version_passes(tmp_path):
    d = doctor(tmp_path, UBUNTU + "driver: {version: 535.161.08, nvswitches: 6, "
               "fabric_manager: {version: 535.161.08, active: true, installed: true}}\n"
               + _gpus("NVIDIA A100-SXM4-80GB", 8))
    assert not _fm(d) and d.data["verdict"] == "pass"
    assert any("nvidia-fabricmanager 535.161.08 is running" in f["message"]
               for f in d.of("ok", "fabric"))
    assert "Fabric Manager 535.161.08, running; 6 NVSwitches" in d.text


def test_completed_fabric_state_passes_without_the_service_known(tmp_path):
    d = doctor(tmp_path, UBUNTU + "driver: {version: 570.133.20}\n"
               + _gpus("NVIDIA H100 80GB HBM3", 8, ", fabric: {state: Completed, "
                       "status: success}"))
    assert not _fm(d) and d.data["verdict"] == "pass"
    assert any("fabric state completed" in f["message"] for f in d.of("ok", "fabric"))


@pytest.mark.parametrize(("fabric", "severity", "words"), [
    ("{state: not_started}", "error", "its fabric is not started"),
    ("{state: In Progress}", "warning", "still in progress"),
    ("{state: completed, status: 'NVML error 3'}", "error", "set-up failed (NVML error 3)"),
])
def test_the_gpus_fabric_state_decides(tmp_path, fabric, severity, words):
    d = doctor(tmp_path, UBUNTU + "driver: {version: 570.133.20}\n"
               + _gpus("NVIDIA H100 80GB HBM3", 8, f", fabric: {fabric}"))
    [f] = _fm(d)
    assert f["severity"] == severity and words in f["message"]


@pytest.mark.parametrize("snapshot", [
    "driver: {version: 550.90.07}\n" + _gpus("NVIDIA H100 PCIe", 2),  # a PCIe card
    "driver: {version: 550.90.07}\n" + _gpus("NVIDIA H100 NVL", 2),
    # the driver lists no NVSwitch where it would list an A100 board's: a 1-GPU cloud VM
    "driver: {version: 550.90.07, nvswitches: 0}\n" + _gpus("NVIDIA A100-SXM4-40GB"),
    # NVML says this Hopper GPU is on no fabric (a 4-GPU board)
    "driver: {version: 550.90.07}\n" + _gpus("NVIDIA H100 80GB HBM3", 4,
                                            ", fabric: {state: not_supported}"),
])
def test_nodes_without_nvswitches_are_not_judged_for_it(tmp_path, snapshot):
    assert not _fm(doctor(tmp_path, UBUNTU + snapshot))


@pytest.mark.parametrize("os", ["os: Windows 11\n",
                                "os: 'Ubuntu 22.04; Linux 5.15.153.1-microsoft-standard-WSL2 "
                                "x86_64; WSL2'\n"])
def test_no_fabric_manager_outside_linux(tmp_path, os):
    d = doctor(tmp_path, os + "driver: {version: 552.22}\n" + _gpus("NVIDIA H100 80GB HBM3"))
    assert not _fm(d)


def test_blackwell_switches_are_not_listed_by_the_driver(tmp_path):
    """NVLink 5: an empty NVSwitch list says nothing; the fix names NVLSM and ib_umad."""
    d = doctor(tmp_path, UBUNTU + "driver: {version: 570.133.20, nvswitches: 0}\n"
               + _gpus("NVIDIA B200", 8))
    [f] = _fm(d)
    assert f["severity"] == "warning" and "nvlsm" in f["fix"] and "ib_umad" in f["fix"]


def test_a_whole_boards_gpus_without_fabric_manager_fail_a_single_one_warns(tmp_path):
    text = UBUNTU + "driver: {version: 535.161.08, fabric_manager: {installed: false}}\n"
    [board] = _fm(doctor(tmp_path, text + _gpus("NVIDIA A100-SXM4-80GB", 8)))
    [one] = _fm(doctor(tmp_path, text + _gpus("NVIDIA A100-SXM4-80GB", 1)))
    assert board["severity"] == "error" and one["severity"] == "warning"
    assert "on an NVSwitch board CUDA fails" in one["message"]


def test_the_fabric_manager_error_explains_an_unavailable_torch(tmp_path):
    d = doctor(tmp_path, UBUNTU + "driver: {version: 535.161.08, nvswitches: 6, "
               "fabric_manager: {active: false}}\n" + _gpus("NVIDIA A100-SXM4-80GB", 8)
               + "frameworks: {torch: {version: 2.3.1+cu121, cuda_available: false}}\n")
    assert _fm(d) and not d.of("cuda-unavailable")
