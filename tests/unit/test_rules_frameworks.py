"""Framework rules and the suggestions behind every fix."""

from __future__ import annotations

import pytest

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.queries import suggest
from dnnctl.compat.suggest import best_torch_fix, torch_options
from dnnctl.compat.versions import CC, Version, parse_arch_list
from dnnctl.doctor.model import Component, EnvSnapshot, Gpu
from dnnctl.doctor.rules import judge
from dnnctl.errors import UsageError


@pytest.fixture(scope="module")
def m():
    return load_matrix()


def codes(findings, severities=("error", "warning")):
    return sorted({f.code for f in findings if f.severity in severities})


def _has_cubin(row, cc: CC, key: str = "arch_list") -> bool:
    return any(not t.ptx and t.runs_on(cc) for t in parse_arch_list(list(row[key])))


def test_suggest_b200_only_builds_with_sm100_code(m) -> None:
    data = suggest(m, "B200")
    torch = [c for c in data["combinations"] if c["framework"] == "torch"]
    assert torch and data["compute_capability"] == "10.0"
    for c in torch:
        row = m.torch_row(c["version"].rstrip(".*"), c["variant"])
        assert "sm_100" in row["arch_list"], c
        assert c["variant"] not in ("cu118", "cu121", "cu124", "cu126")
    assert torch[0]["version"] == "2.15.*"  # newest first
    assert not [c for c in data["combinations"] if c["framework"] == "tensorflow"]
    assert all(c["code"] == "ptx" for c in data["ptx_only"])


def test_suggest_rtx5090_never_cu126_and_respects_driver(m) -> None:
    data = suggest(m, "NVIDIA GeForce RTX 5090", framework="torch", driver="575.57.08")
    variants = {c["variant"] for c in data["combinations"]}
    assert "cu126" not in variants and "cu128" in variants
    first = data["combinations"][0]
    assert first["driver"] in ("full", "mvc") and first["variant"] in ("cu128", "cu129")
    low = suggest(m, "RTX 5090", framework="torch", driver="550.54.15")
    assert any("too old for Blackwell" in n for n in low["notes"])
    assert all(c["driver"] == "too-old" for c in low["combinations"])


def test_suggest_v100_knows_which_lines_dropped_volta(m) -> None:
    data = suggest(m, "V100", framework="torch")
    notes = " | ".join(data["notes"])
    assert "cu128: torch 2.11 dropped sm_70" in notes
    assert "cu130: never had code for sm_70" in notes
    assert "torch 2.8 is uncertain for sm_70" in notes
    pairs = {(c["version"], c["variant"]) for c in data["combinations"]}
    assert ("2.14.*", "cu126") in pairs and ("2.10.*", "cu128") in pairs
    assert ("2.11.*", "cu128") not in pairs and ("2.8.*", "cu128") not in pairs


def test_suggest_family_and_aarch64(m) -> None:
    b300 = suggest(m, "B300", framework="torch")
    assert b300["combinations"] and all(
        _has_cubin(m.torch_row(c["version"].rstrip(".*"), c["variant"]), CC(10, 3))
        for c in b300["combinations"])
    gb10 = suggest(m, "GB10", framework="torch")
    assert gb10["platform"] == "aarch64"
    for c in gb10["combinations"]:
        row = m.torch_row(c["version"].rstrip(".*"), c["variant"])
        assert _has_cubin(row, CC(12, 1), "arch_list_aarch64"), c
    assert {c["variant"] for c in gb10["combinations"]} <= {"cu130", "cu132"}


def test_suggest_rejects_unknown_gpu(m) -> None:
    with pytest.raises(UsageError, match="not in the matrix"):
        suggest(m, "Quantum Z9000")
    assert suggest(m, "sm_90")["compute_capability"] == "9.0"


def test_best_fix_prefers_same_line_and_working_driver(m) -> None:
    fix = best_torch_fix(m, CC(7, 0), driver=Version.parse("570.124.06"), platform=None,
                         same_line="2.11")
    assert fix == "pip install 'torch==2.11.*' --index-url https://download.pytorch.org/whl/cu126"
    opts = torch_options(m, CC(12, 0), driver=Version.parse("570.124.06"))
    assert opts[0].driver_ok == "full" and opts[0].row["variant"] == "cu128"


def test_torch_fills_arch_and_cudnn_from_matrix(m) -> None:
    env = EnvSnapshot(driver={"version": "580.65.06"}, gpus=[Gpu(name="NVIDIA H100 PCIe")],
                      frameworks={"torch": {"version": "2.8.0"}})  # PyPI default: cu128
    f = judge(env, m)
    assert codes(f) == [] and "ok" in codes(f, ("info",))


