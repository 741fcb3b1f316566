"""MIG devices written without a profile (only mig.parent / gpu_instance) are still MIG
devices, and a GPU in MIG mode is said to be one (pytorch/pytorch#102715)."""

from __future__ import annotations

from pathlib import Path

from tests.unit._doctor_helpers import doctor

PARENT = """
gpus:
  - {index: 0, name: NVIDIA A100, mig: {mode: true}}
%s
frameworks:
  torch: {version: "1.13.1"}
"""
DEVICE = '  - {name: NVIDIA A100 MIG device, mig: {parent: "0"}}\n'


def test_two_mig_devices_without_profiles_warn(tmp_path: Path) -> None:
    d = doctor(tmp_path, PARENT % (DEVICE * 2))
    [f] = d.of("mig-enumeration")
    assert f["severity"] == "warning" and f["evidence"]["visible"] == 2
    assert "CUDA_VISIBLE_DEVICES" in f["fix"]
    assert "2 on NVIDIA A100 (?, ?)" in d.text


def test_one_mig_device_without_profile_is_not_a_warning(tmp_path: Path) -> None:
    d = doctor(tmp_path, PARENT % DEVICE)
    assert "mig-enumeration" not in d.codes()
    assert "1 on NVIDIA A100 (?)" in d.text


def test_gpu_instance_field_alone_makes_a_mig_device(tmp_path: Path) -> None:
    dev = '  - {name: A100 slice, mig: {gpu_instance: %d}}\n'
    d = doctor(tmp_path, PARENT % (dev % 1 + dev % 2))
    assert "mig-enumeration" in d.codes()


def test_gpu_in_mig_mode_alone_is_an_info(tmp_path: Path) -> None:
    d = doctor(tmp_path, PARENT % "")
    assert "mig-enumeration" not in d.codes()
    assert [f for f in d.of("ok", "gpu") if f["evidence"].get("mig_mode")]
    assert "in MIG mode, so CUDA sees its MIG devices" in d.text


def test_mig_mode_off_is_no_mig(tmp_path: Path) -> None:
    d = doctor(tmp_path, (PARENT % "").replace("mode: true", "mode: false"))
    assert "MIG" not in d.text.replace("mig", "")
