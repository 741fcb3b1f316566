"""Every package that ships CUDA code is judged or said not to be (matrix table gpu_packages,
and names that say they are for CUDA): never silent."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor


def _nj(d, name: str) -> dict:
    [f] = d.of("not-judged", name)
    return f


def test_rows_say_what_the_build_is_tied_to_and_how_to_check(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Linux\npackages: {cudf-cu12: null, numba: '0.59.1', "
               "triton: null, pycuda: '2019.1.1', pandas: '2.2.0'}\n")
    cudf = _nj(d, "cudf-cu12")
    assert "one CUDA major" in cudf["message"] and "6.0" in cudf["message"]
    assert "gpus" in cudf["fix"] and "rsn0031" in cudf["source"]
    assert "numba -s" in _nj(d, "numba")["fix"]
    triton = _nj(d, "triton")
    assert "Python.h" in triton["message"] and "C compiler" in triton["fix"]
    assert "python3.X-dev" in triton["fix"] and "runtime/build.py" in triton["source"]
    pycuda = _nj(d, "pycuda")
    assert "os.add_dll_directory" in pycuda["fix"] and "bpo-36085" in pycuda["source"]
    assert not d.of("not-judged", "pandas")
    assert all(f["source"] and "compat/libraries.yaml" in f["source"]
               for f in d.of("not-judged") if f["component"] != "gpu")


def test_names_that_say_cuda_are_never_silent(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Linux\npackages: {mxnet-cu112: '1.9.1', dask-cuda: '24.2.0', "
               "paddlepaddle-gpu: null, nvidia-ml-py: '12.535.133'}\n")
    assert "a CUDA build (its name says so)" in _nj(d, "mxnet-cu112")["message"]
    assert "named for CUDA" in _nj(d, "dask-cuda")["message"]
    assert [f for f in d.findings if f["component"].startswith("paddle")]
    assert not [f for f in d.findings if "nvidia-ml-py" in f["message"]]  # no CUDA code


def test_cuda_library_wheels_are_grouped_unless_something_loads_them(tmp_path: Path) -> None:
    alone = doctor(tmp_path, "packages: {nvidia-cublas-cu12: '12.4.5.8', "
                   "nvidia-cufft-cu12: '11.2.1.3'}\n")
    [f] = alone.of("not-judged", "packages")
    assert "nvidia-cublas-cu12, nvidia-cufft-cu12" in f["message"] and "CUDA 12" in f["message"]
    with_torch = doctor(tmp_path, "driver: {version: '550.54.15'}\n"
                        "gpus: [{name: NVIDIA L4}]\n"
                        "frameworks: {torch: {version: 2.4.1+cu121}}\n"
                        "packages: {torch: 2.4.1+cu121, nvidia-cufft-cu12: '11.0.2.54'}\n")
    assert not with_torch.of("not-judged", "packages")


def test_a_package_a_rule_judged_gets_no_second_line(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Linux\ncuda_runtimes: [{version: '12.4', source: "
               "'pip:nvidia-cuda-runtime-cu12'}]\n"
               "packages: {tensorrt-cu12: '10.3.0', tensorrt-cu12-libs: '10.3.0', "
               "nvidia-cuda-runtime-cu12: '12.4.127'}\n")
    assert not [f for f in d.of("not-judged") if f["component"].startswith("tensorrt-")]
    assert not d.of("not-judged", "packages")  # the runtime wheel is a listed runtime


def test_cuda_python_judged_against_the_driver_is_not_called_unjudged(tmp_path: Path) -> None:
    d = doctor(tmp_path, "driver: {cuda: '12.0'}\npackages: {cuda-python: '12.1.0'}\n")
    assert d.of("ok", "cuda-python") and not d.of("not-judged", "cuda-python")
    nodrv = doctor(tmp_path, "packages: {cuda-python: '12.1.0'}\n")
    [f] = nodrv.of("not-judged", "cuda-python")
    assert "driver that runs CUDA 12" in f["message"]
