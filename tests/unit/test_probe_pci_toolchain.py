"""The PCI bus / kernel module flavor probe and the toolchain probe against canned /proc,
/sys and pci.ids files, canned compiler answers and a real stub compiler on PATH; a GPU's
compute mode through NVML and nvidia-smi."""

from __future__ import annotations

import sys
from pathlib import Path

from _doctor_helpers import probe_fakes

from dnnctl.doctor.host import Host
from dnnctl.doctor.probe_driver import probe_driver
from dnnctl.doctor.probe_pci import kernel_module_type, probe_pci
from dnnctl.doctor.probe_toolchain import probe_toolchain, python_include

fakes = probe_fakes()
OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Fri Aug 16 21:42:42 UTC 2024\nGCC version:  gcc version "
        "9.4.0 (Ubuntu 9.4.0-1ubuntu1~20.04.2)\n")
PROPRIETARY = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.216.03  Thu Apr  3 01:14:19 "
               "UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
PCI_IDS = ("# pci.ids excerpt\n8086  Intel Corporation\n\t1237  440FX - 82441FX PMC [Natoma]\n"
           "10de  NVIDIA Corporation\n\t1b82  GP104 [GeForce GTX 1070 Ti]\n"
           "\t1e89  TU106 [GeForce RTX 2060]\n\t\t1043 8675  (a subsystem line)\n"
           "\t10f0  GP104 High Definition Audio Controller\n10df  Emulex Corporation\n"
           "\t1ae5  LP6000 Fibre Channel Host Adapter\n")
GCC9 = ("gcc (Ubuntu 9.4.0-1ubuntu1~20.04.2) 9.4.0\nCopyright (C) 2019 Free Software "
        "Foundation, Inc.\nThis is free software; see the source for copying conditions.\n")
GPP8 = ("g++-8 (Ubuntu 8.4.0-3ubuntu2) 8.4.0\nCopyright (C) 2018 Free Software Foundation, "
        "Inc.\n")
CLANG14 = "Ubuntu clang version 14.0.0-1ubuntu1.1\nTarget: x86_64-pc-linux-gnu\n"


def _device(slot: str, vendor: str, klass: str, device: str) -> dict[str, str]:
    base = f"/sys/bus/pci/devices/{slot}"
    return {f"{base}/vendor": vendor + "\n", f"{base}/class": klass + "\n",
            f"{base}/device": device + "\n"}


BUS = {**_device("0000:00:00.0", "0x8086", "0x060000", "0x1237"),
       **_device("0000:01:00.0", "0x10de", "0x030000", "0x1e89"),
       **_device("0000:01:00.1", "0x10de", "0x040300", "0x10f0"),  # the card's audio function
       **_device("0000:02:00.0", "0x10de", "0x030000", "0x1b82")}


def test_open_module_and_both_gpus_on_the_bus_named_from_pci_ids(tmp_path: Path) -> None:
    """Both GPUs are bound to nvidia.ko (the open module binds a GPU it then refuses to run);
    the audio function of a card is no GPU."""
    drivers = {f"/sys/bus/pci/devices/{slot}/driver": fakes.Link("/sys/bus/pci/drivers/nvidia")
               for slot in ("0000:01:00.0", "0000:02:00.0")}
    host = fakes.make_host(tmp_path, files={"/proc/driver/nvidia/version": OPEN, **BUS,
                                            "/sys/bus/pci/drivers/nvidia/bind": "", **drivers,
                                            "/usr/share/misc/pci.ids": PCI_IDS})
    assert probe_pci(host) == {"kernel_module_type": "open", "pci_gpus": [
        {"slot": "0000:01:00.0", "device_id": "1e89", "name": "TU106 [GeForce RTX 2060]",
         "bound": "nvidia"},
        {"slot": "0000:02:00.0", "device_id": "1b82", "name": "GP104 [GeForce GTX 1070 Ti]",
         "bound": "nvidia"}]}


def test_proprietary_module_and_a_bus_without_pci_ids(tmp_path: Path) -> None:
    host = fakes.make_host(tmp_path, files={"/proc/driver/nvidia/version": PROPRIETARY,
                                            **_device("0000:3b:00.0", "0x10de", "0x030200",
                                                      "0x1db4")})
    assert probe_pci(host) == {"kernel_module_type": "proprietary", "pci_gpus": [
        {"slot": "0000:3b:00.0", "device_id": "1db4"}]}


