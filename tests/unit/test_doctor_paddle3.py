"""paddlepaddle-gpu 3.x has one version for every CUDA variant: the variant is read from the
CUDA runtime pip brought with it, and the CUDA 12.9 build has no code for sm_61
(PaddleX#4682); the fix is the same release from the cu118 index, removed first."""

from __future__ import annotations

from pathlib import Path

from tests.unit._doctor_helpers import doctor

GTX1080 = 'gpus: [{name: NVIDIA GeForce GTX 1080}]\ndriver: {version: "576.02"}\n'


def test_cu129_build_on_pascal_is_an_error_fixed_by_the_cu118_index(tmp_path: Path) -> None:
    d = doctor(tmp_path, GTX1080 + 'packages: {paddlepaddle-gpu: "3.2.0", '
                                   'nvidia-cuda-runtime-cu12: "12.9.79"}\n')
    [f] = d.of("arch-unsupported", "paddlepaddle-gpu")
    assert f["severity"] == "error" and "(cu129: CUDA 12.9)" in f["message"]
    assert "sm_61" in f["message"] and "no kernel image" in f["message"]
    assert f["fix"].startswith("`pip uninstall -y paddlepaddle-gpu`")
    assert "`export PIP_INDEX_URL=https://www.paddlepaddle.org.cn/packages/stable/cu118/`" \
        in f["fix"]
    assert "`pip install paddlepaddle-gpu==3.2.0`" in f["fix"]
    assert "PaddleX#4682" in f["source"] and not d.of("unknown-version")
    assert d.data["verdict"] == "fail"


def test_variant_from_a_runtime_copy_in_the_wheel(tmp_path: Path) -> None:
    # the snapshot of the report: the runtime copy came with paddlepaddle-gpu itself
    d = doctor(tmp_path, 'os: Windows\ngpus: [{name: NVIDIA GeForce GTX 1080}]\n'
                         'driver: {cuda: "12.9"}\ncuda_runtimes: [{version: "12.9", source: '
                         '"pip:paddlepaddle-gpu"}]\npackages: {paddlepaddle-gpu: "3.2.0"}\n')
    assert d.of("arch-unsupported", "paddlepaddle-gpu")


def test_cu118_build_on_pascal_passes(tmp_path: Path) -> None:
    d = doctor(tmp_path, GTX1080 + 'packages: {paddlepaddle-gpu: "3.2.0", '
                                   'nvidia-cuda-runtime-cu11: "11.8.89"}\n')
    assert not d.codes("paddlepaddle-gpu")
    [f] = d.of("ok", "paddlepaddle-gpu")
    assert "(cu118: CUDA 11.8)" in f["message"]


def test_gpu_the_matrix_knows_nothing_about_is_not_judged(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'gpus: [{name: NVIDIA H100 80GB HBM3}]\ndriver: {version: '
                         '"570.124.06"}\npackages: {paddlepaddle-gpu: "3.2.0", '
                         'nvidia-cuda-runtime-cu12: "12.9.79"}\n')
    assert not d.codes("paddlepaddle-gpu")
    [f] = d.of("not-judged", "paddlepaddle-gpu")
    assert "sm_90" in f["message"] and "not in the matrix" in f["message"]


def test_a_driver_too_old_for_the_variant(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'gpus: [{name: NVIDIA GeForce GTX 1080}]\ndriver: {version: '
                         '"418.87.01"}\npackages: {paddlepaddle-gpu: "3.2.0", '
                         'nvidia-cuda-runtime-cu12: "12.9.79"}\n')
    assert d.of("driver-too-old", "paddlepaddle-gpu")
    [f] = d.of("arch-unsupported", "paddlepaddle-gpu")
    # the cu118 build needs a newer driver than R418 too: no index is offered
    assert "PIP_INDEX_URL" not in f["fix"] and "-DCUDA_ARCH_BIN=61" in f["fix"]


def test_variant_unknown_stays_unknown_version(tmp_path: Path) -> None:
    d = doctor(tmp_path, GTX1080 + 'packages: {paddlepaddle-gpu: "3.2.0"}\n')
    assert d.of("unknown-version", "paddlepaddle-gpu")
    two = doctor(tmp_path, GTX1080 + 'packages: {paddlepaddle-gpu: "3.2.0", '
                                     'nvidia-cuda-runtime-cu12: "12.9.79", '
                                     'nvidia-cuda-runtime-cu11: "11.8.89"}\n')
    [f] = two.of("not-judged", "paddlepaddle-gpu")
    assert "11.8, 12.9" in f["message"]
