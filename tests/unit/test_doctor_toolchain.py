"""nvcc's host compiler against its CUDA release (compat/toolchain.yaml) and Triton's run-time C
build, through the real `dnnctl doctor --from`."""

from __future__ import annotations

import pytest
from _doctor_helpers import doctor

UBUNTU = "os: 'Ubuntu 22.04.4 LTS; Linux 6.8.0-45-generic x86_64'\n"
NVCC_102 = "cuda_runtimes: [{version: '10.2', source: 'nvcc:/usr/local/cuda/bin/nvcc'}]\n"


def _hc(d):
    return d.of("host-compiler", "cuda")


def test_gcc_9_with_cuda_10_2_fails_with_gcc_8_and_a_newer_toolkit_as_fixes(tmp_path):
    """pytorch/pytorch#33530 (audit15 case 02) with the compiler in its field."""
    d = doctor(tmp_path, "os: Ubuntu 18.04\ngpus: [{name: NVIDIA GeForce GTX TITAN Black}]\n"
               + NVCC_102 + "frameworks: {torch: {source: source build}}\n"
               "toolchain: {gcc: 9.4.0}\n")
    [f] = _hc(d)
    assert f["severity"] == "error" and d.code == 1
    assert f["message"].startswith("gcc 9.4.0 (the gcc on PATH, nvcc's default host compiler) "
                                   "is newer than CUDA 10.2's nvcc accepts (gcc 8 or older)")
    assert "gcc versions later than 8 are not supported!" in f["message"]
    assert "`sudo apt-get install gcc-8 g++-8`" in f["fix"]
    assert "`export CC=gcc-8 CXX=g++-8 CUDAHOSTCXX=g++-8`" in f["fix"]
    assert "CUDA 11.0 or later" in f["fix"]
    assert "pytorch/pytorch#33530" in f["source"] and "toolchain.yaml" in f["source"]
    assert f["evidence"] == {"cuda": "10.2", "toolkit": "nvcc:/usr/local/cuda/bin/nvcc",
                             "compiler": "gcc 9.4.0", "accepted": "gcc 8 or older"}


@pytest.mark.parametrize(("cuda", "gcc"), [
    ("12.1.1", "12.3.0"), ("12.4.1", "13.2.0"), ("11.8.89", "11.4.0"), ("13.0.88", "15.1.0"),
    ("10.2.89", "7.5.0")])
def test_accepted_compilers_are_silent(tmp_path, cuda, gcc):
    d = doctor(tmp_path, UBUNTU + f"cuda_runtimes: [{{version: '{cuda}', source: "
               f"'system:/usr/local/cuda-{cuda[:4]}'}}]\ntoolchain: {{gcc: '{gcc}'}}\n")
    assert _hc(d) == []


def test_an_nvcc_build_number_is_no_update_and_a_split_minor_is_not_judged(tmp_path):
    """nvcc 11.4's V11.4.48 is 11.4.0: gcc 11 is refused by 11.4.0 and accepted from 11.4.1,
    and the sources disagree: unknown, never a guess."""
    d = doctor(tmp_path, UBUNTU + "cuda_runtimes: [{version: 11.4.48, source: "
               "'nvcc:/usr/local/cuda-11.4/bin/nvcc'}]\ntoolchain: {gcc: 11.4.0}\n")
    assert _hc(d) == []
    [f] = d.of("unknown-version", "cuda")
    assert "CUDA 11.4's nvcc accepts gcc 11.4.0" in f["message"]


def test_one_toolkit_accepts_it_another_does_not(tmp_path):
    d = doctor(tmp_path, UBUNTU + "cuda_runtimes:\n"
               "  - {version: 11.8.0, source: 'system:/usr/local/cuda-11.8'}\n"
               "  - {version: 12.4.1, source: 'system:/usr/local/cuda-12.4'}\n"
               "toolchain: {gcc: 13.2.0}\n")
    [f] = _hc(d)
    assert f["severity"] == "warning"
    assert "newer than CUDA 11.8's nvcc accepts (gcc 6 to 11)" in f["message"]
    assert "CUDA 12.4 accepts it" in f["message"]


def test_the_compiler_nvcc_is_pointed_at_is_judged_not_the_one_on_path(tmp_path):
    d = doctor(tmp_path, UBUNTU + NVCC_102 + "toolchain: {gcc: 11.4.0, nvcc_ccbin: "
               "{path: /usr/bin/g++-8, kind: gcc, version: 8.4.0}}\n")
    assert _hc(d) == []
    d = doctor(tmp_path, UBUNTU + NVCC_102 + "toolchain: {gcc: 11.4.0}\n"
               "environment: {CUDAHOSTCXX: g++-8}\n")
    [f] = _hc(d)
    assert f["severity"] == "warning" and "$CUDAHOSTCXX=g++-8" in f["message"]