def test_flavor_from_the_module_taint_when_proc_is_unreadable(tmp_path: Path) -> None:
    """A non-GPL module taints P (proprietary); the open flavor (Dual MIT/GPL) does not."""
    base = {"/sys/module/nvidia/version": "580.95.05\n"}
    assert kernel_module_type(fakes.make_host(
        tmp_path / "a", files={**base, "/sys/module/nvidia/taint": "POE\n"})) == "proprietary"
    assert kernel_module_type(fakes.make_host(
        tmp_path / "b", files={**base, "/sys/module/nvidia/taint": "OE\n"})) == "open"
    assert probe_pci(fakes.make_host(tmp_path / "c", files={})) == {}  # no module, no GPU


def _tool_host(tmp_path: Path, files: dict, commands: dict, environ: dict | None = None) -> Host:
    host = fakes.make_host(tmp_path, files=files, runner=fakes.FakeRunner(commands=commands),
                           environ={"PATH": "/usr/bin", **(environ or {})})
    for logical in files:
        if logical.startswith("/usr/bin/"):
            host.path(logical).chmod(0o755)
    return host


def test_gcc_on_path_no_clang_and_python_h_missing(tmp_path: Path) -> None:
    host = _tool_host(tmp_path, {"/usr/bin/gcc": "", "/usr/include/python3.12/pyconfig.h": ""},
                      {"gcc": GCC9})
    assert probe_toolchain(host, include="/usr/include/python3.12") == {
        "gcc": "9.4.0", "clang": False, "c_compiler": "/usr/bin/gcc",
        "python_include": "/usr/include/python3.12", "python_h": False}


def test_no_compiler_at_all_but_headers(tmp_path: Path) -> None:
    host = _tool_host(tmp_path, {"/usr/include/python3.12/Python.h": ""}, {})
    out = probe_toolchain(host, include="/usr/include/python3.12")
    assert out == {"gcc": False, "clang": False, "c_compiler": False,
                   "python_include": "/usr/include/python3.12", "python_h": True}


def test_cc_wins_for_triton_and_nvcc_profile_names_the_host_compiler(tmp_path: Path) -> None:
    """Triton takes $CC first; nvcc's compiler-bindir (nvcc.profile beside the nvcc on PATH)
    names a directory whose g++ is read; clang's version comes from its own banner."""
    host = _tool_host(tmp_path, {
        "/usr/bin/gcc": "", "/usr/bin/clang": "", "/usr/local/cuda-10.2/bin/nvcc": "",
        "/usr/bin/nvcc": fakes.Link("/usr/local/cuda-10.2/bin/nvcc"),
        "/usr/local/cuda-10.2/bin/nvcc.profile": "TOP = $(_HERE_)/..\n"
                                                  "compiler-bindir = /opt/gcc8/bin\n",
        "/opt/gcc8/bin/g++": ""}, {"gcc": GCC9, "clang": CLANG14, "g++": GPP8},
        environ={"CC": "clang"})
    out = probe_toolchain(host, include="/nowhere")
    assert out["gcc"] == "9.4.0" and out["clang"] == "14.0.0" and out["c_compiler"] == "clang"
    assert out["nvcc_ccbin"] == {"path": "/opt/gcc8/bin", "kind": "gcc", "version": "8.4.0"}
    assert out["python_h"] is False


def test_nvcc_ccbin_from_the_environment(tmp_path: Path) -> None:
    host = _tool_host(tmp_path / "a", {"/usr/bin/gcc": "", "/usr/bin/g++-8": ""},
                      {"gcc": GCC9, "g++-8": GPP8}, environ={"NVCC_CCBIN": "g++-8"})
    assert probe_toolchain(host, include="/x")["nvcc_ccbin"] == {
        "path": "g++-8", "kind": "gcc", "version": "8.4.0"}
    # conda's nvcc activation: -ccbin in NVCC_PREPEND_FLAGS wins over NVCC_CCBIN
    host = _tool_host(tmp_path / "b", {"/usr/bin/gcc": "", "/opt/conda/bin/g++-8": ""},
                      {"gcc": GCC9, "g++-8": GPP8},
                      environ={"NVCC_CCBIN": "clang", "NVCC_PREPEND_FLAGS":
                               "-ccbin=/opt/conda/bin/g++-8 -Xcompiler -fPIC"})
    assert probe_toolchain(host, include="/x")["nvcc_ccbin"] == {
        "path": "/opt/conda/bin/g++-8", "kind": "gcc", "version": "8.4.0"}


