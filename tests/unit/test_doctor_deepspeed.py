"""DeepSpeed's op builder against the CUDA toolkit here (deepspeedai/DeepSpeed-MII#277,
JIA-Lab-research/MGM#91), with the toolkit written as README's snapshot section documents."""

from __future__ import annotations

import re
from pathlib import Path

from _doctor_helpers import doctor

README = Path(__file__).resolve().parents[2] / "README.md"


def _snapshot(toolkit: str, torch: str, extra: str = "") -> str:
    return (f"schema: dnnctl-env/1\nos: Linux\ncuda_runtimes:\n  - {toolkit}\n"
            f"frameworks:\n  torch: {torch}\npackages: {{deepspeed: null{extra}}}\n")


def test_the_readme_toolkit_form_is_judged_by_deepspeeds_check(tmp_path: Path) -> None:
    m = re.search(r"e\.g\. `(\{version: \"11\.7\", source: \"nvcc:[^`]+\})`",
                  README.read_text().replace("\n", " "))
    assert m, "README no longer documents the toolkit form"
    d = doctor(tmp_path, _snapshot(m.group(1), '{cuda: "12.1"}'))
    [f] = d.of("cuda-mismatch", "deepspeed")
    assert f["severity"] == "warning" and "another major" in f["message"]
    assert "'Installed CUDA version 11.7 does not match the version torch was compiled with " \
        "12.1'" in f["message"] and "DS_SKIP_CUDA_CHECK=1" in f["message"]
    assert "\npip uninstall -y torch\n" in d.text
    assert re.search(r"\npip install 'torch==2\.\d+\.\*' -i https://download\.pytorch\.org/"
                     r"whl/cu118\n", d.text)
    assert "CUDA 12.1 toolkit and point CUDA_HOME" in f["fix"]


def test_a_toolkit_directory_and_the_torch_line_here(tmp_path: Path) -> None:
    # torch 2.1.0+cu121 with a CUDA 11.8 toolkit: the same torch line's cu118 wheel
    d = doctor(tmp_path, _snapshot('{version: "11.8.89", source: "system:/usr/local/cuda-11.8"}',
                                   '{version: "2.1.0+cu121"}'))
    [f] = d.of("cuda-mismatch", "deepspeed")
    assert "\npip install 'torch==2.1.*' -i https://download.pytorch.org/whl/cu118\n" in d.text
    assert f["severity"] == "warning"


def test_minor_differences_follow_deepspeeds_list(tmp_path: Path) -> None:
    ok = doctor(tmp_path, _snapshot('{version: "12.4", source: "nvcc:/usr/local/cuda/bin/nvcc"}',
                                    '{cuda: "12.1"}'))
    [f] = ok.of("cuda-mismatch", "deepspeed")
    assert f["severity"] == "info" and "accepts" in f["message"]
    # 12.7 is in no list (there was no CUDA 12.7): refused like another major
    bad = doctor(tmp_path, _snapshot('{version: "12.7", source: "nvcc:/opt/nvcc"}',
                                     '{cuda: "12.1"}'))
    [f] = bad.of("cuda-mismatch", "deepspeed")
    assert f["severity"] == "warning" and "minor (not in its list" in f["message"]
    same = doctor(tmp_path, _snapshot('{version: "12.1.105", source: "nvcc:/opt/nvcc"}',
                                      '{cuda: "12.1"}'))
    assert not [f for f in same.findings if f["code"] == "cuda-mismatch"]


def test_only_the_documented_sources_mark_a_toolkit(tmp_path: Path) -> None:
    # a runtime library (pip's cudart, the ld cache) is no nvcc: nothing for the op builder
    for src in ("pip:nvidia-cuda-runtime-cu11", "system:ldconfig"):
        d = doctor(tmp_path, _snapshot(f'{{version: "11.7", source: "{src}"}}',
                                       '{cuda: "12.1"}'))
        assert not d.of("cuda-mismatch", "deepspeed"), src
