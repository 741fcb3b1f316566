"""compat/errors.yaml, the error catalogue: every row sourced, its example recognized as its own,
its texts filled from what its patterns capture, its checks and finding codes real."""

from __future__ import annotations

import re

import pytest

from dnnctl.compat.errors import match_error, matching_rows, normalize, shown
from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.schema import CAUSE_FIELDS, validate_row
from dnnctl.doctor import rules_errors  # noqa: F401 - registers every check
from dnnctl.doctor.error_facts import CHECKS
from dnnctl.doctor.model import CODES
from dnnctl.doctor.rules_errors import PLACEHOLDER, fill
from dnnctl.errors import InputFileError

M = load_matrix([])
ROWS = M.rows("error_messages")
IDS = [r["id"] for r in ROWS]


def test_the_catalogue_has_its_rows_once_each():
    assert len(ROWS) >= 40
    assert len(set(IDS)) == len(IDS)
    assert all(r.file.endswith("errors.yaml") for r in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_every_row_cites_a_url_and_is_certain(row):
    assert re.search(r"https?://\S+", row["source"]), row["id"]
    assert row["certainty"] in ("V", "S")  # an uncertain error row would only ever guess


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_the_example_is_recognized_as_its_own_row(row):
    """First match wins, so a later row may also match an example (a general row after a
    specific one); no earlier row may."""
    m = match_error(M, row["example"])
    assert m is not None and m.id == row["id"], (row["id"], m and m.id)
    rows = [r["id"] for r in matching_rows(M, row["example"])]
    assert rows[0] == row["id"], rows


def test_the_examples_that_other_rows_also_match_are_the_expected_ones():
    """Where an example matches a later row too, that is on purpose (a message quoting
    another, a general row after its specific one): listed here so a new overlap is seen."""
    overlaps = {r["id"]: [x["id"] for x in matching_rows(M, r["example"])][1:] for r in ROWS}
    assert {k: v for k, v in overlaps.items() if v} == {
        "libcuda-missing": ["cudnn-missing"],  # cuDNN failing to load because libcuda is absent
        "undefined-symbol-cuda-library": ["cudnn-missing"],  # ... because of an old libnvrtc
        "cublas-bf16-unsupported": ["cublas-not-supported"],
        # TensorFlow's 'Could not create cudnn handle: CUDNN_STATUS_INTERNAL_ERROR' is the handle's
        "cudnn-init-failed": ["cudnn-internal-error"],
    }


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_placeholders_are_filled_from_the_example(row):
    """A {name} without a default must be captured by the example's match (so by the pattern
    users meet); {name|words} stands in with its words where a pattern lacks the group."""
    m = match_error(M, row["example"])
    texts = [row["meaning"], row["fix"]] + [c.get(k) or "" for c in row["causes"]
                                           for k in ("cause", "tell", "fix", "fact")]
    for text in texts:
        for name, default in PLACEHOLDER.findall(text):
            assert default or name in m.groups, (row["id"], name, text)
        assert PLACEHOLDER.search(fill(text, m)) is None


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_checks_and_codes_are_real(row):
    for cause in row["causes"]:
        assert set(cause) <= set(CAUSE_FIELDS)
        fact = cause.get("fact")
        for one in (fact or "").split("|") if fact else []:
            assert one.rstrip("?").split(":")[0] in CHECKS, (row["id"], fact)
        for code in cause.get("codes") or []:
            name = code.split("@")[0]
            # codes of rules still on other branches are allowed, but must look like codes
            assert re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*(?:@[a-z0-9-]+(?:#\w+)?(?:~\w+)?)?",
                                code), code
            assert name in CODES or name in PENDING, (row["id"], code)
        assert fact or cause.get("codes") or cause.get("tell"), (row["id"], cause["cause"])


# finding codes that model.CODES does not list: those other rules emit without listing them
# (gpu-not-driven, broken-release), and those of rules still on other branches (/dev/shm, what
# Windows and WSL 2 leave out, conda's __cuda, the display watchdog, hiding a GPU): a row names
# them so it points at their findings where they exist, and finds none otherwise
PENDING = {"shm-size", "platform-unsupported", "pinned-memory", "kernel-timeout",
           "conda-virtual-package", "hide-gpu", "broken-release", "gpu-not-driven"}


def test_a_malformed_cause_list_names_the_problem():
    row = dict(ROWS[0])
    for causes, problem in (([], "expected a list of causes"),
                            ([{"fact": "gpu_code"}], "missing 'cause'"),
                            ([{"cause": "x", "why": "y"}], "unknown field 'why'"),
                            ([{"cause": "x", "codes": "arch-unsupported"}],
                             "expected a list of strings")):
        bad = type(ROWS[0])({**row, "causes": causes})
        with pytest.raises(InputFileError, match=re.escape(problem)):
            validate_row("error_messages", bad)


def test_messages_are_matched_whitespace_collapsed_and_case_ignored():
    text = "RuntimeError: CUDA error:\n  NO KERNEL IMAGE is available\nfor execution on the device"
    assert match_error(M, text).id == "no-kernel-image"
    assert normalize(text).count("\n") == 0
    assert match_error(M, "everything is fine") is None


def test_a_long_text_is_matched_line_by_line_and_shown_shortened():
    text = "\n".join(["x" * 300] * 20 + ["Torch not compiled with CUDA enabled"])
    assert match_error(M, text).id == "torch-not-cuda"
    assert len(shown(text)) < 210 and shown(text).endswith("Torch not compiled with CUDA enabled")