def test_torch_unknowns_and_odd_builds(m) -> None:
    gpu = [Gpu(name="NVIDIA L4")]
    f = judge(EnvSnapshot(gpus=gpu, frameworks={"torch": {"version": "2.7.0+cu121"}}), m)
    assert codes(f) == ["unknown-version"] and "no cu121 wheel" in f[-1].message
    f = judge(EnvSnapshot(gpus=gpu, frameworks={"torch": {"version": "2.16.0.dev20261101"}}), m)
    assert codes(f) == ["unknown-version"] and "2.16" in f[-1].message
    f = judge(EnvSnapshot(gpus=gpu, frameworks={"torch": {"version": "2.14.0"}}), m)
    assert codes(f) == [] and "cu132" in f[-1].message  # PyPI's default for 2.14 is CUDA 13.2
    f = judge(EnvSnapshot(gpus=gpu, frameworks={"torch": {"version": "2.5.1+cpu"}}), m)
    assert codes(f) == ["cuda-mismatch"] and "CPU-only" in f[-1].message
    f = judge(EnvSnapshot(gpus=gpu, frameworks={"torch": {"version": "2.5.1+rocm6.2"}}), m)
    assert codes(f) == ["cuda-mismatch"]


def test_detected_arch_list_overrides_the_matrix(m) -> None:
    env = EnvSnapshot(gpus=[Gpu(name="NVIDIA B200")], frameworks={"torch": {
        "version": "2.2.0+cu121", "arch_list": ["sm_80", "sm_90", "sm_100"]}})
    assert "arch-unsupported" not in codes(judge(env, m))


def test_tensorflow_uncertain_row_and_conflicting_packages(m) -> None:
    f = judge(EnvSnapshot(frameworks={"tensorflow": {"version": "2.21.0"}}), m)
    assert codes(f) == ["no-gpu", "unknown-version"]  # no hardware named: never a pass
    env = EnvSnapshot(packages={"tensorflow": "2.17.0", "tensorflow-cpu": "2.17.0"})
    f = [x for x in judge(env, m) if x.code != "no-gpu"]
    [dup] = [x for x in f if x.code == "duplicate-package"]
    assert codes(f) == ["duplicate-package"] and "tensorflow-cpu" in dup.message
    # listed only in packages, tensorflow is still judged as the framework
    assert any(x.component == "tensorflow" and x.code == "ok" for x in f)


def test_jax_plugin_choice(m) -> None:
    f = judge(EnvSnapshot(frameworks={"jax": {"version": "0.9.0"}}), m)
    assert codes(f) == ["no-gpu", "unknown-version"]  # cuda12 or cuda13 plugin: unknown
    env = EnvSnapshot(gpus=[Gpu(name="Tesla V100-SXM2-16GB")], driver={"version": "580.65.06"},
                      frameworks={"jax": {"version": "0.9.0", "plugin": "jax-cuda13-plugin"}})
    assert codes(judge(env, m)) == ["arch-unsupported"]  # cuda13 builds start at sm_75


def test_cupy_duplicates_from_framework_record(m) -> None:
    env = EnvSnapshot(frameworks={"cupy": {"version": "13.6.0", "package": "cupy-cuda12x",
                                           "packages": ["cupy-cuda11x", "cupy-cuda12x"]}})
    assert "duplicate-package" in codes(judge(env, m))


def test_cupy_cuda13_cannot_target_volta(m) -> None:
    env = EnvSnapshot(driver={"version": "580.65.06"}, gpus=[Gpu(name="Tesla V100-PCIE-16GB")],
                      frameworks={"cupy": {"version": "14.2.0", "package": "cupy-cuda13x"}})
    f = judge(env, m)
    assert codes(f) == ["arch-unsupported"] and "cupy-cuda12x" in f[-1].fix


def test_cudnn_wrong_major_for_framework(m) -> None:
    env = EnvSnapshot(cudnn=[Component("8.9.7", "system:ldconfig", loaded_first=True)],
                      frameworks={"tensorflow": {"version": "2.18.0"}})
    f = judge(env, m)
    assert "cudnn-mismatch" in codes(f) and "9.x" in " ".join(x.message for x in f)


H100 = [Gpu(name="NVIDIA H100 80GB HBM3")]


