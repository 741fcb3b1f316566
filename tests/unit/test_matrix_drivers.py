"""One table of driver minimums: doctor, compat check, compat suggest and compat show agree."""

from __future__ import annotations

from dnnctl import api
from dnnctl.compat.drivers import driver_need, driver_status
from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.versions import Version


def test_cu132_minimums_are_the_sourced_values() -> None:
    m = load_matrix()
    need = driver_need(m, Version.parse("13.2"))
    # CUDA release notes: Table 2 (13.x MVC floor) and Table 3 (13.2 GA bundled driver)
    assert (str(need.minimum), str(need.full), need.mvc) == ("580.65.06", "595.45.04", True)
    assert driver_status(m, Version.parse("580.65.06"), Version.parse("13.2")) == "mvc"
    assert driver_status(m, Version.parse("595.45.04"), Version.parse("13.2")) == "full"
    assert driver_status(m, Version.parse("575.57.08"), Version.parse("13.2")) == "too-old"


def test_every_query_reports_the_same_cu132_minimum() -> None:
    show = api.compat_show("torch", ["variant=cu132", "torch=2.14"])["rows"][0]
    assert (show["min_driver"], show["full_driver"]) == ("580.65.06", "595.45.04")
    sug = api.compat_suggest("H200", framework="torch")
    cu132 = [c for c in sug["combinations"] if c.get("variant") == "cu132"]
    assert cu132 and {(c["min_driver"], c["full_driver"]) for c in cu132} == {
        ("580.65.06", "595.45.04")}
    below = api.compat_check(gpu="H200", driver="575.57.08", torch="2.14.0+cu132")
    err = [f for f in below.findings if f.code == "driver-too-old"]
    assert err and "580.65.06" in err[0].message
    mvc = api.compat_check(gpu="H200", driver="580.65.06", torch="2.14.0+cu132")
    assert [f.code for f in mvc.findings if f.component == "torch"][0] == "driver-mvc"
    assert "595.45.04" in (next(f for f in mvc.findings if f.code == "driver-mvc").fix or "")


def test_gpu_minimum_raises_the_cuda_floor() -> None:
    sug = api.compat_suggest("B200", framework="torch")
    cu128 = next(c for c in sug["combinations"] if c.get("variant") == "cu128")
    # CUDA 12.x MVC floor is 525.60.13, but Blackwell itself needs R570
    assert cu128["min_driver"] == sug["gpu_min_driver"] == "570.26"


def test_windows_fixes_use_the_windows_driver_numbers() -> None:
    from dnnctl.compat.drivers import arch_min_driver
    from dnnctl.compat.suggest import best_torch_fix, torch_options
    from dnnctl.compat.versions import CC
    m = load_matrix()
    # Table 2: the CUDA 12.x floor is 525.60.13 on Linux and 527.41 on Windows
    assert str(driver_need(m, Version.parse("12.6"), windows=True).minimum) == "527.41"
    # a GPU's own minimum is the driver of the first CUDA that targets it: 12.8 for sm_120
    assert str(arch_min_driver(m, m.arch(CC(12, 0)))) == "570.26"
    assert str(arch_min_driver(m, m.arch(CC(12, 0)), windows=True)) == "570.65"
    assert arch_min_driver(m, m.arch(CC(6, 1)), windows=True) is None  # no GPU floor
    win = best_torch_fix(m, CC(6, 1), driver=None, platform=None, same_line="2.9", windows=True)
    lin = best_torch_fix(m, CC(6, 1), driver=None, platform=None, same_line="2.9")
    assert win is not None and win.endswith("whl/cu126 (with driver >= 527.41)")
    assert lin is not None and lin.endswith("whl/cu126 (with driver >= 525.60.13)")
    opts = torch_options(m, CC(12, 0), driver=Version.parse("572.16"), windows=True)
    assert opts[0].min_driver == "570.65" and opts[0].driver_ok in ("full", "mvc")
    # the CUDA 13 Windows floor is not in the matrix: unknown, not the GPU's 570.65
    cu130 = [o for o in torch_options(m, CC(12, 0), windows=True) if o.row["variant"] == "cu130"]
    assert cu130 and all(o.min_driver is None for o in cu130)
