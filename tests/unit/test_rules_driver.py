"""Driver, GPU and CUDA-runtime rules on hand-built snapshots."""

from __future__ import annotations

import pytest

from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor.model import Component, EnvSnapshot, Gpu, verdict
from dnnctl.doctor.rules import judge


@pytest.fixture(scope="module")
def m():
    return load_matrix()


def codes(findings, severities=("error", "warning")):
    return sorted({f.code for f in findings if f.severity in severities})


def test_no_driver_is_clear_and_not_called_insufficient(m) -> None:
    f = judge(EnvSnapshot(driver={"present": False}), m)
    assert codes(f) == ["no-driver"] and verdict(f) == "fail"
    assert "missing" in f[0].message and "nothing is too old" in f[0].message
    assert "--gpus all" in f[0].fix


def test_no_gpu_only_when_the_driver_could_list_them(m) -> None:
    listed_none = {"present": True, "version": "580.65.06", "gpu_count": 0}
    assert codes(judge(EnvSnapshot(driver=listed_none), m)) == ["no-gpu"]
    # gpus and gpu_count absent: unknown, not "none" (a hand-written or partial snapshot)
    unknown = judge(EnvSnapshot(driver={"present": True, "version": "580.65.06"}), m)
    assert codes(unknown) == [] and [f.code for f in unknown if f.component == "gpu"] == \
        ["not-judged"]
    mismatch = {"present": True, "version": "580.95.05", "kernel_module": "580.65.06"}
    assert codes(judge(EnvSnapshot(driver=mismatch), m)) == ["driver-mismatch"]
    # a hand-written plan with only a driver version says nothing about GPUs
    assert codes(judge(EnvSnapshot(driver={"version": "580.65.06"}), m)) == []


@pytest.mark.parametrize("driver, expect", [
    ("580.65.06", []), ("570.124.06", ["driver-mvc"]), ("525.60.13", ["driver-mvc"]),
    ("525.60.12", ["driver-too-old"]), ("470.82.01", ["driver-too-old"]),
])
def test_driver_vs_cupy_runtime_mvc_is_a_warning(m, driver: str, expect: list[str]) -> None:
    env = EnvSnapshot(driver={"version": driver},
                      frameworks={"cupy": {"version": "13.6.0", "package": "cupy-cuda12x",
                                           "cuda": "12.9"}})
    f = judge(env, m)
    assert codes(f) == expect
    if expect == ["driver-mvc"]:
        assert f[[x.code for x in f].index("driver-mvc")].severity == "warning"


def test_mvc_for_prebuilt_torch_is_info(m) -> None:
    env = EnvSnapshot(driver={"version": "535.54.03"}, gpus=[Gpu(name="NVIDIA A100-SXM4-80GB")],
                      frameworks={"torch": {"version": "2.6.0+cu124"}})
    f = judge(env, m)
    assert codes(f) == [] and "driver-mvc" in codes(f, ("info",))


def test_numeric_not_lexical_driver_compare(m) -> None:
    # 570.124.06 is newer than 570.26 (CUDA 12.8 GA): full support for cu128
    env = EnvSnapshot(driver={"version": "570.124.06"}, gpus=[Gpu(name="NVIDIA B200")],
                      frameworks={"torch": {"version": "2.7.1+cu128"}})
    assert codes(judge(env, m)) == []


def test_blackwell_needs_r570_and_volta_ends_at_r580(m) -> None:
    f = judge(EnvSnapshot(driver={"version": "560.35.03"}, gpus=[Gpu(name="NVIDIA B200")]), m)
    assert codes(f) == ["driver-too-old"] and "570.26" in f[0].fix
    f = judge(EnvSnapshot(driver={"version": "590.48.01"},
                          gpus=[Gpu(name="NVIDIA GeForce GTX 1080")]), m)
    assert codes(f) == ["arch-unsupported"] and "R580" in f[0].fix


def test_forward_compat_offered_only_for_datacenter_gpus(m) -> None:
    dc = EnvSnapshot(driver={"version": "535.183.01"}, gpus=[Gpu(name="NVIDIA H100 PCIe")],
                     frameworks={"torch": {"version": "2.9.0+cu130"}})
    f = [x for x in judge(dc, m) if x.code == "driver-too-old"]
    assert f and "cuda-compat-13-0" in f[0].fix
    geforce = EnvSnapshot(driver={"version": "535.183.01"},
                          gpus=[Gpu(name="NVIDIA GeForce RTX 4090")],
                          frameworks={"torch": {"version": "2.9.0+cu130"}})
    f = [x for x in judge(geforce, m) if x.code == "driver-too-old"]
    assert f and "cuda-compat-13-0" not in f[0].fix and "data-center GPUs only" in f[0].fix


