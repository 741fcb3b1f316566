"""The code :mod:`dnnctl.torch.pointwise` generates for a chain, rendered: as CUDA (the
kernel NVRTC compiles) and as Python (:func:`run_python` runs it element by element on CPU
tensors, for the tests). Both render the same neutral statements, so what the CPU checks is
what the GPU runs, down to each value's rounding to its dtype."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

# ----------------------------------------------------------------------------- rendering

_CUDA_OPS = {
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
    "neg": "(-{a})", "relu": "({a} > 0.f ? {a} : ({a} != {a} ? {a} : 0.f))",
    "silu": "({a} / (1.f + expf(-{a})))", "sigmoid": "(1.f / (1.f + expf(-{a})))",
    "tanh": "tanhf({a})", "exp": "expf({a})", "sqrt": "sqrtf({a})", "rsqrt": "rsqrtf({a})",
    "abs": "fabsf({a})", "cos": "cosf({a})", "sin": "sinf({a})", "log": "logf({a})",
    "gelu": "(0.5f * {a} * (1.f + erff({a} * 0.70710678118654752f)))",
    "gelu_tanh": "(0.5f * {a} * (1.f + tanhf(0.7978845608028654f * ({a} + 0.044715f * {a} "
                 "* {a} * {a}))))",
    "pow": "_pw_pow({a}, {b})",
}


class _Render:
    """Renders the neutral statements (see _Codegen) in one language."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def expr(self, e: Any) -> str:
        tag = e[0]
        if tag == "param":
            return f"p{e[1]}"
        if tag == "var":
            return e[1]
        if tag == "num":
            v = e[1]
            if self.cuda:
                return repr(float(v)) + "f" if math.isfinite(v) else (
                    "(__int_as_float(0x7f800000))" if v > 0 else "(-__int_as_float(0x7f800000))")
            return repr(float(v)) if math.isfinite(v) else f"float('{v}')"
        if tag == "num_i":
            return str(e[1])
        if tag == "idx":
            return f"i{e[1]}"
        if tag in ("add_i", "mul_i", "sub_i", "lt_i"):
            sym = {"add_i": "+", "mul_i": "*", "sub_i": "-", "lt_i": "<"}[tag]
            return f"({self.expr(e[1])} {sym} {self.expr(e[2])})"
        if tag == "load":
            if self.cuda:
                return f"to_float(in{e[1]}[{self.expr(e[2])}])"
            return f"LOAD({e[1]}, {self.expr(e[2])})"
        if tag == "round":
            inner = self.expr(e[2])
            if self.cuda:
                return inner if e[1] == "float" else f"to_float(from_float<{e[1]}>({inner}))"
            return f"ROUND({e[1]!r}, {inner})"
        if tag == "op":
            a = self.expr(e[2])
            b = None if e[3] is None else self.expr(e[3])
            if self.cuda:
                return _CUDA_OPS[e[1]].format(a=a, b=b)
            return f"OP({e[1]!r}, {a}, {b})"
        raise AssertionError(tag)

    def decompose(self, decomp: Any, out: list[str]) -> None:
        """The linear index ``r`` split into one index a dim, innermost first."""
        const, div, end = ("const I ", "/=", ";") if self.cuda else ("", "//=", "")
        for j, (d, size) in enumerate(decomp):
            s = self.expr(size)
            if j == len(decomp) - 1:
                out.append(f"    {const}i{d} = r{end}")
            else:
                out.append(f"    {const}i{d} = r % {s}; r {div} {s}{end}")

    def stmts(self, body: Any, indent: str, out: list[str]) -> None:
        for s in body:
            tag = s[0]
            if tag == "let":
                out.append(f"{indent}{'const float ' if self.cuda else ''}{s[1]} = "
                           f"{self.expr(s[2])}{';' if self.cuda else ''}")
            elif tag == "decl":
                out.append(f"{indent}float {s[1]};" if self.cuda else f"{indent}{s[1]} = 0.0")
            elif tag == "set":
                out.append(f"{indent}{s[1]} = {self.expr(s[2])}{';' if self.cuda else ''}")
            elif tag == "store":
                if self.cuda:
                    out.append(f"{indent}out[{self.expr(s[1])}] = "
                               f"from_float<OUT_T>({self.expr(s[2])});")
                else:
                    out.append(f"{indent}STORE({self.expr(s[1])}, {self.expr(s[2])})")
            elif tag == "if":
                if len(s[1]) == 1:  # a cat of one part
                    self.stmts(s[1][0][1], indent, out)
                    continue
                for j, (cond, inner) in enumerate(s[1]):
                    if self.cuda:
                        head = ("if" if j == 0 else "} else if") if cond is not None else "} else"
                        out.append(f"{indent}{head}"
                                   f"{'' if cond is None else ' (' + self.expr(cond) + ')'} {{")
                    else:
                        head = ("if" if j == 0 else "elif") if cond is not None else "else"
                        out.append(f"{indent}{head}"
                                   f"{'' if cond is None else ' ' + self.expr(cond)}:")
                    self.stmts(inner, indent + "  ", out)
                if self.cuda:
                    out.append(f"{indent}}}")
            else:
                raise AssertionError(tag)


