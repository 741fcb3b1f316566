"""Every fix command suits the snapshot's operating system: no apt, sudo, bash export or
/usr/local path on native Windows (NVIDIA's installer, conda, PowerShell instead), the
WSL-Ubuntu toolkit package inside WSL 2 (never a Linux driver), and no install at all on
macOS, which has no CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

# PaddlePaddle/Paddle#56908 (audit 12, case 12): Windows 11, an RTX 2050 (Ampere, sm_86) and a
# CUDA 10.2 install; here with the toolkit's folder named, as detection writes it
CASE12 = ("os: Windows 11\npython: '3.11'\n"
          "gpus: [{name: NVIDIA GeForce RTX 2050, compute_capability: '8.6'}]\n")
TOOLKIT_102 = "cuda_runtimes: [{version: '10.2', source: '%s'}]\n"
WIN_DIR = "system:C:/Program Files/NVIDIA GPU Computing Toolkit/CUDA/v10.2"
POSIX_ONLY = ("sudo ", "apt-get ", "apt ", "export ", "/usr/local/", "unset ")


def _commands(text: str) -> list[str]:
    if "commands (one per line):" not in text:
        return []
    block = text.split("commands (one per line):")[1].split("probe notes:")[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_a_windows_toolkit_fix_is_the_installer_or_conda(tmp_path: Path) -> None:
    got = doctor(tmp_path, CASE12 + TOOLKIT_102 % WIN_DIR)
    [f] = got.of("cuda-mismatch", "cuda")
    assert "apt" not in f["fix"] and "/usr/local" not in f["fix"]
    assert "installer for Windows" in f["fix"] and "cuda-toolkit-archive" in f["fix"]
    assert "\\bin\\nvcc.exe" in f["fix"]
    cmds = _commands(got.text)
    assert cmds and all(c.startswith("conda install cuda -c nvidia/label/cuda-") for c in cmds)


def test_wsl2_gets_the_toolkit_package_never_a_driver(tmp_path: Path) -> None:
    got = doctor(tmp_path, CASE12.replace("Windows 11", "Ubuntu 22.04 (WSL 2)")
                 + TOOLKIT_102 % "nvcc:/usr/local/cuda-10.2/bin/nvcc")
    [f] = got.of("cuda-mismatch", "cuda")
    assert "WSL-Ubuntu" in f["fix"] and "cuda-drivers" in f["fix"]
    [cmd] = _commands(got.text)
    assert cmd.startswith("sudo apt-get install cuda-toolkit-")


def test_macos_gets_no_install_command(tmp_path: Path) -> None:
    got = doctor(tmp_path, CASE12.replace("Windows 11", "macOS 14.5")
                 + TOOLKIT_102 % "nvcc:/Developer/NVIDIA/CUDA-10.2/bin/nvcc")
    [f] = got.of("cuda-mismatch", "cuda")
    assert f["fix"].startswith("macOS has no CUDA") and not _commands(got.text)


@pytest.mark.parametrize("os_line", ["os: Ubuntu 22.04\n", ""])
def test_linux_and_unknown_os_keep_the_apt_toolkit(tmp_path: Path, os_line: str) -> None:
    got = doctor(tmp_path, os_line + "gpus: [{name: NVIDIA GeForce RTX 3060}]\n"
                 + TOOLKIT_102 % "nvcc:/usr/local/cuda/bin/nvcc")
    [cmd] = _commands(got.text)
    assert cmd.startswith("sudo apt-get install cuda-toolkit-")
    assert "NVIDIA's CUDA apt repository" in got.of("cuda-mismatch", "cuda")[0]["fix"]


def test_a_missing_driver_on_windows_is_the_windows_driver(tmp_path: Path) -> None:
    got = doctor(tmp_path, "os: Windows 10\ndriver: {present: false}\n")
    [f] = got.of("no-driver", "driver")
    assert "nvidia.com/Download" in f["fix"] and "apt" not in f["fix"]
    assert not _commands(got.text)
    mac = doctor(tmp_path, "os: macOS 13\ndriver: {present: false}\n")
    assert mac.of("no-driver")[0]["fix"].startswith("macOS has no CUDA")
    linux = doctor(tmp_path, "os: Ubuntu 24.04\ndriver: {present: false}\n")
    assert "sudo apt install nvidia-driver-580" in _commands(linux.text)


WINDOWS_SNAPSHOTS = [
    # a toolkit that cannot target the GPU (Paddle#56908)
    CASE12 + TOOLKIT_102 % WIN_DIR,
    # llama-cpp-python built by a toolkit older than llama.cpp tests with
    "os: Windows 11\ngpus: [{name: NVIDIA GeForce RTX 3060}]\ndriver: {version: '552.22'}\n"
    "cuda_runtimes: [{version: '11.4', source: 'nvcc:C:/CUDA/v11.4/bin/nvcc.exe'}]\n"
    "frameworks: {llama-cpp-python: {version: 0.2.90, cuda_build: true}}\n",
    # a TensorFlow whose CUDA runtime is not installed
    "os: Windows 10\ngpus: [{name: NVIDIA GeForce RTX 3060}]\ndriver: {version: '552.22'}\n"
    "cuda_runtimes: [{version: '12.4', source: 'system:C:/CUDA/v12.4'}]\n"
    "frameworks: {tensorflow: {version: '2.10.0'}}\n",
    # tfjs-node-gpu's libtensorflow needs CUDA 11
    "os: Windows 10\ngpus: [{name: NVIDIA GeForce RTX 3060}]\n"
    "cuda_runtimes: [{version: '12.3', source: 'system:C:/CUDA/v12.3'}]\n"
    "packages: {'@tensorflow/tfjs-node-gpu': 4.22.0}\n",
    # two cuDNN 8 copies, the older found first
    "os: Windows 10\ncudnn: [{version: 8.2.1, source: 'system:C:/cudnn82', path: "
    "'C:\\cudnn82\\bin\\cudnn64_8.dll', loaded_first: true}, {version: 8.9.7, source: "
    "'system:C:/cudnn89', path: 'C:\\cudnn89\\bin\\cudnn64_8.dll'}]\n",
    # MIG devices (a fix that sets CUDA_VISIBLE_DEVICES)
    "os: Windows Server 2022\ndriver: {version: '551.78'}\n"
    "gpus: [{name: NVIDIA A100-SXM4-80GB MIG 3g.40gb, uuid: MIG-aaaa}, "
    "{name: NVIDIA A100-SXM4-80GB MIG 3g.40gb, uuid: MIG-bbbb}]\n",
]


@pytest.mark.parametrize("text", WINDOWS_SNAPSHOTS)
def test_no_posix_command_on_native_windows(tmp_path: Path, text: str) -> None:
    got = doctor(tmp_path, text)
    fixes = [f["fix"] for f in got.findings if f["fix"]]
    assert fixes, got.text
    for cmd in _commands(got.text):
        assert not cmd.startswith(POSIX_ONLY) and "/usr/local" not in cmd, cmd
    for fix in fixes:
        assert "apt-get" not in fix and "/usr/local" not in fix and "`export " not in fix, fix


def test_windows_library_path_is_path(tmp_path: Path) -> None:
    got = doctor(tmp_path, WINDOWS_SNAPSHOTS[4])
    [f] = got.of("library-copies", "cudnn")
    assert '$env:PATH="C:\\cudnn89\\bin;$env:PATH"' in f["fix"]
    assert '$env:PATH="C:\\cudnn89\\bin;$env:PATH"' in _commands(got.text)


def test_windows_rebuild_sets_its_variables_in_powershell(tmp_path: Path) -> None:
    got = doctor(tmp_path, WINDOWS_SNAPSHOTS[1])
    cmds = _commands(got.text)
    assert any(c.startswith('$env:CMAKE_ARGS="-DGGML_CUDA=on') for c in cmds), cmds
    assert any(c.startswith('$env:CUDACXX="$env:CUDA_PATH_V') and c.endswith('nvcc.exe"')
               for c in cmds), cmds
