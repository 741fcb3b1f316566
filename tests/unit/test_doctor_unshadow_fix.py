"""A cuDNN on LD_LIBRARY_PATH that shadows the framework's own copy: the fix names the
directory to take off LD_LIBRARY_PATH also when the own
copy is the one in torch/lib that wheels before 1.13 carry; command lines are commands."""

from __future__ import annotations

from pathlib import Path

from dnnctl.cli.render import split_commands
from tests.unit._doctor_helpers import doctor

SNAP = """
python: "3.8"
cudnn:
  - {version: "8.0.3.33", source: "env:LD_LIBRARY_PATH", path: %s/libcudnn.so.8,
     loaded_first: true}
  - {version: "8.3.2", source: "torch wheel (torch/lib)", loaded_first: false}
frameworks:
  torch: {version: "1.12.0+cu113"}
"""

def test_shadowing_copy_offers_removing_its_directory(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % "/opt/cudnn8/lib64")
    [f] = d.of("cudnn-shadowed", "cudnn")
    assert f["severity"] == "error"
    assert f["fix"].startswith("remove /opt/cudnn8/lib64 from LD_LIBRARY_PATH")
    assert "bundled copy loads" in f["fix"] and "nvidia-cudnn" not in f["fix"]
    assert "pip install" not in d.text  # no command that installs beside the shadowing copy


def test_a_long_directory_stays_prose(tmp_path: Path) -> None:
    long = "/public/apps/cudnn/v8.0.3.33-cuda.11.0/cuda/lib64"
    d = doctor(tmp_path, SNAP % long)
    [f] = d.of("cudnn-shadowed", "cudnn")
    assert f["fix"].startswith(f"remove {long} from LD_LIBRARY_PATH")

def test_a_leading_command_ends_before_prose_after_a_comma() -> None:
    prose, commands = split_commands("pip install 'nvidia-cudnn-cu11>=8.3.2', replacing the "
                                     "copy in /opt/x")
    assert commands == ["pip install 'nvidia-cudnn-cu11>=8.3.2'"]
    assert prose == "run [1], replacing the copy in /opt/x"
    _, commands = split_commands("pip install 'torch>=2,<3' (note)")
    assert commands == ["pip install 'torch>=2,<3'"]