def test_forward_compat_in_use(m) -> None:
    drv = {"version": "535.183.01", "forward_compat": True, "cuda": "12.8"}
    ok = EnvSnapshot(driver=drv, gpus=[Gpu(name="NVIDIA A100-SXM4-80GB")],
                     frameworks={"torch": {"version": "2.7.1+cu128"}})
    f = judge(ok, m)
    assert codes(f) == [] and "forward-compat" in codes(f, ("info",))
    bad = EnvSnapshot(driver=drv, gpus=[Gpu(name="NVIDIA GeForce RTX 3090")])
    f = judge(bad, m)
    assert "forward-compat" in codes(f) and "804" in " ".join(x.message for x in f)


def test_unknown_gpu_and_unknown_cuda_release_are_not_guessed(m) -> None:
    f = judge(EnvSnapshot(gpus=[Gpu(name="NVIDIA Quantum Z9000")]), m)
    assert codes(f) == ["unknown-version"]
    env = EnvSnapshot(driver={"version": "612.10"},
                      cuda_runtimes=[Component("13.4", source="system:/usr/local/cuda-13.4")])
    f = judge(env, m)
    assert codes(f) == ["unknown-version"] and "13.4" in f[0].message
    env.driver = {"version": "570.26"}  # below the 13.x floor: certain, whatever 13.4 needs
    assert codes(judge(env, m)) == ["driver-too-old"]


def test_kepler_fix_does_not_ask_for_a_driver_it_cannot_run(m) -> None:
    env = EnvSnapshot(driver={"version": "470.82.01"}, gpus=[Gpu(name="Tesla K80")],
                      frameworks={"torch": {"version": "2.1.0+cu121"}})
    f = [x for x in judge(env, m) if x.code == "driver-too-old"]
    assert f and f[0].fix.startswith("install a build for an older CUDA")
    assert "cu118" in f[0].fix and "R470 is its last branch" in f[0].fix


def test_jetson_driver_numbers_are_not_compared(m) -> None:
    env = EnvSnapshot(os="Linux 6.8-tegra aarch64", driver={"version": "540.4.0"},
                      gpus=[Gpu(name="Orin")], cuda_runtimes=[Component("12.6", "system:/usr")])
    assert codes(judge(env, m)) == []


def test_findings_carry_evidence_and_source(m) -> None:
    env = EnvSnapshot(driver={"version": "550.54.15"}, gpus=[Gpu(name="NVIDIA B200")],
                      frameworks={"torch": {"version": "2.2.0+cu121"}})
    for f in judge(env, m):
        if f.severity == "error":
            assert f.evidence and f.source and f.fix
            assert "compat/" in f.source


def test_windows_drivers_use_the_windows_column(m) -> None:
    base = dict(gpus=[Gpu(name="NVIDIA GeForce RTX 4090")],
                frameworks={"torch": {"version": "2.7.1+cu128"}})
    # 570.65 is the CUDA 12.8 GA Windows driver (Linux 12.8 needs 570.26): full support
    f = judge(EnvSnapshot(os="Windows-11-10.0.26100", driver={"version": "570.65"}, **base), m)
    # only the conditions a CUDA torch has on native Windows (no NCCL, no Triton)
    assert codes(f) == ["platform-unsupported"]
    # 527.41 is the CUDA 12.0 Windows driver: 12.8 only through minor-version compatibility
    f = judge(EnvSnapshot(os="Windows-10", driver={"version": "527.41"}, **base), m)
    assert "driver-mvc" in codes(f, ("info",)) and "driver-too-old" not in codes(f)
    # CUDA 13 on Windows: no Windows driver minimum recorded -> unknown, never guessed
    env = EnvSnapshot(os="Linux 6.6.87.2-microsoft-standard-WSL2 x86_64; WSL2",
                      driver={"version": "581.15"},
                      frameworks={"torch": {"version": "2.9.0+cu130"}})
    assert codes(judge(env, m)) == ["unknown-version"]


@pytest.mark.parametrize("runtime, driver, expect", [
    # CUDA Toolkit release notes, toolkit/driver table: 8.0.44 >= 367.48, 8.0.61 GA2 >= 375.26
    ("8.0.44", "367.57", []), ("8.0.61", "367.57", ["driver-too-old"]),
    ("8.0.61", "375.26", []), ("7.5.18", "352.31", []), ("7.5.18", "346.46", ["driver-too-old"]),
    # 9.2.88 >= 396.26, 9.2.148 Update 1 >= 396.37
    ("9.2.88", "396.26", []), ("9.2.148", "396.26", ["driver-too-old"]),
])
def test_pre_cuda11_update_releases_need_their_own_driver(m, runtime, driver, expect) -> None:
    """Before CUDA 11 (no minor-version compatibility) an update release can need a newer
    driver than its GA: the runtime's full version decides, not the CUDA the driver reports."""
    env = EnvSnapshot(driver={"present": True, "version": driver},
                      gpus=[Gpu(name="Tesla K80", compute_capability="3.7")],
                      cuda_runtimes=[Component(version=runtime, source="docker image")])
    f = judge(env, m)
    assert codes(f) == expect
    if expect:
        bad = next(x for x in f if x.code == "driver-too-old")
        assert "compat/cuda.yaml" in (bad.source or "")