def cuda_source(key: tuple[Any, ...]) -> str:
    inputs, out_dt, decomp, kinds, body, itype = key
    r = _Render(cuda=True)
    args = [f"const {t}* __restrict__ in{k}" for k, t in enumerate(inputs) if t is not None]
    args += [f"{out_dt}* __restrict__ out", "const I n"]
    args += [f"const {'I' if k == 'i' else 'float'} p{j}" for j, k in enumerate(kinds)]
    lines = ["#include <dnnctl/common.cuh>", "using namespace dnnctl;",
             f"typedef {out_dt} OUT_T;", f"typedef {itype} I;",
             "__device__ __forceinline__ float _pw_pow(float a, float b) {",
             "  return b == 2.f ? a * a : (b == 1.f ? a : (b == 0.5f ? sqrtf(a) : powf(a, b)));",
             "}",
             f'extern "C" __global__ void __launch_bounds__(256) pointwise({", ".join(args)}) {{',
             "  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n;",
             "       i += (I)gridDim.x * blockDim.x) {",
             "    I r = i;"]
    r.decompose(decomp, lines)
    r.stmts(body, "    ", lines)
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def python_source(key: tuple[Any, ...]) -> str:
    _inputs, _out_dt, decomp, _kinds, body, _itype = key
    r = _Render(cuda=False)
    lines = ["def pointwise(n, p, LOAD, STORE, ROUND, OP):", "  for i in range(n):", "    r = i"]
    r.decompose(decomp, lines)
    nparams = len(_kinds)
    lines.insert(1, "  " + "; ".join(f"p{j} = p[{j}]" for j in range(nparams)) if nparams
                 else "  pass")
    r.stmts(body, "    ", lines)
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- Python run


def _py_op(name: str, a: float, b: float | None) -> float:
    if name == "add":
        return a + b
    if name == "sub":
        return a - b
    if name == "mul":
        return a * b
    if name == "div":
        if b == 0:
            return math.copysign(math.inf, a) * math.copysign(1, b) if a else math.nan
        return a / b
    if name == "neg":
        return -a
    if name == "relu":
        return a if (a > 0 or a != a) else 0.0
    if name == "exp":
        return math.exp(a) if a < 700 else math.inf
    if name in ("silu", "sigmoid"):
        s = 1.0 / (1.0 + math.exp(-a)) if a > -700 else 0.0
        return a * s if name == "silu" else s
    if name == "tanh":
        return math.tanh(a)
    if name == "sqrt":
        return math.sqrt(a) if a >= 0 else math.nan
    if name == "rsqrt":
        return 1.0 / math.sqrt(a) if a > 0 else (math.inf if a == 0 else math.nan)
    if name == "abs":
        return abs(a)
    if name in ("cos", "sin"):
        return math.cos(a) if name == "cos" else math.sin(a)
    if name == "log":
        return math.log(a) if a > 0 else (-math.inf if a == 0 else math.nan)
    if name == "gelu":
        return 0.5 * a * (1.0 + math.erf(a / math.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * a * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a ** 3)))
    if name == "pow":
        return a ** b
    raise AssertionError(name)


# each dtype the code takes and its C type
C_TYPES = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
_TORCH_DT = {c: t for t, c in C_TYPES.items()}


def run_python(prog: Any, args: Sequence[Any]) -> torch.Tensor | None:
    """The generated code's Python rendering run element by element on CPU tensors (tests):
    the output as the kernel would write it, None where the kernel would not run."""
    got = prog.signature(args)
    if got is None:
        return None
    sig, params, key = got
    ns: dict[str, Any] = {}
    exec(python_source(key), ns)  # noqa: S102 - code generated here, from the group's ops
    out = torch.empty_strided(sig.out_shape, sig.out_stride, dtype=sig.out_dtype)
    flat_out = out.as_strided((out.untyped_storage().nbytes() // out.element_size(),), (1,), 0)
    flats = []
    for a in args:
        if isinstance(a, torch.Tensor):
            span = 1 + sum((s - 1) * st for s, st in zip(a.shape, a.stride()) if s)
            flats.append(a.as_strided((span,), (1,)).double().tolist())
        else:
            flats.append(None)

    def load(k: int, off: int) -> float:
        return flats[k][off]

    def rnd(dt: str, v: float) -> float:
        return float(torch.tensor(v, dtype=torch.float32).to(_TORCH_DT[dt]).double())

    def store(off: int, v: float) -> None:
        flat_out[off] = v

    ns["pointwise"](sig.numel, params, load, store, rnd, _py_op)
    return out
