"""The library facade the CLI calls. Each function returns data; none prints or exits."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dnnctl.doctor.model import DoctorReport
    from dnnctl.tune.tuner import TuneOptions
    from dnnctl.workloads import WorkloadOptions


def check_replaceable(path: str | os.PathLike[str], kind: str,
                      inputs: tuple[Any, ...] = ()) -> None:
    """An output must not replace a directory, an input, or another kind of file."""
    from dnnctl.files.yamlio import check_replaceable as check

    check(path, kind, inputs)


def list_kernels(op: str | None = None, backend: str | None = None) -> list[dict[str, Any]]:
    """Every registered variant: op, backend, name, parameter space, source file."""
    return kernels_listing(op, backend)["variants"]


_BACKEND_ALIASES = {"cupy": "cupy", "cuda": "cupy", "gpu": "cupy", "numpy": "numpy",
                    "cpu": "numpy"}


def kernels_listing(op: str | None = None, backend: str | None = None) -> dict[str, Any]:
    """Variants matching the filters, with notes: which op a function name belongs to
    (``gelu`` -> activation), whether this host can run a backend, and, when nothing
    matches, why."""
    from dnnctl.backends.registry import get_backend
    from dnnctl.errors import UsageError
    from dnnctl.ops import registry  # NumPy and the op registry only where they are needed

    notes: list[str] = []
    if backend is not None:
        if backend.lower() not in _BACKEND_ALIASES:
            raise UsageError(f"unknown backend {backend!r}",
                             hint="backends: cupy (CUDA GPUs; also 'cuda') and numpy (CPU)")
        backend = _BACKEND_ALIASES[backend.lower()]
    names = list(registry.ops())
    if op is not None and op not in names:
        owner = _op_of(op)
        if owner is None:
            registry.get_op(op)  # raises: unknown op, with the known ones
        assert owner is not None
        notes.append(f"{op!r} is not an op: it is {owner[0]} {owner[1]}={op}"
                     + (f" ({' and '.join(owner[2])} also take activation={op} as a fused "
                        "epilogue)" if owner[2] else "") + f"; showing {owner[0]}")
        op = owner[0]
    rows = []
    for name in [op] if op else names:
        for v in registry.variants(name, backend):
            rows.append({
                "op": name, "backend": v.backend, "variant": v.name,
                "params": {k: list(vals) for k, vals in v.params.items()},
                "deterministic": v.deterministic, "source": v.source, "doc": v.doc,
            })
    why = None
    for b in sorted({r["backend"] for r in rows} | ({backend} if backend else set())):
        ok, reason = get_backend(b).availability()
        if not ok:
            notes.append(f"{b} variants cannot run on this host: {reason}")
    if not rows:
        others = sorted({v.backend for v in registry.variants(op or "", None)}) if op else []
        why = (f"{op} has no {backend} variants" + (f" (it has {', '.join(others)} ones)"
                                                     if others else "")
               if op else f"no op has {backend} variants registered")
    return {"schema": "dnnctl-kernels/1", "op": op, "backend": backend, "variants": rows,
            "notes": notes, "why_empty": why}


def _op_of(name: str) -> tuple[str, str, list[str]] | None:
    """The op whose function / mode field takes ``name`` (gelu -> activation fn), the field,
    and other ops that take it as an epilogue."""
    from dnnctl.ops import registry

    hits = []
    for op_name, op in registry.ops().items():
        for field_name in ("fn", "mode", "activation"):
            spec = op.fields.get(field_name)
            if spec is not None and name in (spec.choices or ()):
                hits.append((op_name, field_name))
    if not hits:
        return None
    hits.sort(key=lambda h: h[1] == "activation")  # the op that *is* the function first
    return hits[0][0], hits[0][1], [o for o, _ in hits[1:]]


# -- compat (the matrix as a planning tool) ----------------------------------------------------


def compat_check(*, gpu: str | None = None, driver: str | None = None, cuda: str | None = None,
                 cudnn: str | None = None, torch: str | None = None,
                 tensorflow: str | None = None, jax: str | None = None,
                 cupy: Sequence[str] = (), python: str | None = None,
                 matrix: Sequence[str | os.PathLike[str]] = ()) -> DoctorReport:
    """Judge a planned deployment (any subset of the flags) exactly as doctor would."""
    from dnnctl.compat.matrix import load_matrix
    from dnnctl.doctor.model import DoctorReport
    from dnnctl.doctor.planned import Plan, plan_snapshot
    from dnnctl.doctor.rules import judge
    from dnnctl.errors import UsageError

    plan = Plan(gpu, driver, cuda, cudnn, torch, tensorflow, jax, list(cupy), python)
    if not any((gpu, driver, cuda, cudnn, torch, tensorflow, jax, cupy)):
        raise UsageError("nothing to check", hint="give at least one of --gpu --driver --cuda "
                         "--cudnn --torch --tensorflow --jax --cupy")
    table = load_matrix([Path(m) for m in matrix])
    env = plan_snapshot(plan)
    for g in env.gpus:  # what the matrix knows fills in what the plan left out
        model = table.gpu(g.name) if g.name else None
        if model is not None and g.compute_capability is None:
            g.compute_capability = model["cc"]
    return DoctorReport(env, judge(env, table), origin="planned deployment")


def compat_suggest(gpu: str, *, driver: str | None = None, framework: str | None = None,
                   python: str | None = None,
                   matrix: Sequence[str | os.PathLike[str]] = ()) -> dict[str, Any]:
    """Working combinations for ``gpu`` (name or compute capability), newest first."""
    from dnnctl.compat.matrix import load_matrix
    from dnnctl.compat.queries import suggest

    return suggest(load_matrix([Path(m) for m in matrix]), gpu, driver=driver,
                   framework=framework, python=python)


def compat_show(table: str, filters: Sequence[str] = (),
                matrix: Sequence[str | os.PathLike[str]] = ()) -> dict[str, Any]:
    """One matrix table (gpus, archs, cuda, cudnn, torch, tensorflow, jax, cupy), filtered."""
    from dnnctl.compat.matrix import load_matrix
    from dnnctl.compat.queries import show

    return show(load_matrix([Path(m) for m in matrix]), table, filters)


# ----------------------------------------------------------------------------- tune & plans


def tune(workload: str | None = None, *, op: str | None = None,
         key: dict[str, Any] | str | None = None,
         workload_options: WorkloadOptions | Mapping[str, Any] | None = None,
         progress: Any = None, ray: str | None = None, options: TuneOptions | None = None
         ) -> Any:
    """Tune a bundled workload (``"resnet50:batch=32"``), a workload file, one problem
    (``op`` + ``key``) or, with none of these, the small default workload; write the plan.

    ``options``: a :class:`dnnctl.tune.tuner.TuneOptions` (device, devices, output, budget_s,
    candidate_timeout_s, strategy, max_evals, resume, deterministic, ops, seed, policy, ...;
    the defaults when None). ``workload_options``: a
    :class:`dnnctl.workloads.WorkloadOptions` (batch, seq, dtype, layout) or a mapping of a
    bundled workload's options. ``ray``: tune on a Ray cluster at this address ("" for Ray's
    default: $RAY_ADDRESS or a local cluster). Returns a
    :class:`dnnctl.tune.report.TuneReport`.
    """
    from dnnctl.backends.registry import parse_device
    from dnnctl.errors import UsageError
    from dnnctl.ops import registry
    from dnnctl.tune.tuner import TuneOptions
    from dnnctl.tune.tuner import tune as _tune
    from dnnctl.workloads import (
        Workload,
        default_workload,
        key_with_defaults,
        parse_kv,
        resolve,
    )

    opts = options if options is not None else TuneOptions()
    if not isinstance(opts, TuneOptions):
        raise UsageError(f"options must be a TuneOptions, not {type(opts).__name__}",
                         hint="from dnnctl.tune.tuner import TuneOptions")
    wl_opts = _given(workload_options)
    if op is not None or key is not None:
        if workload is not None:
            raise UsageError("give a workload or --op/--key, not both")
        if op is None or key is None:
            raise UsageError("--op and --key go together",
                             hint="e.g. --op matmul --key m=512,n=512,k=512,dtype=float16")
        if wl_opts:
            names = ", ".join(f"--{k}" for k in wl_opts)
            raise UsageError(f"{names} applies to bundled workloads, not to --op/--key",
                             hint="put it in the key instead, e.g. --key ...,"
                                  + ",".join(f"{k}={v}" for k, v in wl_opts.items()))
        for mod in registry.plugin_modules():
            __import__(mod)
        if not isinstance(key, (str, dict)):
            raise UsageError(f"key must be 'name=value,...' text or a mapping, not "
                             f"{type(key).__name__}")
        raw = parse_kv(key) if isinstance(key, str) else dict(key)
        wl = Workload(f"{op}")
        wl.add(op, key_with_defaults(op, raw, parse_device(opts.device)[0]))
    elif workload is not None:
        wl = resolve(workload, **wl_opts)
    else:
        if wl_opts:
            from dnnctl.workloads import build

            backend, _ = parse_device(opts.device)
            base = {"dtype": "float16", "layout": "NHWC"} if backend == "cupy" else {}
            wl = build("default", **{**base, **wl_opts})
        else:
            wl = default_workload(parse_device(opts.device)[0])
    if ray is not None:
        from dnnctl.tune.ray_fleet import tune_on_ray

        return tune_on_ray(wl, opts, ray or None, progress=progress)
    return _tune(wl, opts, progress=progress)


def workload_from_onnx(model: str | os.PathLike[str], output: str | os.PathLike[str] | None,
                       *, batch: int | None = None, dtype: str | None = None,
                       dims: Sequence[str] | dict[str, int] | None = None,
                       layout: str = "NCHW", name: str | None = None) -> dict[str, Any]:
    """Read an ONNX model into a workload (written to ``output`` when given); return the
    import summary (``dnnctl-onnx-import/1``: mapped, fused and unimplemented nodes)."""
    from dnnctl.workloads import write_workload
    from dnnctl.workloads.onnx import parse_dims
    from dnnctl.workloads.onnx import workload_from_onnx as _from_onnx

    bound = dict(dims) if isinstance(dims, dict) else parse_dims(list(dims or ()))
    result = _from_onnx(model, batch=batch, dtype=dtype, dims=bound, layout=layout, name=name)
    if output is not None and result.workload.items:
        check_replaceable(output, "dnnctl-workload", inputs=(model,))
        write_workload(result.workload, output)
    info = result.to_dict()
    info["output"] = None if output is None or not result.workload.items else str(output)
    info["items"] = [{"op": it.problem.op, "key": it.problem.as_dict(), "count": it.count}
                     for it in result.workload.items]
    return info


def list_workloads() -> list[dict[str, Any]]:
    """The bundled workloads with their options and problem counts at default options."""
    from dnnctl.workloads import bundled

    return [{"name": b.name, "doc": b.doc, "options": b.options} for b in bundled()]


def plan_show(path: str | os.PathLike[str], op: str | None = None) -> dict[str, Any]:
    """Every section and entry of a plan (only those of ``op`` when given), plus whether a
    section serves this machine."""
    from dnnctl.plan import read_plan

    info = _plan_info(read_plan(path), path)
    if op:
        for s in info["sections"]:
            s["entries"] = [e for e in s["entries"] if e["op"] == op]
    return info


def _plan_info(plan: Any, path: str | os.PathLike[str]) -> dict[str, Any]:
    sections = _section_rows(plan)
    for row, s in zip(sections, plan.sections):
        row["entries"] = [{
            "op": e.problem.op, "key": e.problem.as_dict(), "choice": e.choice.label(),
            "variant": e.choice.variant, "params": e.choice.param_dict,
            "median_us": e.stats.median_us if e.stats else None,
            "speedup_vs_default": e.speedup_vs_default(),
            "speedup_vs_runner_up": e.speedup_vs_runner_up(),
            "tried": e.tried, "failed": dict(e.failed), "pinned": e.pinned}
            for e in s.entries]
    return {"plan": str(path), "schema": "dnnctl-plan/1", "sections": sections}


def _section_rows(plan: Any) -> list[dict[str, Any]]:
    """Each section's device, digest and whether it serves this machine (no entries)."""
    from dnnctl.plan import kernels_digest
    from dnnctl.plan.schema import same_device
    from dnnctl.plan.sections import this_device

    here = {}
    for spec in ("cpu", None):
        dev = this_device(spec)
        if dev is not None:
            here[dev.backend] = dev.fingerprint()
    digest = kernels_digest()
    rows = []
    for i, s in enumerate(plan.sections):
        fp = here.get(s.backend)
        matches = fp is not None and same_device(s.device, fp)
        rows.append({
            "index": i, "device": dict(s.device), "label": s.label(),
            "kernels_digest": s.kernels_digest, "created": s.created, "tuning": dict(s.tuning),
            "this_machine": matches and s.kernels_digest == digest,
            "stale_kernels": matches and s.kernels_digest != digest})
    return rows


