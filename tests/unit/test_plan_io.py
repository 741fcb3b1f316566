"""Plan files: canonical YAML, round trips, atomic writes, and hostile / corrupt plans
rejected with errors naming the file, the entry and the field."""

from __future__ import annotations

import copy
import json
import os
import stat

import pytest
import yaml
from _plan_helpers import conv, entry, numpy_section, sample_plan

from dnnctl.errors import PlanError
from dnnctl.plan import Plan, parse_plan, plan_text, read_plan, update_plan, write_plan
from dnnctl.plan.schema import ENTRY_FIELDS, OPTIONAL_ENTRY_FIELDS


def test_round_trip_is_exact_and_byte_stable(tmp_path):
    plan = sample_plan()
    path = tmp_path / "plan.yaml"
    write_plan(plan, path)
    first = path.read_bytes()
    again = read_plan(path)
    assert again.source == str(path)
    assert [e.problem for e in again.sections[0].entries] == sorted(
        (e.problem for e in plan.sections[0].entries), key=lambda p: (p["c"], p["groups"]))
    for a in plan.sections[0].entries:
        b = again.sections[0].find(a.problem)
        assert b is not None and b.choice == a.choice and b.stats == a.stats
        assert b.runner_up == a.runner_up and b.failed == a.failed and b.tried == a.tried
    write_plan(again, path)
    assert path.read_bytes() == first  # same plan -> same bytes (diff-friendly)


