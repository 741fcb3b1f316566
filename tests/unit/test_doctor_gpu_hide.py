"""A GPU a framework has no code for beside GPUs it runs on: hide it from CUDA (and never a
source build below the framework's own floor), through the real `dnnctl doctor --from`."""

from __future__ import annotations

from _doctor_helpers import doctor

MIXED = ("driver: {version: '367.57'}\ngpus:\n"
         "  - {index: 0, name: GeForce GTX 460, compute_capability: '2.1'}\n"
         "  - {index: 1, name: GeForce GTX 780 Ti, compute_capability: '3.5'}\n"
         "frameworks: {tensorflow: {source: docker image}}\n")


def test_a_fermi_beside_a_kepler_is_hidden_in_pci_order_not_rebuilt(tmp_path):
    """NVIDIA/nvidia-docker#262: TensorFlow fails on the GTX 460 (2.1) beside a GTX 780 Ti."""
    d = doctor(tmp_path, MIXED)
    [hide] = d.of("hide-gpu", "gpu")
    assert hide["severity"] == "warning"
    assert hide["message"].startswith("GPU 0 (GeForce GTX 460, compute capability 2.1) is "
                                      "visible beside GPUs that tensorflow runs on")
    assert "`export CUDA_DEVICE_ORDER=PCI_BUS_ID` and `export CUDA_VISIBLE_DEVICES=1`" \
        in hide["fix"]
    assert "fastest first" in hide["fix"] and "NV_GPU=1" in hide["fix"]
    assert "CUDA_DEVICE_ORDER" in hide["source"] and "configure.py" in hide["source"]
    [tf] = d.of("arch-unsupported", "tensorflow")
    assert tf["fix"].startswith("run tensorflow on the GPUs that it has code for: hide GPU 0 "
                                "(GeForce GTX 460, compute capability 2.1) from CUDA")
    # below TensorFlow's own floor (3.0) no source build can help
    assert "TF_CUDA_COMPUTE_CAPABILITIES" not in tf["fix"]
    assert "no tensorflow build runs on compute capability 2.1" in tf["fix"]


def test_uuids_need_no_device_order_and_a_lone_gpu_is_not_hidden(tmp_path):
    d = doctor(tmp_path, MIXED.replace("compute_capability: '3.5'}",
                                       "compute_capability: '3.5', uuid: GPU-abc}"))
    [hide] = d.of("hide-gpu")
    assert "`export CUDA_VISIBLE_DEVICES=GPU-abc`" in hide["fix"]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID`" not in hide["fix"]
    lone = doctor(tmp_path, "gpus: [{name: GeForce GTX 460, compute_capability: '2.1'}]\n"
                  "frameworks: {tensorflow: {source: pip}}\n")
    assert lone.of("hide-gpu") == []
    [tf] = lone.of("arch-unsupported", "tensorflow")
    assert tf["fix"].startswith("use a GPU of compute capability 3.0 or newer")
