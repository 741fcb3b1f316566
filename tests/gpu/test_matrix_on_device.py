"""The matrix against a real GPU machine: what the wheels and the driver say about themselves
must agree with the rows dnnctl judges by. Run on the GPU server (e.g. the H200):
    python -m pytest tests/gpu/test_matrix_on_device.py -v -s
"""

from __future__ import annotations

import importlib.util

import pytest

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.suggest import cubin_status, reach_row
from dnnctl.compat.versions import CC, TorchVersion, Version, parse_cudnn, tag_from_cuda
from dnnctl.doctor.model import EnvSnapshot, Gpu
from dnnctl.doctor.rules import judge


@pytest.fixture(scope="module")
def m():
    return load_matrix()


def _cupy():
    import cupy
    return cupy


def test_gpu_name_and_cc_resolve(m) -> None:
    cp = _cupy()
    dev = cp.cuda.Device(0)
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    cc = CC(*map(int, dev.compute_capability))  # "90" -> 9.0
    model = m.gpu(name)
    print(f"\nGPU {name!r}: sm_{cc.major}{cc.minor}; matrix row: {model and model['model']}")
    assert model is not None, f"add {name!r} to compat/gpus.yaml"
    assert CC.parse(model["cc"]) == cc


def test_driver_supports_the_runtime_per_matrix(m) -> None:
    cp = _cupy()
    driver_cuda = cp.cuda.runtime.driverGetVersion()  # e.g. 13000
    have = Version((driver_cuda // 1000, driver_cuda % 1000 // 10))
    import pynvml

    pynvml.nvmlInit()
    drv = pynvml.nvmlSystemGetDriverVersion()
    drv = drv.decode() if isinstance(drv, bytes) else drv
    best, _ = m.driver_cuda(Version.parse(drv))
    print(f"\ndriver {drv}: reports CUDA {have}; matrix says full support up to {best}")
    assert best is not None and best == have, "compat/cuda.yaml driver rows disagree"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_installed_torch_wheel_matches_its_row(m) -> None:
    import torch

    tv = TorchVersion.parse(torch.__version__)
    variant = tv.local or tag_from_cuda(torch.version.cuda)
    row = m.torch_row(tv.line, variant)
    arch = torch.cuda.get_arch_list()
    print(f"\ntorch {torch.__version__}: get_arch_list() = {arch}; "
          f"cuDNN {torch.backends.cudnn.version()}")
    assert row is not None, f"no matrix row for torch {tv.line} {variant}"
    assert Version.parse(row["cuda"]) == Version.parse(torch.version.cuda)
    listed = set(row["arch_list"])
    disputed = set(row.get("arch_uncertain") or [])
    assert listed <= set(arch), f"matrix lists {sorted(listed - set(arch))} the wheel lacks"
    assert set(arch) <= listed | disputed, f"wheel has {sorted(set(arch) - listed)} not listed"
    loaded = parse_cudnn(torch.backends.cudnn.version())
    assert loaded.major == Version.parse(row["cudnn"]).major
    assert loaded.trunc(2) >= Version.parse(row["cudnn"]).trunc(2)
    cc = CC(*torch.cuda.get_device_capability(0))
    got, unsure, _ = reach_row(cc, row, None, arch)
    assert got == "cubin" and not unsure and cubin_status(cc, row, None) is True
    x = torch.randn(256, 256, device="cuda")
    assert torch.isfinite((x @ x).sum()).item()  # the judged code really runs


def test_this_machine_passes_judgement(m) -> None:
    """judge() on what this machine reports about itself: no error on a working server."""
    cp = _cupy()
    import pynvml

    pynvml.nvmlInit()
    drv = pynvml.nvmlSystemGetDriverVersion()
    drv = drv.decode() if isinstance(drv, bytes) else drv
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    cc = "{}.{}".format(*cp.cuda.Device(0).compute_capability)
    frameworks = {"cupy": {"version": cp.__version__,
                           "package": f"cupy-cuda{cp.cuda.runtime.runtimeGetVersion() // 1000}x",
                           "cuda": "{}.{}".format(*divmod(
                               cp.cuda.runtime.runtimeGetVersion() // 10, 100))}}
    if importlib.util.find_spec("torch") is not None:
        import torch
        frameworks["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                               "arch_list": torch.cuda.get_arch_list()}
    env = EnvSnapshot(driver={"present": True, "version": drv},
                      gpus=[Gpu(0, name, cc)], frameworks=frameworks)
    findings = judge(env, m)
    for f in findings:
        print(f"  {f.severity:7} {f.code:16} {f.message}")
    assert not [f for f in findings if f.severity == "error"]