def test_layout_is_diff_friendly(tmp_path):
    text = plan_text(sample_plan())
    assert text.startswith("# dnnctl plan")
    assert '\nschema: "dnnctl-plan/1"\nsections:\n- device: {"backend": "numpy",' in text
    lines = text.splitlines()
    # one line per entry (a JSON object: see test_plan_lineyaml), fields in the documented
    # order, the entries in key order
    rows = [json.loads(line[4:]) for line in lines if line.startswith("  - {")]
    always = [f for f in ENTRY_FIELDS if f not in OPTIONAL_ENTRY_FIELDS]
    assert len(rows) == 3 and all(list(row) == always for row in rows)
    assert [(r["key"]["c"], r["key"]["groups"]) for r in rows] == [(4, 1), (16, 1), (16, 16)]
    assert any(line.startswith('  - {"op": "conv2d", "key": {"activation": "none", '
                               '"bias": false, "c": 16,') for line in lines)
    assert "!!" not in text and "&id" not in text and "*id" not in text


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "plan.yaml"
    write_plan(sample_plan(), path)
    os.chmod(path, 0o640)
    write_plan(sample_plan(), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # permissions survive a rewrite


def test_update_plan_reads_modifies_writes(tmp_path):
    path = tmp_path / "plan.yaml"
    update_plan(path, lambda p: p.sections.append(numpy_section([entry(conv(), "fft",
                                                                       {"size": "exact"})])))
    update_plan(path, lambda p: p.sections[0].upsert(entry(conv(n=4), "direct",
                                                           {"order": "tap"})))
    plan = read_plan(path)
    assert len(plan.sections) == 1 and len(plan.sections[0].entries) == 2


def test_hand_written_minimal_entry_is_accepted():
    base = yaml.safe_load(plan_text(sample_plan()))
    minimal = {"op": "conv2d", "key": {"n": 1, "c": 3, "h": 8, "w": 8, "k": 4, "r": 3, "s": 3,
                                       "dtype": "float32", "layout": "NCHW"},
               "choice": {"variant": "direct", "params": {"order": "tap"}}}
    base["sections"][0]["entries"] = [minimal]
    plan = parse_plan(yaml.safe_dump(base), "hand.yaml")
    e = plan.sections[0].entries[0]
    assert e.problem["pad"] == (0, 0) and e.stats is None and e.pinned is False


# ----------------------------------------------------------------------------- hostile


def _valid() -> dict:
    return yaml.safe_load(plan_text(Plan([numpy_section([entry(conv(), "im2col_gemm",
                                                               {"chunk": 8})])])))


def _mutated(change) -> str:
    data = _valid()
    change(data)
    return yaml.safe_dump(data, sort_keys=False)


def _e(d: dict) -> dict:
    return d["sections"][0]["entries"][0]


HOSTILE_DATA = [
    ("unknown variant", lambda d: _e(d)["choice"].update(variant="evil"),
     ["entry 0", "choice.variant", "unknown variant 'evil'"]),
    ("param not in space", lambda d: _e(d)["choice"]["params"].update(chunk=7),
     ["entry 0", "choice.params.chunk", "7 is not one of [0, 1, 8]"]),
    ("bool for int param", lambda d: _e(d)["choice"]["params"].update(chunk=True),
     ["choice.params.chunk", "True is not one of"]),
    ("unknown param", lambda d: _e(d)["choice"]["params"].update(tile=4),
     ["choice.params", "unknown parameter(s) ['tile']"]),
    ("missing param", lambda d: _e(d)["choice"].update(params={}),
     ["choice.params", "parameter 'chunk' missing"]),
    ("huge key number", lambda d: _e(d)["key"].update(n=10**30),
     ["entry 0", "field 'key'", "'n'", "absurdly large"]),
    ("wrong key type", lambda d: _e(d)["key"].update(dtype=[1, 2]),
     ["field 'key'", "'dtype'"]),
    ("unknown op", lambda d: _e(d).update(op="rm_rf"), ["entry 0", "field 'op'", "rm_rf"]),
    ("huge time", lambda d: _e(d)["stats"].update(median_us=1e300, p80_us=1e301),
     ["field 'stats.median_us'", "out of range"]),
    ("negative tried", lambda d: _e(d).update(tried=-1), ["field 'tried'", "out of range"]),
    ("string tried", lambda d: _e(d).update(tried="7"), ["field 'tried'", "expected an integer"]),
    ("pinned as text", lambda d: _e(d).update(pinned="yes"),
     ["field 'pinned'", "expected true or false"]),
    ("unknown entry field", lambda d: _e(d).update(code="import os"),
     ["entry 0", "field 'code'", "unknown field"]),
    ("unknown failure reason", lambda d: _e(d)["failed"].update(exploded=1),
     ["field 'failed.exploded'"]),
    ("bad digest", lambda d: d["sections"][0].update(kernels_digest="md5:abc"),
     ["sections[0]", "field 'kernels_digest'"]),
    ("bad backend", lambda d: d["sections"][0]["device"].update(backend="opencl"),
     ["field 'device.backend'", "unknown backend 'opencl'"]),
    ("huge text", lambda d: d["sections"][0]["device"].update(name="x" * 5000),
     ["field 'device.name'", "too long"]),
    ("wrong schema", lambda d: d.update(schema="dnnctl-plan/9"),
     ["field 'schema'", "unsupported schema 'dnnctl-plan/9'"]),
    ("entries not a list", lambda d: d["sections"][0].update(entries={"a": 1}),
     ["field 'entries'", "expected a list"]),
    ("p20 above median", lambda d: _e(d)["stats"].update(p20_us=1e6),
     ["field 'stats'", "p20_us <= median_us <= p80_us"]),
    ("duplicate entry", lambda d: d["sections"][0]["entries"].append(copy.deepcopy(_e(d))),
     ["entry 1", "duplicate of entry 0"]),
]


@pytest.mark.parametrize("name,change,expected", HOSTILE_DATA, ids=[h[0] for h in HOSTILE_DATA])
def test_hostile_plan_is_rejected_naming_file_entry_and_field(name, change, expected):
    with pytest.raises(PlanError) as info:
        parse_plan(_mutated(change), "hostile.yaml")
    text = str(info.value)
    assert text.startswith("hostile.yaml")
    for part in expected:
        assert part in text, (part, text)
    assert info.value.hint


HOSTILE_TEXT = [
    ("python tag", "!!python/object/apply:os.system ['echo pwned']", "tag"),
    ("custom tag", "!evil {a: 1}", "tag"),
    ("explicit str tag", "schema: !!str dnnctl-plan/1\nsections: []\n", "tag"),
    ("billion laughs", "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a]\n"
                       "c: [*b, *b, *b, *b, *b, *b]\n", "alias"),
    ("duplicate key", "schema: dnnctl-plan/1\nschema: dnnctl-plan/1\nsections: []\n",
     "duplicate key 'schema'"),
    ("merge key", "base: &b {x: 1}\nother:\n  <<: *b\n", "not allowed"),
    ("merge key, no alias", "other:\n  <<: {x: 1}\n", "merge keys (<<) are not allowed"),
    ("int spelled twice", "1: a\n0x1: b\n", "duplicate key"),
    ("set tag", "a: !!set {x}\n", "tag"),
    ("tag on a number", "schema: !!int 7\n", "tag"),
    ("not a mapping", "- 1\n- 2\n", "expected a mapping"),
    ("empty", "", "empty"),
]


@pytest.mark.parametrize("name,text,expected", HOSTILE_TEXT, ids=[h[0] for h in HOSTILE_TEXT])
def test_hostile_yaml_is_rejected(name, text, expected, tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text(text)
    with pytest.raises(PlanError) as info:
        read_plan(path)
    assert str(info.value).startswith(str(path))
    assert expected in str(info.value)


def test_corrupted_plan_is_rejected_with_line(tmp_path):
    path = tmp_path / "plan.yaml"
    write_plan(sample_plan(), path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2] + "\n  - op: [unterminated\n")
    with pytest.raises(PlanError) as info:
        read_plan(path)
    assert info.value.line is not None and info.value.line > 5
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(PlanError, match="not UTF-8"):
        read_plan(path)
    with pytest.raises(PlanError, match="cannot be read"):
        read_plan(tmp_path / "missing.yaml")
