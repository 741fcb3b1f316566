"""CTranslate2 wheels (faster-whisper, whisperX) against the cuDNN installed beside them
(m-bain/whisperX#1158, SYSTRAN/faster-whisper#1086), judged through `doctor --from`."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

from dnnctl.doctor.probe_python import relevant

H100 = "driver: {version: 570.124.06}\ngpus: [{name: NVIDIA H100 80GB HBM3}]\n"


def _snapshot(ct2: str, cudnn: str | None, torch: str = "2.5.1", os: str = "Linux",
              extra: str = "") -> str:
    text = f"schema: dnnctl-env/1\nos: {os}\n{H100}"
    if cudnn:
        text += f'cudnn: [{{version: "{cudnn}", source: "pip:nvidia-cudnn-cu12"}}]\n'
    text += f'frameworks: {{torch: {{version: "{torch}"}}}}\n{extra}'
    return text + (f'packages: {{torch: "{torch}", ctranslate2: "{ct2}", faster-whisper: '
                   f'"1.1.0"}}\n')


def _doctor(tmp_path: Path, text: str) -> tuple[int, str, list[tuple[str, str, str]]]:
    d = doctor(tmp_path, text)
    ct2 = [(f["severity"], f["code"], f["fix"] or "") for f in d.findings
           if f["component"] == "ctranslate2"]
    return d.code, d.text, ct2


def test_a_cudnn8_wheel_beside_torchs_cudnn9_fails(tmp_path: Path) -> None:
    code, out, ct2 = _doctor(tmp_path, _snapshot("4.4.0", "9.1.0.70"))
    assert code == 1 and ct2 == [("error", "cudnn-mismatch", "pip install 'ctranslate2>=4.5'")]
    assert "libcudnn_ops_infer.so.8" in out and "faster-whisper 1.1.0" in out
    assert "✗ ctranslate2" in out  # the component name is not cut to the column


def test_a_cudnn9_wheel_beside_a_cudnn8_torch_fails_the_other_way(tmp_path: Path) -> None:
    # torch 2.3.1 pins nvidia-cudnn-cu12 8.9.2.26 (faster-whisper#1086: torch <2.4 -> ct2 <4.5)
    code, out, ct2 = _doctor(tmp_path, _snapshot("4.5.0", "8.9.2.26", torch="2.3.1"))
    assert code == 1 and ct2 == [(
        "error", "cudnn-mismatch", "`pip install 'ctranslate2>=4.0,<4.5'` (built for the cuDNN 8 "
        "here), or a torch that bundles cuDNN 9: `pip install 'torch>=2.4' --index-url "
        "https://download.pytorch.org/whl/cu121`")]
    assert "libcudnn_cnn.so.9" in out


def test_matching_majors_and_wheels_without_cudnn_pass(tmp_path: Path) -> None:
    for ct2, cudnn, torch in (("4.5.0", "9.1.0.70", "2.5.1"), ("4.4.0", "8.9.2.26", "2.3.1"),
                              ("4.6.3", "8.9.2.26", "2.3.1"), ("4.8.1", "9.10.2.21", "2.8.0")):
        code, _, found = _doctor(tmp_path, _snapshot(ct2, cudnn, torch=torch))
        assert code == 0 and [(s, c) for s, c, _ in found] == [("info", "ok")], ct2


def test_a_release_newer_than_the_matrix_is_said_not_judged(tmp_path: Path) -> None:
    code, _, ct2 = _doctor(tmp_path, _snapshot("4.8.5", "8.9.2.26", torch="2.3.1"))
    assert code == 0 and [(s, c) for s, c, _ in ct2] == [("info", "ok")]


def test_cpu_only_wheels_and_unknown_cudnn(tmp_path: Path) -> None:
    mac = _snapshot("4.4.0", "9.1.0.70", os="Darwin 23.1.0 arm64").replace(H100, "")
    assert _doctor(tmp_path, mac)[2] == []
    # no cuDNN copy and no torch: the wheel's need is a conditional warning, never a pass
    bare = _snapshot("4.4.0", None).replace('{torch: {version: "2.5.1"}}', "{}") \
        .replace('torch: "2.5.1", ', "")
    code, out, ct2 = _doctor(tmp_path, bare)
    assert code == 0 and ct2 == [(
        "warning", "not-judged", "if the cuDNN here is not 8: install it (`pip install "
        "'nvidia-cudnn-cu12==8.*'`), or with cuDNN 9: `pip install 'ctranslate2>=4.5'` "
        "(the releases built for it)")]
    assert "\npip install 'nvidia-cudnn-cu12==8.*'\n" in out


def test_a_torch_listed_only_in_packages_brings_its_wheels_cudnn(tmp_path: Path) -> None:
    # faster-whisper#1086: `pip install torch==2.3.1` (cuDNN 8.9.2.26) beside ctranslate2 4.5.0
    snap = _snapshot("4.5.0", None, torch="2.3.1").replace('{torch: {version: "2.3.1"}}', "{}")
    code, out, ct2 = _doctor(tmp_path, snap)
    assert code == 1 and [(s, c) for s, c, _ in ct2] == [("error", "cudnn-mismatch")]
    assert "the cuDNN installed here is 8.x" in out
    assert "\npip install 'torch>=2.4' --index-url https://download.pytorch.org/whl/cu121\n" in out
    # torch 2.5.1 the same way: its cuDNN 9 is what a 4.5 wheel needs
    snap = _snapshot("4.5.0", None).replace('{torch: {version: "2.5.1"}}', "{}")
    assert [(s, c) for s, c, _ in _doctor(tmp_path, snap)[2]] == [("info", "ok")]


def test_a_torch_of_unknown_release_on_windows(tmp_path: Path) -> None:
    # faster-whisper#1080: ctranslate2 4.5.0 on Windows, torch's release and cuDNN not stated
    snap = ("schema: dnnctl-env/1\nos: Windows\n"
            "packages: {ctranslate2: \"4.5.0\", faster-whisper: null, torch: null}\n")
    d = doctor(tmp_path, snap)
    [f] = d.of("not-judged", "ctranslate2")
    assert f["severity"] == "warning" and "cudnn*64_9.dll" in f["message"]
    assert "'Could not locate cudnn_ops64_9.dll'" in f["message"]
    assert "torch wheels bundle cuDNN 9 from 2.4 on" in f["message"]
    assert f["fix"] == (
        "if the cuDNN here is not 9: a torch that bundles it (`pip install 'torch>=2.4' "
        "--index-url https://download.pytorch.org/whl/cu121`), or with cuDNN 8: `pip install "
        "'ctranslate2>=4.0,<4.5'` (the releases built for it)")
    assert d.code == 0  # a warning: the verdict is WARN, not FAIL


def test_a_cuda11_wheel_without_a_cuda11_runtime(tmp_path: Path) -> None:
    runtimes = 'cuda_runtimes: [{version: "12.4.127", source: "pip:nvidia-cuda-runtime-cu12"}]\n'
    code, out, ct2 = _doctor(tmp_path, _snapshot("3.24.0", "9.1.0.70", extra=runtimes))
    assert code == 1 and ("error", "cuda-mismatch", "pip install 'ctranslate2>=4.5'") in ct2
    assert ("error", "cudnn-mismatch", "pip install 'ctranslate2>=4.5'") in ct2
    assert "libcublas.so.11" in out


def test_detection_lists_ctranslate2_and_its_users() -> None:
    assert all(relevant(n) for n in ("ctranslate2", "faster-whisper", "whisperx"))


def test_an_unknown_version_gets_the_releases_that_fit_as_a_command(tmp_path: Path) -> None:
    # only cuDNN 9: the 3.x-4.4 wheels (cuDNN 8) fail, every release from 4.5 on fits
    snap = ("schema: dnnctl-env/1\nos: Linux\n%s\n"
            "packages: {ctranslate2: null, faster-whisper: null}\n")
    d = doctor(tmp_path, snap % 'cudnn: [{version: "9.2", source: "system:/usr/lib"}]')
    [f] = d.of("not-judged", "ctranslate2")
    assert f["fix"].startswith("`pip install -U 'ctranslate2>=4.5'`")
    assert "\npip install -U 'ctranslate2>=4.5'\n" in d.text
    # CUDA 12 with only cuDNN 8: the 4.5-4.6.2 wheels (cuDNN 9) break the run; 4.6.3+ need none
    d = doctor(tmp_path, snap % ('cuda_runtimes: [{version: "12.4"}]\n'
                                 'cudnn: [{version: "8.9.7", source: "pip:nvidia-cudnn-cu12"}]'))
    [f] = d.of("not-judged", "ctranslate2")
    assert "'ctranslate2>=4.6.3'" in f["fix"]
    # only CUDA 11: the newest wheels (CUDA 12) do not fit, so no release range is offered
    d = doctor(tmp_path, snap % 'cuda_runtimes: [{version: "11.8"}]\ncudnn: []')
    [f] = d.of("not-judged", "ctranslate2")
    assert f["fix"] == "name its version (pip show ctranslate2)"