def plan_validate(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Validate a plan (raises PlanError naming file, entry and field) and summarize it.

    Besides the schema, every entry's variant must ``supports()`` its key (and accept its
    parameters) on the section's device.
    """
    from dnnctl.plan import read_plan
    from dnnctl.plan.support import check_plan_support

    plan = read_plan(path)
    check_plan_support(plan)
    return {"plan": str(path), "valid": True, "sections": [
        {"index": row["index"], "label": row["label"], "entries": len(s.entries),
         "this_machine": row["this_machine"], "stale_kernels": row["stale_kernels"]}
        for row, s in zip(_section_rows(plan), plan.sections)]}


def plan_diff(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> dict[str, Any]:
    """What changed from plan A to plan B, per device section."""
    from dnnctl.plan import read_plan
    from dnnctl.plan.compare import diff_plans

    return diff_plans(read_plan(a), read_plan(b))


def plan_merge(a: str | os.PathLike[str], b: str | os.PathLike[str],
               output: str | os.PathLike[str], prefer: str = "faster") -> dict[str, Any]:
    """Merge plans A and B into ``output``; report the conflicts.

    A and B are read under the output's lock (a locked read-modify-write when the output is
    one of them), so concurrent merges and tunes into one file lose nothing.
    """
    from dnnctl.plan import read_plan
    from dnnctl.plan.compare import merge_plans
    from dnnctl.plan.io import rebuild_plan

    conflicts: list[dict[str, Any]] = []

    def build() -> Any:
        merged, found = merge_plans(read_plan(a), read_plan(b), prefer)
        conflicts[:] = found
        return merged

    check_replaceable(output, "dnnctl-plan")
    merged = rebuild_plan(output, build)
    return {"output": str(output), "sections": len(merged.sections),
            "entries": sum(len(s.entries) for s in merged.sections), "conflicts": conflicts,
            "prefer": prefer}


def plan_coverage(plan: str | os.PathLike[str], workload: str, section: int | None = None,
                  workload_options: WorkloadOptions | Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
    """Which problems of ``workload`` the plan would hit, fall back on, or miss."""
    from dnnctl.plan import read_plan
    from dnnctl.plan.coverage import coverage
    from dnnctl.workloads import resolve

    return coverage(read_plan(plan), resolve(workload, **_given(workload_options)), section)


def _given(options: WorkloadOptions | Mapping[str, Any] | None) -> dict[str, Any]:
    """The workload options that were set (a WorkloadOptions or a mapping), by name."""
    if options is None or isinstance(options, Mapping):
        return {k: v for k, v in (options or {}).items() if v is not None}
    return options.given()


def plan_report(path: str | os.PathLike[str], output: str | os.PathLike[str], *,
                png_dir: str | os.PathLike[str] | None = None,
                against: str | os.PathLike[str] | None = None,
                ceilings: str | dict[str, float] | None = None) -> dict[str, Any]:
    """Write a self-contained HTML report of a plan (figures embedded; extra ``plots``)."""
    from dnnctl.plan.report import build_report, parse_ceilings

    ceil = parse_ceilings(ceilings) if isinstance(ceilings, str) or ceilings is None \
        else dict(ceilings)
    check_replaceable(output, "html", inputs=(path, *([against] if against else [])))
    return build_report(path, output, png_dir=png_dir, against=against, ceilings=ceil)


def plan_pin(path: str | os.PathLike[str], op: str | None = None,
             key: dict[str, Any] | str | None = None, *, variant: str | None = None,
             params: dict[str, Any] | str | None = None, unpin: bool = False,
             all_entries: bool = False, section: int | None = None) -> dict[str, Any]:
    """Pin / unpin plan entries (see :func:`dnnctl.plan.pin.pin`); ``key`` and ``params``
    may be ``k=v,...`` text."""
    from dnnctl.plan.pin import pin
    from dnnctl.workloads import parse_kv

    parsed = parse_kv(key) if isinstance(key, str) else key
    if params and not variant:
        from dnnctl.errors import UsageError

        raise UsageError("plan pin: --param sets the parameters of a --variant",
                         hint="give --variant too (dnnctl kernels list --op OP names them)")
    if isinstance(params, str):
        params = {k: _param_value(v) for k, v in parse_kv(params).items()}
    return pin(path, op, parsed, variant=variant, params=params, unpin=unpin,
               all_entries=all_entries, section=section)


def _param_value(text: str) -> Any:
    """CLI parameter text -> the YAML scalar it spells (int, float, bool or text)."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool, str)) else text


