"""paddlepaddle-gpu wheels whose Windows build pairs its CUDA with another cuDNN than the Linux
build of the same release (Paddle's windows-pip.md against linux-pip.md per release branch):
the row for the snapshot's OS judges the cuDNN, through `doctor --from`."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

WIN_CUDA = "C:/Program Files/NVIDIA GPU Computing Toolkit/CUDA/v11.2"


def _snapshot(paddle: str, cudnn: str, *, os_name: str | None, cuda: str = "11.2.152",
              folder: str = WIN_CUDA) -> str:
    text = f'os: "{os_name}"\n' if os_name else ""
    text += (f'cuda_runtimes: [{{version: "{cuda}", source: "system:{folder}"}}]\n'
             f'cudnn: [{{version: "{cudnn}", source: "system:{folder}"}}]\n')
    return text + f'packages: {{paddlepaddle-gpu: "{paddle}"}}\n'


def test_windows_cuda112_wheels_of_2_2_need_cudnn_8_2(tmp_path: Path) -> None:
    # PaddlePaddle/Paddle#37349: 2.2.0.post112 on Windows 10 with cuDNN 8.1.1 ("compiled with
    # CUDNN 8.2, but CUDNN version in your machine is 8.1")
    d = doctor(tmp_path, _snapshot("2.2.0.post112", "8.1.1", os_name="Windows 10"))
    [f] = d.of("cudnn-mismatch")
    assert d.code == 1 and f["severity"] == "error"
    assert f["evidence"] == {"cudnn_needed": "8.2.1", "cudnn_found": "8.1.1"}
    assert "Windows install page" in f["message"] and "Windows wheel" in f["message"]
    assert f["fix"].startswith(f"install cuDNN 8.2.1 for CUDA 11.x (https://developer.nvidia."
                               f"com/rdp/cudnn-archive) into {WIN_CUDA}")
    assert "apt-get" not in f["fix"] and "pip install" not in f["fix"]
    assert "release/2.2" in f["source"] and "compat/paddle.yaml" in f["source"]
    # 2.3 and 2.4's Windows pages say the same; cuDNN 8.2.1 there passes
    assert doctor(tmp_path, _snapshot("2.4.2.post112", "8.1.1", os_name="Windows 10")).code == 1
    ok = doctor(tmp_path, _snapshot("2.2.2.post112", "8.2.1", os_name="Windows 10"))
    assert ok.code == 0 and ok.codes("paddlepaddle-gpu", info=True) == {"ok"}


def test_the_same_wheel_tag_on_linux_keeps_the_linux_page(tmp_path: Path) -> None:
    # linux-pip.md of release/2.2: CUDA 11.2 with cuDNN v8.1.1
    for os_name in ("Linux x86_64", None):  # no os: the Linux rows, as every rule defaults
        d = doctor(tmp_path, _snapshot("2.2.0.post112", "8.1.1", os_name=os_name,
                                       folder="/usr/local/cuda-11.2"))
        assert d.code == 0 and d.codes("paddlepaddle-gpu", info=True) == {"ok"}, os_name
        assert "Windows" not in d.of("ok", "paddlepaddle-gpu")[0]["message"]


def test_windows_rows_hold_only_where_the_pages_differ(tmp_path: Path) -> None:
    # 2.1's Windows page still said cuDNN 8.1.1 for CUDA 11.2, like its Linux page
    d = doctor(tmp_path, _snapshot("2.1.3.post112", "8.1.1", os_name="Windows 10"))
    assert d.code == 0 and d.codes("paddlepaddle-gpu", info=True) == {"ok"}
    # 1.8's Windows page asked for cuDNN 7.3+ with CUDA 10.0 (Linux: 7.6+)
    win = doctor(tmp_path, _snapshot("1.8.4.post107", "7.4", os_name="Windows 10",
                                     cuda="10.0", folder="C:/CUDA/v10.0"))
    assert win.code == 0 and not win.of("cudnn-mismatch")  # (cuDNN 7.3's GPUs: no row)
    linux = doctor(tmp_path, _snapshot("1.8.4.post107", "7.4", os_name="Linux x86_64",
                                       cuda="10.0", folder="/usr/local/cuda-10.0"))
    assert linux.code == 1 and linux.of("cudnn-mismatch")[0]["evidence"]["cudnn_needed"] == "7.6"


def test_a_windows_fix_never_names_the_apt_package(tmp_path: Path) -> None:
    # a row with a cuDNN apt package (Linux) judged on Windows: the archive for that CUDA
    d = doctor(tmp_path, _snapshot("2.0.2.post101", "7.5", os_name="Windows 10", cuda="10.1",
                                   folder="C:/CUDA/v10.1"))
    [f] = d.of("cudnn-mismatch")
    assert f["fix"].startswith("install cuDNN 7.6 for CUDA 10.1 (https://developer.nvidia.com")
    assert "into C:/CUDA/v10.1" in f["fix"] and "apt-get" not in f["fix"]


def test_linux_cuda112_wheels_of_2_4_need_cudnn_8_2(tmp_path: Path) -> None:
    # linux-pip.md of release/2.4: 'CUDA 工具包 11.2 配合 cuDNN v8.2.1' (2.3's: v8.1.1)
    linux = "/usr/local/cuda-11.2"
    d = doctor(tmp_path, _snapshot("2.4.2.post112", "8.1.1", os_name="Linux x86_64",
                                   folder=linux))
    [f] = d.of("cudnn-mismatch")
    assert d.code == 1 and f["evidence"] == {"cudnn_needed": "8.2.1", "cudnn_found": "8.1.1"}
    assert "release/2.4" in f["source"] and "Windows" not in f["message"]
    assert f["fix"] == "`pip install 'nvidia-cudnn-cu11>=8.2,<9'`"
    ok = doctor(tmp_path, _snapshot("2.4.2.post112", "8.2.1", os_name="Linux x86_64",
                                    folder=linux))
    assert ok.code == 0 and ok.codes("paddlepaddle-gpu", info=True) == {"ok"}
    # 2.3 keeps its page's 8.1.1
    old = doctor(tmp_path, _snapshot("2.3.2.post112", "8.1.1", os_name="Linux x86_64",
                                     folder=linux))
    assert old.code == 0 and not old.of("cudnn-mismatch")


def test_2_4_knows_its_cuda_116_and_117_wheels(tmp_path: Path) -> None:
    d = doctor(tmp_path, _snapshot("2.4.2.post117", "8.3.2", os_name="Linux x86_64",
                                   cuda="11.7.99", folder="/usr/local/cuda-11.7"))
    [f] = d.of("cudnn-mismatch")
    assert f["evidence"] == {"cudnn_needed": "8.4.1", "cudnn_found": "8.3.2"}
    ok = doctor(tmp_path, _snapshot("2.4.2.post116", "8.4.0", os_name="Linux x86_64",
                                    cuda="11.6.2", folder="/usr/local/cuda-11.6"))
    assert ok.code == 0 and not ok.codes("paddlepaddle-gpu")
