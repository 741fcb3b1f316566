"""A framework whose version is unknown is still judged: by its own arch list (README: 'an
explicit arch_list wins over the version table, so unknown and custom builds are still
judged'), and by the matrix where every release it knows agrees (no torch wheel from 1.13 on
has code for compute capability 3.5). Nothing judged is shown as '?', never as a pass."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

RTX5090 = "gpus: [{name: NVIDIA GeForce RTX 5090}]\n"
TITAN_BLACK = "gpus: [{name: NVIDIA GTX TITAN Black, compute_capability: '3.5'}]\n"
CU124_LIST = "[sm_50, sm_60, sm_70, sm_75, sm_80, sm_86, sm_90]"


def test_an_arch_list_without_a_version_is_judged(tmp_path: Path) -> None:
    # LeggedLab#26: torch's own get_arch_list() quoted by its warning, no version given
    got = doctor(tmp_path, RTX5090 + f"frameworks: {{torch: {{arch_list: {CU124_LIST}}}}}\n")
    arch = got.of("arch-unsupported", "torch")
    assert got.code == 1 and len(arch) == 1 and "sm_120" in arch[0]["message"]
    assert "whl/cu13" in arch[0]["fix"] and 'TORCH_CUDA_ARCH_LIST="12.0"' in arch[0]["fix"]
    assert "pip install 'torch==" in got.text.split("commands (one per line):")[1]
    assert got.of("not-judged", "torch") and "✓ torch" not in got.text
    # the same list on a GPU it covers passes, still saying what was not checked
    ok = doctor(tmp_path, "gpus: [{name: NVIDIA H100 80GB HBM3}]\n"
                f"frameworks: {{torch: {{arch_list: {CU124_LIST}}}}}\n")
    assert ok.code == 0 and ok.codes() == set() and ok.of("not-judged", "torch")


def test_a_gpu_no_release_build_has_code_for(tmp_path: Path) -> None:
    # AUTOMATIC1111/stable-diffusion-webui#3003: 'The minimum cuda capability supported by
    # this library is 3.7' on a TITAN Black (3.5), torch version not stated
    got = doctor(tmp_path, TITAN_BLACK + "frameworks: {torch: {}}\n")
    arch = got.of("arch-unsupported", "torch")
    assert got.code == 1 and len(arch) == 1 and arch[0]["severity"] == "error"
    assert "1.13-2.15" in arch[0]["message"] and "sm_35" in arch[0]["message"]
    assert "from source" in arch[0]["fix"] and 'TORCH_CUDA_ARCH_LIST="3.5"' in arch[0]["fix"]
    assert "CUDA 5.0 to 11.8" in arch[0]["fix"] and "pip install" not in arch[0]["fix"]
    # with a known version the same GPU gets the same source-build fix (no wheel to name)
    v = doctor(tmp_path, TITAN_BLACK + "frameworks: {torch: {version: 1.13.1+cu117}}\n")
    assert "from source" in v.of("arch-unsupported", "torch")[0]["fix"]
    # a Kepler K80 (3.7) is reached by some wheels: no build error for an unknown version,
    # and torch.compile's minimum (7.0, releases >= 2.0) is said, not assumed to apply
    k80 = doctor(tmp_path, "gpus: [{name: Tesla K80}]\nframeworks: {torch: {}}\n")
    assert not k80.of("arch-unsupported", "torch") and k80.code == 0
    assert any("torch.compile" in f["message"] for f in k80.of("not-judged", "torch"))


def test_nothing_judged_is_never_shown_as_a_pass(tmp_path: Path) -> None:
    got = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce RTX 3090}]\nframeworks: {torch: {}}\n")
    assert [f["code"] for f in got.findings if f["component"] == "torch"] == ["not-judged"]
    assert "? torch" in got.text and "✓ torch" not in got.text


def test_tensorflow_build_fix_names_its_own_variable_and_a_release(tmp_path: Path) -> None:
    # tensorflow/tensorflow#46537: libtensorflow 2.3.1 (cubins 3.5 ... 7.0) on a cc 5.0 GPU
    got = doctor(tmp_path, "os: Windows 10\ngpus: [{name: GPU, compute_capability: '5.0'}]\n"
                 "frameworks: {tensorflow: {version: 2.3.1, arch_list: [sm_35, sm_37, sm_52, "
                 "sm_60, sm_61, sm_70, compute_70]}}\n")
    fix = got.of("arch-unsupported", "tensorflow")[0]["fix"]
    assert "TF_CUDA_COMPUTE_CAPABILITIES" in fix and "TORCH_CUDA_ARCH_LIST" not in fix
    assert "TensorFlow 2.10" in fix  # the newest with sm_50 that runs on native Windows
