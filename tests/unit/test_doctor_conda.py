"""conda's __cuda virtual package and conda-forge's CPU-only builds, through the real
`dnnctl doctor --from`."""

from __future__ import annotations

from _doctor_helpers import doctor

PLANNED = ("os: Linux (login node)\ngpus: []\nframeworks: {torch: {cuda: '12', source: "
           "'conda-forge (micromamba install -c conda-forge pytorch \"libtorch=*=cuda12*\")'}}\n")


def test_a_conda_cuda_build_with_no_driver_in_view_needs_conda_override_cuda(tmp_path):
    """conda-forge/pytorch-cpu-feedstock#364: '__cuda ... missing on the system' on a login
    node."""
    d = doctor(tmp_path, PLANNED)
    [f] = d.of("conda-virtual-package", "torch")
    assert f["severity"] == "warning" and f["evidence"]["conditional"] is True
    assert f["message"].startswith("if this machine has no NVIDIA driver (a cluster's login "
                                   "node, a build host)")
    assert "no __cuda virtual package, which the conda CUDA 12 build of torch requires" \
        in f["message"]
    assert f["fix"].startswith("`export CONDA_OVERRIDE_CUDA=12.0` before the conda")
    assert "manage-virtual" in f["source"] and "pytorch-cpu-feedstock#364" in f["source"]
    absent = doctor(tmp_path, PLANNED.replace("gpus: []\n", "driver: {present: false}\n"))
    [f] = absent.of("conda-virtual-package")
    assert f["message"].startswith("no NVIDIA driver is found here; so conda")
    assert "conditional" not in f["evidence"]


def test_no_warning_with_a_driver_an_override_or_a_pip_build(tmp_path):
    gpu = doctor(tmp_path, PLANNED.replace("gpus: []", "driver: {version: 550.90.07}\n"
                                           "gpus: [{name: NVIDIA H100 80GB HBM3}]"))
    assert gpu.of("conda-virtual-package") == []
    override = doctor(tmp_path, PLANNED + "environment: {CONDA_OVERRIDE_CUDA: '12.4'}\n")
    assert override.of("conda-virtual-package") == []
    pip = doctor(tmp_path, "frameworks: {torch: {version: 2.5.1+cu124, source: pip}}\n")
    assert pip.of("conda-virtual-package") == []


def test_conda_forge_xgboost_on_windows_is_cpu_only(tmp_path):
    """dmlc/xgboost#7765: conda-forge's xgboost and the pip wheel in one env on Windows 10."""
    d = doctor(tmp_path, "os: Windows 10\npackages: {xgboost: null, cudatoolkit: null}\n")
    [f] = d.of("cuda-mismatch", "xgboost")
    assert f["severity"] == "warning" and f["evidence"]["conditional"] is True
    assert f["message"].startswith("if xgboost came from conda-forge")
    assert "'XGBoost version not compiled with GPU support'" in f["message"]
    assert "`pip install xgboost`" in f["fix"] and "never both" in f["fix"]
    assert "py-xgboost-gpu not available on Windows" in f["source"]
    sure = doctor(tmp_path, "os: Windows 10\ngpus: [{name: NVIDIA GeForce RTX 3080}]\n"
                  "packages: {xgboost: 1.6.0, py-xgboost: 1.6.0}\n")
    [f] = sure.of("cuda-mismatch", "xgboost")
    assert f["message"].startswith("xgboost 1.6.0 is conda-forge's build (py-xgboost "
                                   "installed), which has no CUDA on Windows; a pip copy")
    assert "conditional" not in f["evidence"]
    cpu = doctor(tmp_path, "os: Windows 10\npackages: {xgboost: 2.0.3}\n")  # no CUDA meant
    assert cpu.of("cuda-mismatch") == []
    linux = doctor(tmp_path, "os: Ubuntu 22.04\ngpus: [{name: NVIDIA GeForce RTX 3080}]\n"
                   "packages: {py-xgboost: 2.0.3}\n")
    assert linux.of("cuda-mismatch") == []


def test_an_installed_conda_build_was_solved_already(tmp_path):
    """NVIDIA/apex#315's snapshot: a conda torch installed (installer read), no driver named."""
    d = doctor(tmp_path, "frameworks: {torch: {cuda: '9.0', installer: conda, source: conda}}\n")
    assert d.of("conda-virtual-package") == []
