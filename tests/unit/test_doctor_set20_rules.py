"""Rules from the twentieth set of real reports: a framework built against a newer cuDNN than
any copy here, an extension's arch list given as TORCH_CUDA_ARCH_LIST's one string."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

TF_MSG = ("errors: [\"cuda_dnn.cc:522] Loaded runtime CuDNN library: 9.3.0 but source was "
          "compiled with: 9.4.0.  CuDNN library needs to have matching major version and "
          "equal or higher minor version.\"]\n")


def test_no_cudnn_as_new_as_the_build_is_decided(tmp_path: Path) -> None:
    d = doctor(tmp_path, TF_MSG + 'cudnn: [{version: "9.3.0", loaded_first: true}]\n')
    [f] = d.of("error-message")
    assert f["severity"] == "error" and "no cuDNN 9.x at or above 9.4 is installed" in \
        f["message"]


def test_a_newer_copy_beside_it_leaves_the_cause_open(tmp_path: Path) -> None:
    d = doctor(tmp_path, TF_MSG + 'cudnn: [{version: "9.3.0", source: "env:LD_LIBRARY_PATH"}, '
               '{version: "9.5.1", source: "pip:nvidia-cudnn-cu12"}]\n')
    [f] = d.of("error-message")
    assert "no cuDNN 9.x at or above" not in f["message"]


@pytest.mark.parametrize("text, version", [("7103", "7.1.3"), ("90400", "9.4.0"),
                                           ("8.9.7", "8.9.7")])
def test_cudnn_versions_as_messages_print_them(text: str, version: str) -> None:
    from dnnctl.compat.versions import parse_cudnn

    assert str(parse_cudnn(text)) == version


@pytest.mark.parametrize("arch, ok", [('"7.0;8.0+PTX"', True), ('"7.0,8.0"', True),
                                      ('"8.0"', False), ('[sm_80]', False)])
def test_an_arch_list_may_be_torch_cuda_arch_list(tmp_path: Path, arch: str, ok: bool) -> None:
    d = doctor(tmp_path, 'gpus: [{name: Tesla V100, compute_capability: "7.0"}]\n'
               f'extensions: {{mmcv: {{arch_list: {arch}, built_from_source: true}}}}\n')
    assert bool(d.of("arch-unsupported", "mmcv")) is not ok
