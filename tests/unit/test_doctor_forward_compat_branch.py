"""cuda-compat's libcuda comes from the driver of its CUDA release (11.7 -> R515): a GPU whose
architecture that branch dropped (Kepler: R470 is the last) cannot use it (NVIDIA
container-images cuda#182: 'Kepler devices can only successfully run CUDA images <=11.4')."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

K80 = "gpus: [{name: Tesla K80}]\n"
A100 = "gpus: [{name: NVIDIA A100-SXM4-40GB}]\n"


def _snap(gpu: str, compat: str, extra: str = "") -> str:
    return (f"os: Linux (container)\ndriver: {{version: 470.161.03, forward_compat: "
            f"'{compat}'{extra}}}\n{gpu}")


def test_a_compat_package_newer_than_keplers_last_branch_fails(tmp_path: Path) -> None:
    got = doctor(tmp_path, _snap(K80, "11.7"))
    fc = got.of("forward-compat")
    assert [f["severity"] for f in fc] == ["error"] and got.code == 1
    assert "R515" in fc[0]["message"] and "R470" in fc[0]["message"]
    assert "CUDA <= 11.4" in fc[0]["fix"] and "reboot" not in got.fixes
    assert fc[0]["evidence"]["compat_branch"] == 515
    assert "extends driver" not in got.text and "✗ driver" in got.text


def test_the_newer_libcuda_of_compat_is_not_a_module_mismatch(tmp_path: Path) -> None:
    # the report's own line 'kernel version 470 ... does not match DSO version 515' is the
    # compat libcuda, not a half-finished driver upgrade: no "reboot" fix
    got = doctor(tmp_path, _snap(K80, "11.7", ", kernel_module: 470.161.03, library: 515.43.04"))
    assert "driver-mismatch" not in got.codes() and "forward-compat" in got.codes()
    assert "reboot" not in got.fixes


def test_compat_of_keplers_own_branch_and_on_ampere_still_works(tmp_path: Path) -> None:
    got = doctor(tmp_path, _snap(K80, "11.4"))  # 11.4's driver is R470: Kepler's branch
    assert got.codes() == set() and got.of("forward-compat")[0]["severity"] == "info"
    a100 = doctor(tmp_path, _snap(A100, "12.1"))
    assert a100.codes() == set() and "extends driver" in a100.text
    # a real module/library mismatch without compat is still one
    plain = doctor(tmp_path, "driver: {version: 470.161.03, kernel_module: 470.161.03, "
                   "library: 470.199.02}\n" + K80)
    assert "driver-mismatch" in plain.codes() and "reboot" in plain.fixes


def test_no_compat_suggested_for_a_cuda_keplers_drivers_cannot_reach(tmp_path: Path) -> None:
    got = doctor(tmp_path, "driver: {version: 470.161.03}\n" + K80 + "frameworks: {torch: "
                 "{version: 2.0.1+cu118}}\n")
    assert "cuda-compat" not in got.fixes.replace("(the cuda-compat", "")
    mvc = got.of("driver-mvc") + got.of("driver-too-old")
    assert mvc and all("R470 is its last branch" in f["fix"] for f in mvc)
