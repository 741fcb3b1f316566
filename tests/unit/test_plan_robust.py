"""Plans that promise what a kernel cannot do, large plans, the fast YAML path, keys.

``plan validate`` rejects an entry whose variant does not support its key, ``load_plan``
ignores it with a warning naming it (and the call falls back, never runs it); libyaml's
loader keeps every strict rule of the pure-Python one; a 600-entry plan round-trips
exactly (the timed 20,000-entry run is benchmarks/bench_plan_load.py); ``--key`` gets the
documented defaults and options that do not apply are errors.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from _plan_helpers import conv, entry, numpy_section
from typer.testing import CliRunner

import dnnctl
from dnnctl import api
from dnnctl.cli.app import app
from dnnctl.errors import PlanError, UsageError
from dnnctl.files.yamlio import _StrictLoader, parse_yaml
from dnnctl.plan import Plan, UnsupportedEntryWarning, parse_plan, plan_text, read_plan, write_plan
from dnnctl.tune.tuner import TuneOptions
from dnnctl.workloads import key_with_defaults

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "benchmarks"))
runner = CliRunner()


def _bad_plan() -> Plan:
    # im2col_gemm's chunk must be 0 or below the batch: chunk=8 at n=2 cannot run
    return Plan([numpy_section([
        entry(conv(), "im2col_gemm", {"chunk": 8}, 90.0),
        entry(conv(n=4), "direct", {"order": "tap"}, 120.0),
    ])])


def test_validate_rejects_an_entry_its_variant_does_not_support(tmp_path):
    path = tmp_path / "plan.yaml"
    write_plan(_bad_plan(), path)
    read_plan(path)  # the schema is fine: only supports()/parameters catch it
    with pytest.raises(PlanError) as exc:
        api.plan_validate(path)
    text = str(exc.value)
    assert str(path) in text and "entry 0" in text and "im2col_gemm(chunk=8)" in text
    assert "field 'choice'" in text and exc.value.hint
    res = runner.invoke(app, ["plan", "validate", str(path)])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_load_ignores_an_unsupported_entry_with_a_warning_and_never_runs_it(tmp_path):
    path = tmp_path / "plan.yaml"
    write_plan(_bad_plan(), path)
    with pytest.warns(UnsupportedEntryWarning, match=r"ignoring entry 0 .*im2col_gemm"):
        plan = dnnctl.load_plan(path, device="cpu", strict=True)
    x = np.random.default_rng(0).standard_normal((2, 16, 12, 12)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((16, 16, 3, 3)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = dnnctl.ops.conv2d(x, w, padding=1, plan=plan)  # the bad entry is not used
    assert y.shape == (2, 16, 12, 12)
    stats = plan.stats()
    assert sum(stats.hits.values()) == 0 and stats.total == 1


def test_partial_compared_and_tie_round_trip_and_are_validated():
    e = entry(conv(), "direct", {"order": "tap"}, 80.0)
    e.partial, e.compared, e.tie = True, 3, ("direct(order=tap)", "fft(size=fast)")
    text = plan_text(Plan([numpy_section([e])]))
    assert '"partial": true, "compared": 3' in text
    assert '"tie": ["direct(order=tap)", "fft(size=fast)"]' in text
    back = parse_plan(text).sections[0].entries[0]
    assert (back.partial, back.compared, back.tie) == (True, 3, e.tie)
    with pytest.raises(PlanError, match="compared"):
        parse_plan(_sub(text, ', "compared": 3', ""))
    with pytest.raises(PlanError, match="'tie'"):
        parse_plan(_sub(text, '["direct(order=tap)", "fft(size=fast)"]', '{"a": 1}'))


def _sub(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


def test_a_choice_seen_before_is_still_checked_as_written():
    # entries 0 and 1 name the same choice; entry 1 spells a parameter as a boolean (False
    # == 0 in Python): validating a repeated choice once must not let that through
    plan = Plan([numpy_section([entry(conv(), "im2col_gemm", {"chunk": 0}, 90.0),
                                entry(conv(n=4), "im2col_gemm", {"chunk": 0}, 95.0)])])
    text = plan_text(plan)
    parse_plan(text)
    lines = text.splitlines()
    last = max(i for i, line in enumerate(lines) if line.startswith("  - {"))
    lines[last] = _sub(lines[last], '"choice": {"variant": "im2col_gemm", "params": '
                       '{"chunk": 0}}', '"choice": {"variant": "im2col_gemm", "params": '
                       '{"chunk": false}}')
    with pytest.raises(PlanError, match=r"entry 1 .*choice.params.chunk'.*False is not one of"):
        parse_plan("\n".join(lines))


def test_duplicate_keys_name_the_line():
    text = "schema: dnnctl-plan/1\nsections: []\nschema: dnnctl-plan/1\n"
    with pytest.raises(PlanError) as exc:
        parse_plan(text, "dup.yaml")
    assert str(exc.value).startswith("dup.yaml:3:") and "duplicate key 'schema'" in str(
        exc.value)


@pytest.mark.skipif(not getattr(yaml, "__with_libyaml__", False), reason="no libyaml")
def test_the_json_and_libyaml_paths_agree_with_the_exact_loader():
    from bench_plan_load import build_plan

    from dnnctl.files.yamlio import dump_yaml
    from dnnctl.plan.io import HEADER

    built = build_plan(600)  # GPU section, 4 ops, real default choices
    text = plan_text(built)  # read with json (dnnctl.files.lineyaml)
    old = dump_yaml(built.to_data(), HEADER)  # the all-YAML form: read with libyaml
    exact = yaml.load(text, Loader=_StrictLoader)  # noqa: S506
    assert parse_yaml(text, "big.yaml") == exact
    assert parse_yaml(old, "old.yaml") == yaml.load(old, Loader=_StrictLoader) == exact  # noqa: S506
    plan = parse_plan(text, "big.yaml")
    assert sum(len(s.entries) for s in plan.sections) == 600
    again = plan_text(plan)
    assert plan_text(parse_plan(again)) == again  # byte-identical round trip
    from dnnctl.plan.sections import section_device
    from dnnctl.plan.support import unsupported

    sec = plan.sections[0]
    assert list(unsupported(sec, section_device(sec))) == []  # every default supports


def test_key_defaults_on_the_command_line_and_in_the_api(tmp_path):
    assert key_with_defaults("softmax", {"rows": 4, "cols": 8}, "numpy")["dtype"] == "float32"
    assert key_with_defaults("conv2d", {"n": 1}, "cupy")["layout"] == "NHWC"
    assert key_with_defaults("softmax", {"dtype": "float16"}, "numpy")["dtype"] == "float16"
    # norm ops default their own layout (NCHW): the op's default wins
    assert "layout" not in key_with_defaults("layer_norm", {"rows": 1}, "cupy")
    with pytest.raises(UsageError, match="--dtype applies to bundled workloads"):
        api.tune(op="softmax", key="rows=4,cols=8", workload_options={"dtype": "float16"},
                 options=TuneOptions(device="cpu", output=tmp_path / "p.yaml"))
    res = runner.invoke(app, ["tune", "--device", "cpu", "--op", "softmax", "--key",
                              "rows=4,cols=8", "--dtype", "float16", "-o",
                              str(tmp_path / "p.yaml")])
    assert res.exit_code == 2 and "--dtype applies to bundled workloads" in res.output
    with pytest.raises(UsageError, match="key must be"):
        api.tune(op="softmax", key=42,
                 options=TuneOptions(device="cpu", output=tmp_path / "p.yaml"))


def test_a_large_plan_is_parsed_once_and_the_cache_is_validated_like_the_file(
        tmp_path, monkeypatch):
    """The parse cache serves large files in YAML form (older or hand-written plans); a plan
    in dnnctl's own form is read with json and needs no cache."""
    from bench_plan_load import build_plan

    from dnnctl.files import parsecache
    from dnnctl.files.yamlio import dump_yaml
    from dnnctl.plan.io import HEADER

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "big.yaml"
    plan = build_plan(1900)
    path.write_text(plan_text(plan))
    assert path.stat().st_size > parsecache.MIN_BYTES
    fast = read_plan(path)
    assert len(fast.sections[0].entries) == 1900
    assert not parsecache.cache_dir().exists()  # the fast form is not cached
    yaml_text = dump_yaml(plan.to_data(), HEADER)  # the form before
    path.write_text(yaml_text)
    first = read_plan(path)
    cached = list(parsecache.cache_dir().glob("*.json"))
    assert len(cached) == 1 and cached[0].stem == parsecache.key_of(path.read_bytes())
    again = read_plan(path)  # served from the cache
    assert plan_text(again) == plan_text(first) == plan_text(fast)
    assert len(again.sections[0].entries) == 1900
    # a tampered cache entry is plain data, validated like the file: refused, never trusted
    data = json.loads(cached[0].read_text())
    data["sections"][0]["entries"][0]["choice"]["variant"] = "no_such_variant"
    cached[0].write_text(json.dumps(data))
    with pytest.raises(PlanError, match="no_such_variant"):
        read_plan(path)
    # other bytes, other key: an edited file is parsed again
    path.write_text(yaml_text.replace("median_us: 21.4", "median_us: 21.5", 1))
    assert read_plan(path).sections[0].entries[0].stats is not None
    assert len(list(parsecache.cache_dir().glob("*.json"))) == 2
