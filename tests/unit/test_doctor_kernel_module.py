"""The open / proprietary kernel module flavor against the GPUs, and GPUs the driver does not
list, through the real `dnnctl doctor --from` (compat/kernel_modules.yaml)."""

from __future__ import annotations

from _doctor_helpers import doctor

UBUNTU = "os: 'Ubuntu 22.04.4 LTS; Linux 6.8.0-45-generic x86_64'\n"
RTX2060 = "{slot: '0000:01:00.0', device_id: 1e89, name: 'TU106 [GeForce RTX 2060]', bound: nvidia}"
GTX1070TI = ("{slot: '0000:02:00.0', device_id: 1b82, name: 'GP104 [GeForce GTX 1070 Ti]', "
             "bound: nvidia}")
LISTED_2060 = "gpus: [{index: 0, name: NVIDIA GeForce RTX 2060, compute_capability: '7.5'}]\n"


def _km(d):
    return d.of("kernel-module", "driver")


def test_open_module_beside_a_pascal_gpu_on_the_bus(tmp_path):
    """What a detected snapshot of open-gpu-kernel-modules#696 holds: the open flavor, one GPU
    listed, both on the bus."""
    d = doctor(tmp_path, UBUNTU + "driver: {version: 560.35.03, kernel_module_type: open, "
               f"gpu_count: 1, pci_gpus: [{RTX2060}, {GTX1070TI}]}}\n" + LISTED_2060)
    [f] = _km(d)
    assert f["severity"] == "error" and d.code == 1
    assert ("the open NVIDIA kernel module is loaded (driver 560.35.03) and does not drive "
            "GP104 [GeForce GTX 1070 Ti] (compute capability 6.1, Pascal)") in f["message"]
    assert "the driver lists 1 of 2 GPUs" in f["message"]
    assert "`sudo apt install --autoremove --purge cuda-drivers nvidia-driver`" in f["fix"]
    assert "nvidia-driver-560 in place of nvidia-driver-560-open" in f["fix"]
    assert "`--kernel-module-type=proprietary`" in f["fix"] and "reboot" in f["fix"]
    assert "kernel_modules.yaml" in f["source"] and "GPU System Processor" in f["source"]
    assert f["evidence"]["gpus"] == ["GP104 [GeForce GTX 1070 Ti]"]
    assert "2 NVIDIA GPUs on the PCI bus, 1 listed by the driver" in d.text


CASE01 = ("os: Ubuntu 20.04.6 LTS\ndriver: {present: true, version: 560.35.03, cuda: '12.6', "
          "gpu_count: 1KMT}\ngpus:\n"
          "  - {name: NVIDIA GeForce RTX 2060, compute_capability: '7.5'}\n"
          "  - {name: NVIDIA GeForce GTX 1070 Ti, compute_capability: '6.1'}\n")


def test_a_hand_written_count_is_one_error_from_one_rule(tmp_path):
    """audit15 case 01 as written (both GPUs named, the driver's count 1): with the flavor
    unknown rules_gpu_count names the likely causes; with the open flavor named, this rule
    names the GPU it leaves out and rules_gpu_count says nothing; with the proprietary flavor
    named, the open module is no cause."""
    d = doctor(tmp_path, CASE01.replace("KMT", ""))
    assert _km(d) == [] and len(d.of("gpu-not-driven")) == 1
    assert "open kernel modules" in d.of("gpu-not-driven")[0]["message"]
    d = doctor(tmp_path, CASE01.replace("KMT", ", kernel_module_type: open"))
    assert d.of("gpu-not-driven") == []
    [f] = _km(d)
    assert "does not drive NVIDIA GeForce GTX 1070 Ti (compute capability 6.1, Pascal)" \
        in f["message"] and "the driver lists 1 of 2 GPUs" in f["message"]
    d = doctor(tmp_path, CASE01.replace("KMT", ", kernel_module_type: proprietary"))
    assert _km(d) == []
    [g] = d.of("gpu-not-driven")
    assert "open kernel modules" not in g["message"] and "vfio-pci" in g["message"]