def test_a_real_stub_compiler_on_path_and_this_interpreters_headers(tmp_path: Path) -> None:
    """The real command runner against a stub ``gcc`` script; a compiler whose banner is not
    gcc's or clang's is found but of unknown version (True)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, banner in (("gcc", GCC9), ("clang", "some other compiler 1.0\n")):
        stub = bindir / name
        stub.write_text("#!/bin/sh\ncat <<'EOF'\n" + banner + "EOF\n")
        stub.chmod(0o755)
    host = Host(environ={"PATH": str(bindir)}, python=sys.executable)
    out = probe_toolchain(host)
    assert out["gcc"] == "9.4.0" and out["clang"] is True
    assert out["c_compiler"] == str(bindir / "gcc")
    assert out["python_include"] == python_include(host)
    assert isinstance(out["python_h"], bool)
    assert python_include(Host(python="/other/python3")) is None  # not this interpreter's


def test_compute_mode_through_nvml_and_nvidia_smi(tmp_path: Path) -> None:
    nvml = fakes.FakeNvml("550.90.07", 12040, [
        {"name": "Tesla V100-SXM2-16GB", "cc": (7, 0), "memory": 16 << 30, "compute_mode": 3},
        {"name": "Tesla V100-SXM2-16GB", "cc": (7, 0), "memory": 16 << 30, "compute_mode": 2},
        {"name": "Tesla V100-SXM2-16GB", "cc": (7, 0), "memory": 16 << 30}])
    host = fakes.make_host(tmp_path / "nvml", nvml=lambda: nvml)
    gpus = probe_driver(host, {}).gpus
    assert [g.compute_mode for g in gpus] == ["exclusive_process", "prohibited", None]
    smi = ("0, Tesla V100-SXM2-16GB, 7.0, 16160 MiB, 535.183.01, GPU-1a2b, Exclusive_Process\n"
           "1, Tesla V100-SXM2-16GB, 7.0, 16160 MiB, 535.183.01, GPU-3c4d, Default\n")
    host = fakes.make_host(tmp_path / "smi", files={
        "/proc/driver/nvidia/version": PROPRIETARY, "/dev/nvidia0": None,
        "/usr/lib/libcuda.so.535.183.01": None, "/usr/lib/libcuda.so.1": fakes.Link(
            "libcuda.so.535.183.01"), "/usr/bin/nvidia-smi": ""},
        runner=fakes.FakeRunner(commands={"nvidia-smi": smi}))
    host.path("/usr/bin/nvidia-smi").chmod(0o755)
    gpus = probe_driver(host, {"libcuda.so.1": ["/usr/lib/libcuda.so.1"]}).gpus
    assert [g.compute_mode for g in gpus] == ["exclusive_process", "default"]


def test_detect_puts_the_bus_the_flavor_and_the_toolchain_in_the_snapshot(tmp_path: Path) -> None:
    """End to end through detect(): a host with the open module, two GPUs on the bus (NVML
    unusable here) and a gcc; saved and loaded back unchanged."""
    from dnnctl.doctor.detect import detect
    from dnnctl.doctor.envfile import load_env, save_env

    host = _tool_host(tmp_path, {"/proc/driver/nvidia/version": OPEN, **BUS,
                                 "/usr/share/misc/pci.ids": PCI_IDS, "/usr/bin/gcc": ""},
                      {"gcc": GCC9})
    env = detect(host=host)
    assert env.driver["kernel_module_type"] == "open"
    assert [g["name"] for g in env.driver["pci_gpus"]] == ["TU106 [GeForce RTX 2060]",
                                                           "GP104 [GeForce GTX 1070 Ti]"]
    assert env.toolchain["gcc"] == "9.4.0" and env.toolchain["c_compiler"] == "/usr/bin/gcc"
    assert load_env(save_env(env, tmp_path / "env.yaml")) == env


def test_cl_exe_banner_is_the_msvc_version(tmp_path: Path) -> None:
    banner = ("Microsoft (R) C/C++ Optimizing Compiler Version 19.29.30133 for x64\n"
              "Copyright (C) Microsoft Corporation.  All rights reserved.\n")
    host = _tool_host(tmp_path, {"/usr/bin/cl.exe": ""}, {"cl.exe": banner})
    assert probe_toolchain(host, include="/x")["msvc"] == "19.29.30133"
    host = _tool_host(tmp_path / "b", {"/usr/bin/gcc": ""}, {"gcc": GCC9})
    assert "msvc" not in probe_toolchain(host, include="/x")  # no cl.exe: nothing said
