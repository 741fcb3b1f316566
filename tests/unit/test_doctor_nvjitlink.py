"""nvJitLink copies: the one cuSPARSE loads must be at least as new as cuSPARSE's CUDA release
(jax-ml/jax#28929, pytorch/pytorch#134929, NVIDIA/cuvs#1794), judged through `doctor --from`."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.versions import Version

TOOLKIT = "/home/common_modules/cuda/cuda-12.1/lib64/libnvJitLink.so.12"


def _snapshot(copies: list[str], packages: str) -> str:
    return ("schema: dnnctl-env/1\nos: Linux\ndriver: {version: 570.124.06}\n"
            "gpus: [{name: NVIDIA H100 80GB HBM3}]\nlibraries:\n  nvjitlink:\n"
            + "".join(f"    - {c}\n" for c in copies)
            + 'frameworks:\n  jax: {version: "0.6.1", jaxlib: "0.6.1", plugin: '
            'jax-cuda12-plugin, plugin_version: "0.6.1"}\n'
            f"packages: {{jax: 0.6.1, jaxlib: 0.6.1, jax-cuda12-plugin: 0.6.1{packages}}}\n")


ENV_121 = f'{{version: "12.1.105", source: "env:LD_LIBRARY_PATH", path: "{TOOLKIT}"}}'
PIP_129 = '{version: "12.9.41", source: "pip:nvidia-nvjitlink-cu12"}'
CUSPARSE_129 = ", nvidia-cusparse-cu12: 12.5.9.5, nvidia-nvjitlink-cu12: 12.9.41"


def _doctor(tmp_path: Path, text: str) -> tuple[int, str, list[tuple[str, str, str]], dict]:
    d = doctor(tmp_path, text)
    nv = [(f["severity"], f["code"], f["fix"] or "") for f in d.findings
          if f["component"] == "nvjitlink"]
    return d.code, d.text, nv, d.data


def test_an_older_toolkit_copy_on_ld_library_path_breaks_pip_cusparse(tmp_path: Path) -> None:
    code, out, nv, data = _doctor(tmp_path, _snapshot([ENV_121, PIP_129], CUSPARSE_129))
    assert code == 1 and data["verdict"] == "fail"
    assert [(s, c) for s, c, _ in nv] == [("error", "library-shadowed")]
    assert "remove /home/common_modules/cuda/cuda-12.1/lib64 from LD_LIBRARY_PATH" in nv[0][2]
    found = next(f for f in data["findings"] if f["component"] == "nvjitlink")
    assert found["evidence"]["needed_min"] == "12.9"
    assert "nvidia-cusparse-cu12 12.5.9.5" in found["message"]
    assert "nvjitlink/index.html#compatibility" in found["source"]
    assert "✗ nvjitlink" in out and "[library-shadowed]" in out


def test_a_copy_new_enough_for_cusparse_only_gets_a_note(tmp_path: Path) -> None:
    newer = f'{{version: "12.9.86", source: "env:LD_LIBRARY_PATH", path: "{TOOLKIT}"}}'
    code, _, nv, data = _doctor(tmp_path, _snapshot([newer, PIP_129], CUSPARSE_129))
    assert code == 0 and nv == [("info", "library-shadowed", "")]
    # the same minor, another patch: nvJitLink's symbols are versioned per CUDA minor
    same = f'{{version: "12.9", source: "env:LD_LIBRARY_PATH", path: "{TOOLKIT}"}}'
    assert _doctor(tmp_path, _snapshot([same, PIP_129], CUSPARSE_129))[2][0][0] == "info"


def test_only_the_wheels_copy_is_fine(tmp_path: Path) -> None:
    code, _, nv, _ = _doctor(tmp_path, _snapshot([PIP_129], CUSPARSE_129))
    assert code == 0 and nv == []


def test_detected_order_wins_over_the_path_rule(tmp_path: Path) -> None:
    # detection says the pip copy loads first (the toolkit copy is only in ldconfig's cache)
    system = f'{{version: "12.1.105", source: "system:ldconfig", path: "{TOOLKIT}", ' \
             "loaded_first: false}"
    pip = '{version: "12.9.41", source: "pip:nvidia-nvjitlink-cu12", loaded_first: true}'
    assert _doctor(tmp_path, _snapshot([system, pip], CUSPARSE_129))[2] == []
    conda = '{version: "12.3.101", source: "conda:/opt/conda", path: ' \
            '"/opt/conda/lib/libnvJitLink.so.12", loaded_first: true}'
    # pytorch/pytorch#134929: torch 2.5's cuSPARSE (CUDA 12.4) with conda's older copy first
    nv = _doctor(tmp_path, _snapshot([conda, pip], ", nvidia-cusparse-cu12: 12.3.1.170"))[2]
    assert nv[0][:2] == ("error", "library-shadowed") and "/opt/conda/lib" in nv[0][2]


def test_a_pip_nvjitlink_older_than_pip_cusparse(tmp_path: Path) -> None:
    old = '{version: "12.4.127", source: "pip:nvidia-nvjitlink-cu12"}'
    code, _, nv, _ = _doctor(tmp_path, _snapshot([old], CUSPARSE_129.replace("12.9.41",
                                                                             "12.4.127")))
    assert code == 1 and nv == [("error", "cuda-mismatch",
                                 "pip install -U 'nvidia-nvjitlink-cu12>=12.9'")]


def test_without_cusparse_versions_an_older_copy_is_a_warning(tmp_path: Path) -> None:
    code, _, nv, _ = _doctor(tmp_path, _snapshot([ENV_121, PIP_129], ""))
    assert code == 0 and [(s, c) for s, c, _ in nv] == [("warning", "library-shadowed")]
    newer = f'{{version: "12.9.86", source: "env:LD_LIBRARY_PATH", path: "{TOOLKIT}"}}'
    assert _doctor(tmp_path, _snapshot([newer, PIP_129], ""))[2] == []


def test_cusparse_versions_map_to_their_cuda_release() -> None:
    m = load_matrix()
    got = {v: (r["cuda"] if (r := m.cusparse_cuda(Version.parse(v))) else None)
           for v in ("12.0.0.76", "12.3.1.170", "12.5.4.2", "12.5.9.5", "12.6.3.3", "11.7.5.86")}
    assert got == {"12.0.0.76": "12.0", "12.3.1.170": "12.4", "12.5.4.2": "12.6",
                   "12.5.9.5": "12.9", "12.6.3.3": "13.0", "11.7.5.86": None}