def test_jax_major_only_cuda_is_judged_by_its_major(m) -> None:
    plugin = {"version": "0.6.0", "plugin": "jax-cuda12-plugin"}
    env = EnvSnapshot(driver={"version": "570.124.06"}, gpus=H100,
                      frameworks={"jax": {**plugin, "cuda": "12"}})
    assert codes(judge(env, m)) == []  # "12" is some 12.x, not 12.0 < 12.1
    env.frameworks["jax"]["cuda"] = "11"
    assert "cuda-mismatch" in codes(judge(env, m))
    # a full runtime version found next to it is judged before the build's major
    env = EnvSnapshot(driver={"version": "570.124.06"}, gpus=H100,
                      cuda_runtimes=[Component("12.0.140", "pip:nvidia-cuda-runtime-cu12")],
                      frameworks={"jax": {**plugin, "cuda": "12"}})
    f = judge(env, m)
    assert codes(f) == ["cuda-mismatch"] and "the runtime is 12.0.140" in f[-1].message


def test_jax_build_cudnn_is_the_minimum_not_the_loaded_copy(m) -> None:
    # jaxlib +cuda11.cudnn86: built with 8.6, so 8.6.x works (the cuda11_pip extra's 8.8 is
    # another build's minimum) and 8.5 fails; "cudnn" is never read as the loaded copy
    jax = {"version": "0.4.13", "jaxlib": "0.4.13+cuda11.cudnn86", "cuda": "11", "cudnn": "8.6"}
    ok = EnvSnapshot(cuda_runtimes=[Component("11.8")], frameworks={"jax": jax},
                     cudnn=[Component("8.6.0", "system:ldconfig", loaded_first=True)])
    assert codes(judge(ok, m)) == ["no-gpu"]
    old = EnvSnapshot(cuda_runtimes=[Component("11.8")], frameworks={"jax": jax},
                      cudnn=[Component("8.5.0", "system:ldconfig", loaded_first=True)])
    f = [x for x in judge(old, m) if x.code == "cudnn-mismatch"]
    assert f and "built against cuDNN 8.6" in f[0].message and "8.5.0 loads" in f[0].message
    assert "jax-ml/jax#15268" in f[0].source
    # a conda-forge build compiled with 9.13.1 (jaxlib-feedstock#329) on 9.10.1 fails, though
    # the pip plugin's row minimum is 9.8
    conda = {"version": "0.7.2", "plugin": "jax-cuda12-plugin", "cudnn": "9.13.1",
             "cudnn_runtime": "9.10.1"}
    assert "cudnn-mismatch" in codes(judge(EnvSnapshot(frameworks={"jax": conda}), m))


def test_cupy_wheel_name_gives_only_the_major(m) -> None:
    cupy = {"version": "13.3.0", "package": "cupy-cuda11x", "cuda": "11"}
    env = EnvSnapshot(driver={"version": "535.104.05"}, gpus=[Gpu(name="NVIDIA A100-SXM4-40GB")],
                      frameworks={"cupy": cupy})
    assert codes(judge(env, m)) == []  # cupy-cuda11x covers 11.2-11.8: "11" is not 11.0
    env.gpus = H100  # sm_90 needs CUDA >= 11.8 components, and the minor is unknown
    f = judge(env, m)
    assert codes(f) == ["unknown-version"] and "11.8" in f[-1].message


def test_cudnn8_copies_mix_but_cudnn9_newer_is_compatible(m) -> None:
    def env(system: str, bundled: str, major: int = 8, torch: str = "2.2.0") -> EnvSnapshot:
        return EnvSnapshot(cudnn=[
            Component(system, "env:LD_LIBRARY_PATH", "/usr/local/cuda/lib64/libcudnn.so."
                      f"{major}", loaded_first=True),
            Component(bundled, "pip:nvidia-cudnn-cu12", loaded_first=False)],
            frameworks={"torch": {"version": torch}})
    # pytorch/pytorch#119989: 8.9.4 on LD_LIBRARY_PATH before torch 2.2's own 8.9.2.26
    f = [x for x in judge(env("8.9.4", "8.9.2.26"), m) if x.code == "cudnn-shadowed"]
    assert f and f[0].severity == "error" and "sub-libraries" in f[0].message
    assert "LD_LIBRARY_PATH" in f[0].fix and "pytorch/pytorch#119989" in f[0].source
    same = [x for x in judge(env("8.9.2", "8.9.2.26"), m) if x.code == "cudnn-shadowed"]
    assert [x.severity for x in same] == ["info"]  # the same release: nothing mixes
    nine = [x for x in judge(env("9.5.1", "9.1.0.70", 9, "2.4.1+cu121"), m)
            if x.code == "cudnn-shadowed"]
    assert [x.severity for x in nine] == ["info"]  # cuDNN 9 loads its own sub-libraries
