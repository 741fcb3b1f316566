"""Plans in the fast-reading form (dnnctl.files.lineyaml): one JSON line per entry, read
with ``json``, the same values and errors as the YAML loader; plans in the previous
all-YAML form and hand-edited ones still load."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from _plan_helpers import conv, entry, numpy_section, sample_plan
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dnnctl import api
from dnnctl.cli.app import app
from dnnctl.errors import InputFileError, PlanError
from dnnctl.files import lineyaml, yamlio
from dnnctl.files.yamlio import _StrictLoader, dump_yaml, parse_yaml
from dnnctl.ops import registry
from dnnctl.plan import Plan, parse_plan, plan_text, read_plan, write_plan
from dnnctl.plan.io import HEADER
from dnnctl.plan.schema import PlanEntry, Timing
from dnnctl.tune.timer import TimingPolicy
from dnnctl.tune.tuner import TuneOptions, tune
from dnnctl.workloads import Workload

PREVIOUS = Path(__file__).resolve().parent.parent / "data" / "plans" / "previous-form.yaml"
runner = CliRunner()


def _entry_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("  - {")]


def _yaml_parses(text: str) -> list:
    """The text as every YAML loader in reach reads it (all must agree)."""
    out = [yaml.safe_load(text), yaml.load(text, Loader=_StrictLoader)]  # noqa: S506
    if hasattr(yaml, "CSafeLoader"):
        out.append(yaml.load(text, Loader=yaml.CSafeLoader))  # noqa: S506
    return out


@pytest.fixture
def yaml_calls(monkeypatch):
    """The texts the strict YAML loader is given."""
    seen: list[str] = []
    real = yamlio._parse_strict

    def spy(text, *args, **kwargs):
        seen.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(yamlio, "_parse_strict", spy)
    return seen


# ----------------------------------------------------------------------------- the writer


def test_the_writer_puts_each_entry_on_one_json_line():
    plan = sample_plan()
    text = plan_text(plan)
    assert text.startswith(HEADER)
    assert '\nschema: "dnnctl-plan/1"\nsections:\n- device: {"backend": "numpy", ' in text
    lines = _entry_lines(text)
    entries = sorted(plan.sections[0].entries, key=lambda e: (e.problem["c"],
                                                                e.problem["groups"]))
    assert len(lines) == len(entries) == 3
    for line, e in zip(lines, entries):
        assert json.loads(line[4:]) == e.to_data()  # plain JSON, the documented field order
        assert list(json.loads(line[4:])) == list(e.to_data())
    assert all(y == plan.to_data() for y in _yaml_parses(text))  # and plain YAML too


def test_any_yaml_reader_gets_the_values_json_gets():
    # values where YAML 1.1 and JSON part ways: an exponent without a dot, text YAML may
    # not hold raw (C1 controls, NEL / LS / PS, DEL), words YAML reads as booleans
    e = entry(conv(), "fft", {"size": "fast"}, 120.0)
    e.max_rel_err = 1e-05
    e.stats = Timing(5e-05, 5e-05, 7e-05, 7)
    e.tie = ("fft(size=fast)", "yes", "on", "1e5", "a\x85b\u2028c\u2029d\x7fe\x9f", "é😀",
             "x: y", "# no comment", "null", "'q'", '"dq"', "back\\slash", "tab\there")
    plan = Plan([numpy_section([e], name="NVIDIA ÜBER \u2028 GPU")])
    text = plan_text(plan)
    assert "\x85" not in text and "\u2028" not in text and "\x7f" not in text
    assert '"max_rel_err": 1.0e-05' in text and '"p80_us": 7.0e-05' in text
    data = plan.to_data()
    assert all(y == data for y in _yaml_parses(text))
    assert lineyaml.parse(text, lambda t, at: yamlio._parse_strict(t, "t", InputFileError,
                                                                     at)) == data
    again = parse_plan(text).sections[0].entries[0]
    assert again.tie == e.tie and again.max_rel_err == 1e-05
    assert plan_text(parse_plan(text)) == text  # byte-stable


_scalars = (st.none() | st.booleans() | st.integers(-10**20, 10**20)
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(st.characters(blacklist_categories=("Cs",)), max_size=12))
_keys = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8).filter(
    lambda k: k != "<<")  # a merge key: refused by the strict loader, in any form
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(_keys, inner, max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=4),
       st.lists(st.dictionaries(_keys, _values, max_size=4), min_size=1, max_size=4))
@example({}, [{"0": [{}, 1e-05]}])  # a float alone on its line
@example({"x": -2e+20, "on": "1e5"}, [{"0": [[{}]]}, {"no": ["1e-05", 5e-05]}])
def test_dump_then_any_reader_gives_the_data_back(top, items):
    data = {**top, "items": items}
    text = lineyaml.dump(data)
    back = lineyaml.parse(text, lambda t, at: yamlio._parse_strict(t, "t", InputFileError,
                                                                     at))
    if re.search(r"^ *- \{", text, re.M):  # a mapping in a list: written as a JSON line
        assert back is not lineyaml.NOT_THIS_FORM
    else:
        assert back is lineyaml.NOT_THIS_FORM
        back = yamlio._parse_strict(text, "t", InputFileError)
    assert back == data
    assert all(y == data for y in _yaml_parses(text))


def test_what_json_cannot_hold_exactly_is_written_as_plain_yaml():
    with pytest.raises(ValueError):
        lineyaml.dump({"a": [{"x": math.inf}]})
    with pytest.raises(ValueError):
        lineyaml.dump({"a": [{1: "int key"}]})
    e = entry(conv(), "fft", {"size": "fast"})
    e.max_rel_err = math.inf  # the loader refuses it either way; the writer does not crash
    text = plan_text(Plan([numpy_section([e])]))
    assert "max_rel_err: .inf" in text and not _entry_lines(text)


# ----------------------------------------------------------------------------- the reader


def test_the_reader_takes_the_json_path(tmp_path, yaml_calls):
    path = tmp_path / "plan.yaml"
    write_plan(sample_plan(), path)
    plan = read_plan(path)
    assert len(plan.sections[0].entries) == 3
    # the YAML loader saw the outline only: no entry, a placeholder for the three
    assert len(yaml_calls) == 1 and '"op"' not in yaml_calls[0]
    assert yaml_calls[0].count("\n  - ") == 1


def test_a_20000_entry_plan_is_read_with_json(tmp_path, yaml_calls):
    """The large case takes the JSON path end to end (the timed run, 20,000 real GPU
    entries, is benchmarks/bench_plan_load.py)."""
    op = registry.get_op("softmax")
    entries = [PlanEntry(op.problem(rows=64 * (i // 4 + 1), cols=(128, 256, 512, 1024)[i % 4],
                                    dtype="float32"),
                         op.default_choice(op.problem(rows=64, cols=128, dtype="float32"),
                                           "numpy", None),
                         Timing(10.0 + i % 7, 9.0, 20.0, 50), tried=3)
                for i in range(20_000)]
    path = tmp_path / "big.yaml"
    write_plan(Plan([numpy_section(entries)]), path)
    text = path.read_text()
    assert len(_entry_lines(text)) == 20_000 and len(text.splitlines()) < 20_020
    plan = read_plan(path)
    assert len(plan.sections[0].entries) == 20_000
    # YAML read the outline (and blank lines where entries were), JSON the rest
    assert sum(len(t.replace("\n", "")) for t in yaml_calls) < 2_000
    assert plan.sections[0].entries[-1].problem == entries[-1].problem


def test_the_previous_all_yaml_form_still_loads(tmp_path, yaml_calls):
    text = PREVIOUS.read_text()
    assert not _entry_lines(text)  # written before lineyaml: block YAML entries
    plan = read_plan(PREVIOUS)
    assert yaml_calls == [text]  # read by the YAML loader, as before
    h200, cpu = plan.sections
    assert (len(h200.entries), len(cpu.entries)) == (10, 2)
    assert cpu.device["name"] == "AMD EPYC 9654 — 96 cores"
    assert [e.pinned for e in h200.entries].count(True) == 1
    partial = [e for e in h200.entries if e.partial]
    assert len(partial) == 1 and partial[0].compared == 5
    assert partial[0].tie == ("direct(bm=32,bn=16,tm=4,tn=2)", "implicit_gemm(x=1)")
    assert {1e-05, 3.1e-07} <= {e.max_rel_err for e in h200.entries}
    assert [e.stats is None and e.runner_up is None for e in h200.entries].count(True) == 1
    # written again, it is in the new form and reads back to the same plan
    out = tmp_path / "new.yaml"
    write_plan(plan, out)
    new = out.read_text()
    assert len(_entry_lines(new)) == 12
    assert parse_plan(new).to_data() == plan.to_data() == yaml.safe_load(new)
    assert api.plan_diff(PREVIOUS, out)["identical"]


def test_hand_edited_lines_are_read_as_yaml(yaml_calls):
    plan = sample_plan()
    text = plan_text(plan)
    lines = text.splitlines()
    first, second, third = (i for i, line in enumerate(lines) if line.startswith("  - {"))
    # one entry rewritten in YAML flow style on its line, one in block style
    flow = yaml.safe_dump(json.loads(lines[first][4:]), default_flow_style=True,
                          sort_keys=False, width=10**6).strip()
    lines[first] = "  - " + flow
    block = yaml.safe_dump([json.loads(lines[third][4:])], sort_keys=False)
    lines[third:third + 1] = ["  " + b for b in block.splitlines()]
    edited = "\n".join(lines) + "\n"
    assert flow.startswith("{op: conv2d, key: {activation: none")
    yaml_calls.clear()
    again = parse_plan(edited)
    assert again.to_data() == plan.to_data() == yaml.safe_load(edited)
    assert flow in yaml_calls  # that line alone went to the YAML loader
    assert not any(lines[second][4:] in t for t in yaml_calls)  # the JSON one did not


# ----------------------------------------------------------------------------- errors


def _broken(change_line) -> tuple[str, int]:
    """The sample plan's text with its second entry line changed; that line's number."""
    lines = plan_text(sample_plan()).splitlines()
    i = [n for n, line in enumerate(lines) if line.startswith("  - {")][1]
    lines[i] = change_line(lines[i])
    return "\n".join(lines) + "\n", i + 1


@pytest.mark.parametrize("name,change,message", [
    ("duplicate key", lambda s: s.replace('"tried": 7', '"tried": 7, "tried": 8'),
     "duplicate key 'tried'"),
    ("duplicate nested key", lambda s: s.replace('"n": 50}', '"n": 50, "n": 51}'),
     "duplicate key 'n'"),
    ("merge key", lambda s: s.replace('"tried": 7', '"<<": {"tried": 7}'),
     "merge keys (<<) are not allowed"),
    ("cut short", lambda s: s[:90], "that line read alone"),
    ("closing brace lost", lambda s: s[:-1], "that line read alone"),
    ("garbage in the middle", lambda s: s.replace('"tried": 7,', '"tried": 7,, ]'),
     "that line read alone"),
])
def test_a_bad_line_in_the_fast_form_is_an_error_naming_it(name, change, message, tmp_path):
    text, line = _broken(change)
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    with pytest.raises(PlanError) as info:
        read_plan(path)
    assert info.value.line == line, str(info.value)
    assert str(info.value).startswith(f"{path}:{line} ") and message in str(info.value)
    res = runner.invoke(app, ["plan", "validate", str(path), "--json"])
    assert res.exit_code == 2 and json.loads(res.stdout)["error"]["code"] == "bad-plan"


def test_a_file_cut_mid_line_names_its_last_line():
    text = plan_text(sample_plan())
    cut = text[:-200]
    with pytest.raises(PlanError) as info:
        parse_plan(cut, "cut.yaml")
    assert info.value.line == cut.count("\n") + 1


def test_duplicate_keys_in_the_outline_name_the_line():
    text = plan_text(sample_plan()).replace('  created: "', '  created: "x"\n  created: "', 1)
    with pytest.raises(PlanError) as info:
        parse_plan(text, "dup.yaml")
    line = text.splitlines().index('  created: "x"') + 2
    assert info.value.line == line and "duplicate key 'created'" in str(info.value)


@pytest.mark.parametrize("item", [
    '{"v": 1e-05}', '{"v": 1.5e5}', '{"v": 1E+5}', '{"v": -1.0e-05}', '{"v": NaN}',
    '{"v": Infinity}', '{"v": "\\u00e9\\/"}', '{"v": 10000000000000000000000}',
    '{"v": [true, false, null, -0, 0.5]}', '{v: yes, w: on}', '{"v": 1}  # a comment',
    '{"v": "a", "v": "b"}', '{"v": "\\ud83d\\ude00"}', '{"' + "k" * 1100 + '": 1}',
])
def test_a_line_is_read_as_yaml_reads_it(item):
    text = f"a:\n- {item}\n- {{\"w\": 2}}\n"
    got = _outcome(lambda: parse_yaml(text, "t.yaml"))
    want = _outcome(lambda: yamlio._parse_strict(text, "t.yaml", InputFileError))
    assert got == want


def _outcome(fn):
    try:
        return ("value", fn())
    except InputFileError as exc:
        return ("error", exc.line)


def test_text_in_a_block_scalar_is_not_taken_for_entries():
    text = 'note: |\n  - {"a": 1, "a": 2}\n  - {"b": 3}\nitems:\n- {"c": 4}\n'
    assert parse_yaml(text, "t.yaml") == {"note": '- {"a": 1, "a": 2}\n- {"b": 3}\n',
                                          "items": [{"c": 4}]}


def test_a_node_spanning_lines_is_read_as_yaml_reads_it():
    # valid YAML whose '- {' lines are not one node each: the whole file decides
    text = '- {"a": "x}\n- {"}\n- {"b": 1}\n'
    assert parse_yaml(text, "t.yaml") == yaml.safe_load(text) == [{"a": "x} - {"}, {"b": 1}]


# ----------------------------------------------------------------------------- writers


def test_tune_writes_the_fast_form_and_it_round_trips(tmp_path):
    fast = TimingPolicy.for_backend("numpy").replace(warmup_ms=0.5, budget_ms=2.0,
                                                     retime_budget_ms=1.0, retime_rounds=1)
    out = tmp_path / "plan.yaml"
    wl = Workload("t")
    wl.add("softmax", {"rows": 8, "cols": 32, "dtype": "float32"})
    wl.add("layer_norm", {"rows": 8, "cols": 32, "dtype": "float32"})
    tune(wl, TuneOptions(device="cpu", output=out, policy=fast))
    text = out.read_text()
    lines = _entry_lines(text)
    assert len(lines) == 2 and [json.loads(x[4:])["op"] for x in lines] == ["layer_norm",
                                                                           "softmax"]
    plan = read_plan(out)
    assert yaml.safe_load(text)["sections"][0]["entries"] == plan.to_data()["sections"][0][
        "entries"]
    again = plan_text(plan)
    assert plan_text(parse_plan(again)) == again


def test_merge_and_pin_write_the_fast_form(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    (tmp_path / "old.yaml").write_text(dump_yaml(sample_plan().to_data(), HEADER))
    write_plan(Plan([numpy_section([entry(conv(n=4), "direct", {"order": "tap"})])]), b)
    a.write_text(PREVIOUS.read_text())
    out = tmp_path / "m.yaml"
    res = runner.invoke(app, ["plan", "merge", str(tmp_path / "old.yaml"), str(b), "-o",
                              str(out)])
    assert res.exit_code == 0, res.output
    assert len(_entry_lines(out.read_text())) == 4
    res = runner.invoke(app, ["plan", "pin", str(a), "--all", "--section", "1"])
    assert res.exit_code == 0, res.output
    pinned = a.read_text()
    assert len(_entry_lines(pinned)) == 12 and pinned.count('"pinned": true') >= 2
    for cmd in (["plan", "show", str(out)], ["plan", "diff", str(PREVIOUS), str(a)],
                ["plan", "validate", str(out)]):
        assert runner.invoke(app, cmd).exit_code == 0, cmd


_EDIT_CHARS = st.text(st.sampled_from(list('{}[]",:#\'\\ -!&*|>?\nab01e.')), max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_an_edited_file_reads_as_the_yaml_loader_reads_it(data):
    """Whatever is done to the entry lines, the fast reader gives the YAML loader's value,
    or an error where it gives one."""
    text = plan_text(sample_plan())
    lines = text.split("\n")
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.sampled_from([n for n, line in enumerate(lines)
                                       if line.startswith("  - ")] or [0]))
        line = lines[i]
        a = data.draw(st.integers(0, len(line)))
        b = data.draw(st.integers(a, min(len(line), a + 8)))
        lines[i] = line[:a] + data.draw(_EDIT_CHARS) + line[b:]
    edited = "\n".join(lines)
    fast = _outcome(lambda: parse_yaml(edited, "t.yaml"))
    exact = _outcome(lambda: yamlio._parse_strict(edited, "t.yaml", InputFileError))
    assert fast[0] == exact[0]
    if fast[0] == "value":
        assert fast == exact


def test_a_line_read_alone_takes_the_loader_the_whole_file_would():
    """libyaml takes ``0? 16`` in a flow mapping, the exact loader (which a file with a '!'
    gets) refuses it: a line that falls back is read with the file's loader."""
    text = plan_text(sample_plan())
    lines = text.split("\n")
    entries = [n for n, line in enumerate(lines) if line.startswith("  - ")]
    lines[entries[0]] = lines[entries[0]].replace('"op"', '"!op"', 1)
    lines[entries[1]] = lines[entries[1]].replace('"c": ', '"c":0? ', 1)
    edited = "\n".join(lines)
    exact = _outcome(lambda: yamlio._parse_strict(edited, "t.yaml", InputFileError))
    assert exact[0] == "error"
    assert _outcome(lambda: parse_yaml(edited, "t.yaml")) == exact