def test_proprietary_module_and_blackwell(tmp_path):
    d = doctor(tmp_path, "os: 'Rocky Linux 9.4; Linux 5.14 x86_64'\ndriver: {version: "
               "570.124.06, kernel_module_type: proprietary, gpu_count: 0, pci_gpus: "
               "[{slot: '0000:17:00.0', name: 'GB100 [B200]'}]}\ngpus: []\n")
    [f] = _km(d)
    assert "the proprietary NVIDIA kernel module is loaded" in f["message"]
    assert "do not drive Blackwell" in f["message"] and "B200" in f["message"]
    assert "`sudo dnf install --allowerasing nvidia-open`" in f["fix"]
    assert "`sudo dnf -y module switch-to nvidia-driver:570-open --allowerasing`" in f["fix"]


def test_no_flavor_drives_both_a_pascal_and_a_blackwell_gpu(tmp_path):
    d = doctor(tmp_path, UBUNTU + "driver: {version: 575.57.08, kernel_module_type: open}\n"
               "gpus:\n  - {name: NVIDIA GeForce RTX 5090}\n  - {name: NVIDIA GeForce GTX 1080}\n")
    [f] = _km(d)
    assert "does not drive NVIDIA GeForce GTX 1080" in f["message"]
    assert f["fix"].startswith("no one flavor drives every GPU here") and \
        "run them on separate machines" in f["fix"]


def test_silent_where_the_flavor_drives_everything_or_nothing_is_known(tmp_path):
    for text in (
        UBUNTU + "driver: {version: 560.35.03, kernel_module_type: open, gpu_count: 1, "
        f"pci_gpus: [{RTX2060}]}}\n" + LISTED_2060,
        UBUNTU + "driver: {version: 535.183.01, kernel_module_type: proprietary}\n"
        "gpus: [{name: Tesla V100-SXM2-16GB}, {name: NVIDIA A100-SXM4-80GB}]\n",
        UBUNTU + "driver: {version: 560.35.03}\n" + LISTED_2060,  # count unknown
        # a container sees the host's bus, not the GPUs given to it
        "os: 'Ubuntu 22.04; Linux 6.8 x86_64; container'\ndriver: {version: 560.35.03, "
        f"kernel_module_type: open, gpu_count: 1, pci_gpus: [{RTX2060}, {GTX1070TI}]}}\n"
        + LISTED_2060,
        # a GPU handed to a VM is not missing
        UBUNTU + "driver: {version: 560.35.03, gpu_count: 1, pci_gpus: "
        f"[{RTX2060}, {{slot: '0000:02:00.0', name: 'GP104 [GeForce GTX 1070 Ti]', "
        "bound: vfio-pci}]}\n" + LISTED_2060,
        # Windows drives GPUs with its own driver model
        "os: Windows 11\ndriver: {version: 560.94, kernel_module_type: open}\n"
        "gpus: [{name: NVIDIA GeForce GTX 1070}]\n",
    ):
        assert _km(doctor(tmp_path, text)) == [], text


def test_a_gpu_bound_to_nouveau_and_an_unexplained_missing_gpu(tmp_path):
    d = doctor(tmp_path, UBUNTU + "driver: {version: 550.127.05, kernel_module_type: "
               "proprietary, gpu_count: 1, pci_gpus: [{slot: '0000:01:00.0', name: "
               "'AD102 [GeForce RTX 4090]', bound: nvidia}, {slot: '0000:02:00.0', name: "
               "'AD102 [GeForce RTX 4090]', bound: nouveau}]}\n"
               "gpus: [{index: 0, name: NVIDIA GeForce RTX 4090}]\n")
    [f] = _km(d)
    assert "the driver lists 1 of the 2 NVIDIA GPUs on the PCI bus" in f["message"]
    assert "the nouveau driver is bound to AD102 [GeForce RTX 4090]" in f["message"]
    assert "blacklist nouveau" in f["fix"]
    d = doctor(tmp_path, UBUNTU + "driver: {version: 550.127.05, kernel_module_type: "
               "proprietary, gpu_count: 1, pci_gpus: [{slot: '0000:01:00.0'}, "
               "{slot: '0000:02:00.0', device_id: 2684}]}\n"
               "gpus: [{index: 0, name: NVIDIA GeForce RTX 4090}]\n")
    [f] = _km(d)
    assert ("the driver lists 1 of the 2 NVIDIA GPUs on the PCI bus: 1 of the NVIDIA GPU at "
            "0000:01:00.0; the NVIDIA GPU at 0000:02:00.0 (device 2684) is missing") \
        in f["message"]
    assert "`sudo dmesg | grep NVRM`" in f["fix"]