def test_nvcc_without_any_gcc(tmp_path):
    d = doctor(tmp_path, UBUNTU + NVCC_102 + "toolchain: {gcc: false, clang: false}\n")
    [f] = _hc(d)
    assert f["severity"] == "warning" and "no gcc is on PATH" in f["message"]
    assert "`sudo apt-get install build-essential`" in f["fix"]


def test_no_toolkit_or_no_compiler_known_is_silent(tmp_path):
    assert _hc(doctor(tmp_path, UBUNTU + "toolchain: {gcc: 14.2.0}\n")) == []
    assert _hc(doctor(tmp_path, UBUNTU + NVCC_102)) == []
    # a runtime with no nvcc is no toolkit
    assert _hc(doctor(tmp_path, UBUNTU + "cuda_runtimes: [{version: '10.2', source: "
                      "'pip:nvidia-cuda-runtime-cu10'}]\ntoolchain: {gcc: 14.2.0}\n")) == []


# -- Triton's run-time C build --------------------------------------------------------------

TABBY = ("os: 'Ubuntu 24.04 LTS; Linux 6.8.0 x86_64; container'\npython: '3.12.3'\n"
         "packages: {triton: 3.3.1, torch: 2.7.1}\n")


def _tb(d):
    return d.of("triton-build", "triton")


def test_missing_python_h_under_triton(tmp_path):
    """theroyallab/tabbyAPI#453 (audit15 case 09) with the toolchain in its field."""
    d = doctor(tmp_path, TABBY + "toolchain: {gcc: 13.3.0, c_compiler: /usr/bin/gcc, "
               "python_h: false, python_include: /usr/include/python3.12}\n")
    [f] = _tb(d)
    assert f["severity"] == "error" and d.code == 1
    assert "triton 3.3.1 is installed but Python.h is not in /usr/include/python3.12" \
        in f["message"]
    assert "'fatal error: Python.h: No such file or directory'" in f["message"]
    assert f["fix"].startswith("`sudo apt-get install python3.12-dev`")
    assert "tabbyAPI PR#456" in f["source"] and "build.py" in f["source"]
    assert "– toolchain  gcc 13.3.0; C compiler /usr/bin/gcc; Python.h missing" in d.text


def test_missing_c_compiler_and_rpm_distributions(tmp_path):
    d = doctor(tmp_path, "os: 'Rocky Linux 9.4; Linux 5.14 x86_64'\npython: '3.11.7'\n"
               "packages: {pytorch-triton: 3.1.0}\ntoolchain: {gcc: false, clang: false, "
               "c_compiler: false, python_h: false, python_include: /usr/include/python3.11}\n")
    fixes = {f["fix"].split("`")[1] for f in _tb(d)}
    assert fixes == {"sudo dnf install gcc", "sudo dnf install python3.11-devel"}
    [cc] = [f for f in _tb(d) if "C compiler" in f["message"]]
    assert "'Failed to find C compiler. Please specify via CC environment variable.'" \
        in cc["message"]


def test_headers_of_a_python_outside_the_system(tmp_path):
    d = doctor(tmp_path, TABBY + "toolchain: {c_compiler: /usr/bin/gcc, python_h: false, "
               "python_include: /opt/python/3.12/include/python3.12}\n")
    [f] = _tb(d)
    assert f["fix"].startswith("reinstall the Python whose headers belong in "
                               "/opt/python/3.12/include/python3.12")


def test_triton_with_its_build_needs_met_or_unknown_is_silent(tmp_path):
    assert _tb(doctor(tmp_path, TABBY + "toolchain: {c_compiler: /usr/bin/gcc, python_h: true, "
                      "python_include: /usr/include/python3.12}\n")) == []
    assert _tb(doctor(tmp_path, TABBY)) == []
    assert _tb(doctor(tmp_path, "os: Windows 11\npackages: {triton-windows: 3.2.0}\n"
                      "toolchain: {c_compiler: false}\n")) == []
    assert _tb(doctor(tmp_path, "packages: {torch: 2.7.1}\ntoolchain: {c_compiler: false, "
                      "python_h: false}\n")) == []


WINDOWS = "os: Windows 11\n"


def _nvcc_win(cuda: str) -> str:
    return (f"cuda_runtimes: [{{version: '{cuda}', source: 'nvcc:C:/Program Files/NVIDIA GPU "
            f"Computing Toolkit/CUDA/v{cuda[:4]}/bin/nvcc.exe'}}]\n")