# -- compat (the matrix as a planning tool) ----------------------------------------------------


# -- doctor ---------------------------------------------------------------------------------


def doctor(*, from_file: str | os.PathLike[str] | None = None, deep: bool = False,
           matrix: Sequence[str | os.PathLike[str]] = (), save: str | os.PathLike[str] | None = None,
           timeout: float | None = None, deep_timeout: float | str | None = None,
           while_probing: Callable[[], object] | None = None, errors: Sequence[str] = (),
           error_files: Sequence[str | os.PathLike[str]] = ()) -> DoctorReport:
    """Judge this machine's GPU stack (or a saved / hand-written snapshot) against the matrix.

    ``from_file`` loads a ``dnnctl-env/1`` snapshot instead of probing; ``deep`` also asks
    each installed framework in a subprocess (each under ``deep_timeout`` seconds, default
    ``$DNNCTL_DEEP_TIMEOUT`` or 60); ``matrix`` adds overlay files; ``save`` writes the
    snapshot (atomically) before it is judged. With timing on (dnnctl.doctor.timing) the
    report carries wall ms per step. ``while_probing`` is called on this thread while the
    probes run (the command line imports its renderer then). ``errors`` (messages seen) and
    ``error_files`` (logs whose lines the error catalogue recognizes) are added to the
    snapshot's ``errors`` (dnnctl.doctor.error_log), so --save keeps them. Raises UsageError /
    InputFileError for bad arguments and unreadable files; never for what the probes find.
    """
    from dnnctl.doctor import timing
    from dnnctl.errors import UsageError

    if from_file is not None and deep:
        raise UsageError("--deep probes this machine, so it cannot be combined with --from",
                         hint="drop --deep to judge the snapshot file, or --from to probe here")
    if from_file is not None:
        from dnnctl.compat.matrix import load_matrix
        from dnnctl.doctor.envfile import load_env  # PyYAML only when a file is read

        env = load_env(from_file)
        table = load_matrix([Path(m) for m in matrix])
        if while_probing is not None:
            while_probing()
    else:
        with timing.span("import: detect, probes"):
            from dnnctl.doctor.background import Task
            from dnnctl.doctor.deep import resolve_deep_timeout
            from dnnctl.doctor.detect import detect

        limit = resolve_deep_timeout(deep_timeout) if deep else None  # bad value: UsageError
        # the probes mostly wait on child processes: import and load the rest meanwhile
        with timing.span("detect (all probes)"):
            probing = Task(lambda: detect(deep=deep, timeout=timeout, deep_timeout=limit))
            with timing.span("import: matrix, rules; matrix load"):
                from dnnctl.compat.matrix import load_matrix

                table = load_matrix([Path(m) for m in matrix])
                import dnnctl.doctor.rules  # noqa: F401
            if while_probing is not None:
                with timing.span("while probing: the command line's own imports"):
                    while_probing()
            env = probing.result()
    from dnnctl.doctor.model import DoctorReport
    from dnnctl.doctor.rules import judge

    if errors or error_files:
        from dnnctl.doctor.error_log import gather

        extra, notes = gather(errors, error_files, table)
        env.errors = list(dict.fromkeys([*env.errors, *extra]))
        env.notes += notes
    if save is not None:
        from dnnctl.doctor.envfile import save_env

        check_replaceable(save, "dnnctl-env", inputs=(from_file,) if from_file else ())
        save_env(env, save)
    with timing.span("judge (rules)"):
        findings = judge(env, table)
    report = DoctorReport(env, findings,
                          origin=str(from_file) if from_file is not None else "detected")
    if timing.enabled():
        report.timings = timing.spans()
    return report
