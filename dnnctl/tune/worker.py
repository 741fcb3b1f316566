"""The tuning worker: a disposable subprocess that builds, verifies and times candidates.

    python -m dnnctl.tune.worker --backend cupy --device 0

One JSON request per line on stdin, one JSON reply per line on a private copy of stdout
(file descriptor 1 itself is pointed at stderr, so a kernel library that prints cannot
corrupt the protocol). An illegal address, a hang or a segfault takes down this process
only; the leader marks the candidate and starts a new worker. The worker dies with its
leader (PR_SET_PDEATHSIG), ignores Ctrl-C (the leader decides), and loads plugin modules
from $DNNCTL_PLUGINS like every other process.

Requests: ``hello``; ``prepare`` (fresh random inputs and the float64 reference of one
problem, kept for the following requests); ``eval`` (build, verify on inputs copied fresh
with NaN-poisoned outputs, then time); ``retime`` (the leaders, interleaved in rounds);
``build`` (compile only: build helpers fill the kernel cache ahead of the measurements).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.backends.base import Backend, DeviceInfo
from dnnctl.backends.registry import require_backend
from dnnctl.ops import registry
from dnnctl.ops.base import (
    Kernel,
    Op,
    Problem,
    Variant,
    VerifyResult,
    error_norm,
    np_dtype,
    verify_outputs,
)
from dnnctl.ops.check import Prepared, prepare
from dnnctl.ops.dispatch import adopting, adoption_error
from dnnctl.ops.torch_vendor import native_io
from dnnctl.tune.candidates import Candidate
from dnnctl.tune.select import combine_rounds
from dnnctl.tune.timer import TimingPolicy, measure, summarize

WORKER_ENV = "DNNCTL_TUNE_WORKER"  # set inside workers (plugins may look at it)


class Evaluator:
    """Request handlers; holds the prepared problem (inputs and reference)."""

    def __init__(self, backend: Backend, device: DeviceInfo):
        self.backend = backend
        self.device = device
        self.problem: Problem | None = None
        self.op: Op | None = None
        self.prep: Prepared | None = None
        self.refs_dev: dict[str, Any] | None = None
        self.denoms: dict[str, float] = {}

    def handle(self, req: Mapping[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "hello":
            dev = self.device.to_dict()
            dev.pop("extra", None)
            return {"status": "ok", "device": dev, "fingerprint": self.device.fingerprint(),
                    "pid": os.getpid()}
        if cmd == "prepare":
            return self.prepare(req)
        if cmd == "eval":
            return self.evaluate(req)
        if cmd == "retime":
            return self.retime(req)
        if cmd == "build":
            return self.build(req)
        return {"status": "error", "detail": f"unknown request {cmd!r}"}

    # ------------------------------------------------------------------ problem data

    def prepare(self, req: Mapping[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        op = registry.get_op(req["op"])
        problem = op.problem(req["key"])
        self.problem, self.op, self.prep, self.refs_dev = None, None, None, None
        _free_pool(self.backend)
        rng = np.random.default_rng(int(req.get("seed", 0)))
        self.prep = prepare(op, problem, self.backend, rng)
        self.refs_dev = None
        if self.backend.name != "numpy":  # compare on the device: no big copies per candidate
            xp = self.backend.xp
            self.refs_dev = {k: xp.asarray(v, dtype=xp.float64) for k, v in
                             self.prep.refs.items()}
            self.denoms = {k: error_norm(v, self.prep.scales.get(k))
                           for k, v in self.prep.refs.items()}
        self.problem, self.op = problem, op
        return {"status": "ok", "elapsed_s": time.perf_counter() - t0}

    def _verify(self, op: Op, problem: Problem, outputs: Mapping[str, Any], prep: Prepared
                ) -> VerifyResult:
        """Every output against the float64 reference with the op's tolerance."""
        if self.refs_dev is None:
            got = {k: self.backend.to_numpy(v) for k, v in outputs.items()}
            return verify_outputs(op, problem, got, prep.refs, prep.scales)
        errors, bad = {}, []
        for name, ref in self.refs_dev.items():
            err = rel_err_xp(self.backend.xp, outputs[name], ref, self.denoms.get(name))
            errors[name] = err
            tol = op.tolerance(problem, name)
            if not err <= tol:
                bad.append(f"{name}: rel err {err:.3g} > tol {tol:.3g}")
        return VerifyResult(not bad, max(errors.values(), default=0.0), "; ".join(bad), errors)

    def _require(self, req: Mapping[str, Any]) -> tuple[Op, Problem, Prepared]:
        op = registry.get_op(req["op"])
        problem = op.problem(req["key"])
        if self.prep is None or problem != self.problem or self.op is None:
            raise RuntimeError("protocol: 'prepare' this problem first")
        return self.op, problem, self.prep

    def _fresh(self, op: Op, problem: Problem, prep: Prepared) -> tuple[dict, dict]:
        """Inputs copied from the pristine ones, outputs poisoned with NaN."""
        xp = self.backend.xp
        inputs = {k: xp.array(v, copy=True) for k, v in prep.inputs.items()}
        outputs = {}
        for name, spec in op.output_specs(problem).items():
            arr = self.backend.empty(spec.shape, np_dtype(spec.dtype))
            self.backend.poison(arr)
            outputs[name] = arr
        return inputs, outputs

    def _kernel(self, variant: Variant, problem: Problem, cand: Candidate) -> Kernel:
        """Build ``cand`` (of ``variant``). Not kept: a built kernel may hold workspace or
        library plans, and a problem has hundreds of candidates (compiled modules are
        memoized by the backend, so building again for the re-timing is cheap)."""
        return variant.build(problem, cand.param_dict, self.device)

    # ------------------------------------------------------------------ evaluation

    def build(self, req: Mapping[str, Any]) -> dict[str, Any]:
        """Only build (compile) a candidate: fills the on-disk kernel cache ahead of time."""
        t0 = time.perf_counter()
        try:
            problem = registry.get_op(req["op"]).problem(req["key"])
            variant = registry.get_variant(problem.op, self.backend.name, req["variant"])
            variant.build(problem, dict(req.get("params") or {}), self.device)
        except Exception as exc:
            return {"status": "error", "detail": f"{type(exc).__name__}: {exc}"[:500],
                    "fatal": not healthy(self.backend)}
        return {"status": "ok", "elapsed_s": time.perf_counter() - t0}

    def evaluate(self, req: Mapping[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        op, problem, prep = self._require(req)
        cand = Candidate.of(req["variant"], req.get("params") or {})
        policy = TimingPolicy.from_dict(req["policy"])
        variant = registry.get_variant(problem.op, self.backend.name, cand.variant)
        ws = int(variant.workspace_bytes(problem, cand.param_dict))
        free = free_bytes(self.backend)
        if free is not None and ws > 0.9 * free:
            return {"status": "oom", "workspace_bytes": ws,
                    "detail": f"needs {ws} bytes of workspace, {free} free",
                    "elapsed_s": time.perf_counter() - t0}
        try:
            kernel = self._kernel(variant, problem, cand)
            inputs, outputs = self._fresh(op, problem, prep)
            # a kernel that adopts its outputs is verified and timed as the run-time
            # pipeline calls it: without outputs, on the ones it returns
            given: dict[str, Any] = {} if adopting(kernel) else outputs
            # a library called through torch is run as a torch caller runs it (native_io)
            with native_io(variant, inputs) as (args, to_backend):
                made = to_backend(kernel(args, given, prep.attrs))
                self.backend.synchronize()
                if given is not outputs:
                    bad = adoption_error(op.output_specs(problem), made)
                    if bad:
                        return {"status": "wrong", "max_rel_err": None,
                                "workspace_bytes": ws, "detail": bad,
                                "elapsed_s": time.perf_counter() - t0}
                    outputs = made
                check = self._verify(op, problem, outputs, prep)
                err = check.max_rel_err if np.isfinite(check.max_rel_err) else None
                if not check.ok:
                    return {"status": "wrong", "max_rel_err": err, "workspace_bytes": ws,
                            "detail": check.detail or "output differs from the reference",
                            "elapsed_s": time.perf_counter() - t0}
                samples = measure(self.backend, lambda: kernel(args, given, prep.attrs),
                                  policy)
            t = summarize(samples)
        except Exception as exc:  # becomes a failed candidate, never a failed run
            return self._failure(exc, ws, t0)
        return {"status": "ok", "median_us": t.median_us, "p20_us": t.p20_us,
                "p80_us": t.p80_us, "n": t.n, "max_rel_err": err, "workspace_bytes": ws,
                "elapsed_s": time.perf_counter() - t0}

    def retime(self, req: Mapping[str, Any]) -> dict[str, Any]:
        """Re-time the leaders in interleaved rounds (rotating who goes first)."""
        op, problem, prep = self._require(req)
        policy = TimingPolicy.from_dict(req["policy"])
        cands = [Candidate.of(d["variant"], d.get("params") or {}) for d in req["candidates"]]
        runs = []
        try:
            with contextlib.ExitStack() as stack:
                for cand in cands:
                    variant = registry.get_variant(problem.op, self.backend.name, cand.variant)
                    kernel = self._kernel(variant, problem, cand)
                    inputs, outputs = self._fresh(op, problem, prep)
                    args, _ = stack.enter_context(native_io(variant, inputs))
                    runs.append((cand, kernel, args, {} if adopting(kernel) else outputs))
                rounds: dict[Candidate, list[list[float]]] = {c: [] for c in cands}
                warm = min(policy.warmup_ms, 5.0)
                for r in range(max(1, policy.retime_rounds)):
                    k = r % len(runs)
                    for cand, kernel, inputs, outputs in runs[k:] + runs[:k]:
                        s = measure(self.backend, lambda kn=kernel, i=inputs, o=outputs:
                                    kn(i, o, prep.attrs), policy,
                                    budget_ms=policy.retime_budget_ms, warmup_ms=warm)
                        rounds[cand].append([float(x) for x in s])
        except Exception as exc:
            return self._failure(exc, 0, time.perf_counter())
        out = []
        for cand in cands:
            rt = combine_rounds(cand, rounds[cand])
            out.append({**cand.to_dict(), "median_us": rt.timing.median_us,
                        "p20_us": rt.timing.p20_us, "p80_us": rt.timing.p80_us,
                        "n": rt.timing.n, "round_medians": list(rt.round_medians)})
        return {"status": "ok", "leaders": out}

    def _failure(self, exc: BaseException, ws: int, t0: float) -> dict[str, Any]:
        status = classify(exc)
        detail = f"{type(exc).__name__}: {exc}".strip()
        tb = traceback.format_exc(limit=6)
        if status == "oom":
            _free_pool(self.backend)
        fatal = not healthy(self.backend)
        return {"status": status, "workspace_bytes": ws, "detail": detail[:1500],
                "traceback": tb[-3000:], "fatal": fatal, "elapsed_s": time.perf_counter() - t0}


def rel_err_xp(xp: Any, out: Any, ref: Any, denom: float | None = None) -> float:
    """:func:`dnnctl.ops.base.rel_norm_error` computed with ``xp`` (on the device for CuPy):
    ‖out − ref‖ / ‖ref‖ in float64 (``denom`` replaces ‖ref‖: the op's error scale, see
    :func:`dnnctl.ops.base.error_norm`); non-finite reference positions must be matched
    exactly and are left out of the norms; NaN / inf elsewhere gives inf."""
    if tuple(out.shape) != tuple(ref.shape):
        return math.inf
    out = out.astype(xp.float64)
    ref_bad = ~xp.isfinite(ref)
    if bool(ref_bad.any()):
        same = (xp.isnan(ref) & xp.isnan(out)) | (xp.isinf(ref) & (out == ref))
        if not bool(xp.all(same[ref_bad])):
            return math.inf
        good = ~ref_bad
        out, ref = out[good], ref[good]
    if not bool(xp.all(xp.isfinite(out))):
        return math.inf
    if denom is None:
        denom = float(xp.linalg.norm(ref.ravel()))
    diff = float(xp.linalg.norm((out - ref).ravel()))
    if denom == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / denom


def classify(exc: BaseException) -> str:
    """'oom' for out-of-memory errors (host or device), else 'crashed'."""
    name = type(exc).__name__
    text = str(exc).lower()
    if isinstance(exc, MemoryError) or "outofmemory" in name.lower() or \
            "out of memory" in text or "out_of_memory" in text:
        return "oom"
    return "crashed"


def healthy(backend: Backend) -> bool:
    """Whether the device still works after an error (an illegal address poisons the CUDA
    context for good: then the worker must be replaced)."""
    try:
        backend.synchronize()
        probe = backend.asarray(np.arange(4, dtype=np.float32))
        return bool(backend.to_numpy(probe)[3] == 3.0)
    except Exception:
        return False


def free_bytes(backend: Backend) -> int | None:
    """Free device memory plus what the array pool holds unused (None on the CPU)."""
    if backend.name != "cupy":
        return None
    try:
        cp = backend.xp
        free, _total = cp.cuda.runtime.memGetInfo()
        pool = cp.get_default_memory_pool()
        return int(free) + int(pool.free_bytes())
    except Exception:
        return None


def _free_pool(backend: Backend) -> None:
    pool = getattr(backend.xp, "get_default_memory_pool", None)
    if pool is not None:
        try:
            pool().free_all_blocks()
        except Exception:
            pass


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the leader dies (even by kill -9), so no orphan keeps a GPU."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dnnctl.tune.worker")
    ap.add_argument("--backend", required=True, choices=("cupy", "numpy"))
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--parent", type=int, default=0, help="leader pid (exit if it is gone)")
    ap.add_argument("--nice", type=int, default=0, help="lower the CPU priority (build helpers)")
    args = ap.parse_args(argv)
    if args.nice:
        try:
            os.nice(args.nice)
        except OSError:
            pass
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    if args.parent and os.getppid() != args.parent:
        return 0  # the leader died before we could ask to die with it
    faulthandler.enable()
    os.environ[WORKER_ENV] = "1"

    def reply(msg: dict[str, Any]) -> None:
        proto.write(json.dumps(msg, default=str) + "\n")
        proto.flush()

    try:
        registry.load_all()
        backend = require_backend(args.backend)
        backend.use_device(args.device)
        ev = Evaluator(backend, backend.device(args.device))
    except Exception as exc:
        reply({"status": "error", "detail": f"worker cannot start: {type(exc).__name__}: {exc}",
               "fatal": True})
        return 2
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if req.get("cmd") == "exit":
                break
            msg = ev.handle(req)
        except Exception as exc:
            msg = {"status": "error", "detail": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(limit=6)[-3000:],
                   "fatal": not healthy(ev.backend)}
        reply(msg)
        if msg.get("fatal"):
            proto.close()
            os._exit(3)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
