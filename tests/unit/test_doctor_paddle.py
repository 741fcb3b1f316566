"""paddlepaddle-gpu's .postNNN wheels (compat/paddle.yaml, from Paddle's install pages) against
the driver, the CUDA runtime and the cuDNN installed, through `doctor --from`."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor


def _snapshot(paddle: str, cudnn: str | None, cuda: str = "10.0", driver: str = "") -> str:
    text = f'cuda_runtimes: [{{version: "{cuda}", source: "system:/usr/local/cuda"}}]\n'
    if cudnn:
        text += f'cudnn: [{{version: "{cudnn}", source: "system:/usr/local/cuda"}}]\n'
    if driver:
        text += f'driver: {{version: "{driver}"}}\ngpus: [{{name: Tesla V100-SXM2-16GB}}]\n'
    return text + f'packages: {{paddlepaddle-gpu: "{paddle}"}}\n'


def test_a_cudnn_older_than_the_tags_page_asks_for_fails_with_an_apt_command(
        tmp_path: Path) -> None:
    d = doctor(tmp_path, _snapshot("1.8.4.post107", "7.4"))
    [f] = d.of("cudnn-mismatch")
    assert d.code == 1 and f["severity"] == "error"
    assert f["evidence"] == {"cudnn_needed": "7.6", "cudnn_found": "7.4"}
    assert "sudo apt-get install libcudnn7=7.6.5.32-1+cuda10.0" in d.text
    assert "compat/paddle.yaml" in f["source"]


def test_the_tag_and_release_pick_the_row(tmp_path: Path) -> None:
    # 1.7's page asked for cuDNN 7.3+, 1.8's for 7.6+: the same tag and cuDNN, two verdicts
    assert doctor(tmp_path, _snapshot("1.7.2.post107", "7.4")).code == 0
    ok = doctor(tmp_path, _snapshot("1.8.4.post107", "7.6.5"))
    assert ok.code == 0 and ok.codes("paddlepaddle-gpu", info=True) == {"ok"}


def test_the_wrong_cudnn_major_and_the_wrong_cuda_runtime(tmp_path: Path) -> None:
    d = doctor(tmp_path, _snapshot("2.6.0.post120", "9.1.0", cuda="12.0"))
    assert d.code == 1 and "needs cuDNN 8.x" in d.of("cudnn-mismatch")[0]["message"]
    d = doctor(tmp_path, _snapshot("2.6.0.post117", "8.4.1", cuda="12.0"))
    [f] = d.of("cuda-mismatch", "paddlepaddle-gpu")
    assert "libcudart.so.11" in f["message"]
    assert f["fix"].startswith("`export PIP_FIND_LINKS=https://paddlepaddle.org.cn/whl/linux/")
    assert "`pip install paddlepaddle-gpu==2.6.0.post120`" in f["fix"]


def test_a_driver_older_than_the_tags_cuda(tmp_path: Path) -> None:
    d = doctor(tmp_path, _snapshot("2.6.0.post120", "8.9.1", cuda="12.0", driver="470.82.01"))
    [f] = d.of("driver-too-old", "paddlepaddle-gpu")
    assert d.code == 1 and "needs CUDA 12.0" in f["message"]
    assert f["evidence"]["required"] == "525.60.13"


def test_untagged_or_unknown_builds_are_said_not_judged(tmp_path: Path) -> None:
    for version in ("1.8.4", "1.8.4.post110", "0.14.0.post87"):
        d = doctor(tmp_path, _snapshot(version, "7.4"))
        assert d.code == 0 and d.codes("paddlepaddle-gpu") == {"unknown-version"}, version
    d = doctor(tmp_path, _snapshot("", "7.4"))
    assert d.codes("paddlepaddle-gpu", info=True) == {"not-judged"}