def test_msvc_newer_than_the_release_accepts_is_an_error_with_the_toolset_to_select(tmp_path):
    """VS 2022 17.14 (cl.exe 19.44) with CUDA 12.1, whose host_config.h stops at 1939."""
    d = doctor(tmp_path, WINDOWS + _nvcc_win("12.1") + "toolchain: {msvc: 19.44.35217}\n")
    [f] = _hc(d)
    assert f["severity"] == "error" and d.code == 1
    assert f["message"].startswith("MSVC 19.44 (_MSC_VER 1944; 19.44.35217) (cl.exe on PATH, "
                                   "nvcc's host compiler on Windows) is newer than CUDA 12.1's "
                                   "nvcc accepts (MSVC 19.10 to 19.39 (_MSC_VER 1910-1939))")
    assert "unsupported Microsoft Visual Studio version!" in f["message"]
    assert "`vcvars64.bat -vcvars_ver=14.39`" in f["fix"] and "CUDA 12.4 or later" in f["fix"]
    assert "toolchain.yaml" in f["source"] and "vcvars_ver" in f["source"]


@pytest.mark.parametrize(("cuda", "msvc"), [
    ("12.1", "14.29"), ("12.4", "VS 2022 17.14"), ("12.8", "1944"), ("13.3", "19.50"),
    ("11.8", "vs2019"), ("12.6", "v142")])
def test_accepted_msvc_in_any_spelling_is_silent(tmp_path, cuda, msvc):
    d = doctor(tmp_path, WINDOWS + _nvcc_win(cuda) + f"toolchain: {{msvc: '{msvc}'}}\n")
    assert _hc(d) == [] and d.of("unknown-version", "cuda") == []


def test_msvc_older_than_cuda_13_accepts_and_a_year_that_spans_the_edge(tmp_path):
    d = doctor(tmp_path, WINDOWS + _nvcc_win("13.0") + "toolchain: {msvc: VS 2017 15.9}\n")
    [f] = _hc(d)
    assert "is older than CUDA 13.0's nvcc accepts (MSVC 19.20 to 19.49" in f["message"]
    assert "`vcvars64.bat -vcvars_ver=14.44`" in f["fix"]  # the newest released VS 2022 toolset
    # VS 2022 is 1930-1944: CUDA 12.3 accepts up to 1939, so which update it is decides
    d = doctor(tmp_path, WINDOWS + _nvcc_win("12.3") + "toolchain: {msvc: VS 2022}\n")
    assert _hc(d) == []
    [f] = d.of("unknown-version", "cuda")
    assert "VS 2022 (MSVC _MSC_VER 1930-1949)" in f["message"]
    # the sources disagree on _MSC_VER 1950 (VS 2026 18.0) with CUDA 13.0
    d = doctor(tmp_path, WINDOWS + _nvcc_win("13.0") + "toolchain: {msvc: '14.50'}\n")
    assert _hc(d) == [] and len(d.of("unknown-version", "cuda")) == 1


def test_allow_unsupported_compiler_does_not_get_cuda_11_8_past_the_new_stl(tmp_path):
    flags = "environment: {NVCC_APPEND_FLAGS: -allow-unsupported-compiler}\n"
    d = doctor(tmp_path, WINDOWS + _nvcc_win("11.8") + "toolchain: {msvc: '19.44'}\n" + flags)
    [f] = _hc(d)
    assert f["severity"] == "error" and "STL1002" in f["message"]
    assert "microsoft/STL" in f["source"]
    d = doctor(tmp_path, WINDOWS + _nvcc_win("12.8") + "toolchain: {msvc: '19.50'}\n" + flags)
    [f] = _hc(d)
    assert f["severity"] == "warning" and "STL1002" not in f["message"]


def test_an_x_0_toolkit_is_judged(tmp_path):
    """nvcc 13.0 is the release 13.0 (a trailing .0 is no bare major)."""
    d = doctor(tmp_path, UBUNTU + "cuda_runtimes: [{version: '13.0', source: "
               "'system:/usr/local/cuda-13.0'}]\ntoolchain: {gcc: 16.1.0}\n")
    [f] = _hc(d)
    assert "newer than CUDA 13.0's nvcc accepts (gcc 6 to 15)" in f["message"]


def test_clang_18_with_cuda_12_6_is_disputed_and_clang_21_with_13_3_accepted(tmp_path):
    d = doctor(tmp_path, UBUNTU + "cuda_runtimes: [{version: 12.6.3, source: "
               "'system:/usr/local/cuda-12.6'}]\ntoolchain: {nvcc_ccbin: {path: /usr/bin/clang, "
               "kind: clang, version: 18.1.3}}\n")
    assert _hc(d) == [] and len(d.of("unknown-version", "cuda")) == 1
    d = doctor(tmp_path, UBUNTU + "cuda_runtimes: [{version: 13.3.1, source: "
               "'system:/usr/local/cuda-13.3'}]\ntoolchain: {nvcc_ccbin: {path: /usr/bin/clang, "
               "kind: clang, version: 22.1.0}}\n")
    [f] = _hc(d)
    assert "clang 21 or older" in f["message"]
