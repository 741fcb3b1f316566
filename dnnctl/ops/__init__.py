"""``dnnctl.ops``: the public op functions, each dispatched to its planned variant.

Names resolve lazily so that ``import dnnctl`` stays fast and CuPy-free.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from typing import Any

# public name -> module that defines it
_PUBLIC: dict[str, str] = {
    **{n: "dnnctl.ops.activation" for n in (
        "relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "relu6", "hardswish",
        "hardsigmoid")},
    **{n: "dnnctl.ops.softmax" for n in ("softmax", "log_softmax")},
    **{n: "dnnctl.ops.rownorm" for n in ("layer_norm", "rms_norm")},
    "batch_norm": "dnnctl.ops.batch_norm",
    "group_norm": "dnnctl.ops.group_norm",
    **{n: "dnnctl.ops.pool" for n in (
        "max_pool2d", "avg_pool2d", "global_avg_pool2d")},
    "conv2d": "dnnctl.ops.conv2d",
    "conv2d_backward_data": "dnnctl.ops.conv2d.backward_function",
    "conv2d_backward_weight": "dnnctl.ops.conv2d.backward_function",
    "matmul": "dnnctl.ops.matmul",
    **{n: "dnnctl.ops.attention" for n in ("attention", "attention_backward")},
    "matmul_backward": "dnnctl.ops.matmul.backward",
    # backward (training) functions
    **{n: "dnnctl.ops.softmax" for n in ("softmax_backward", "log_softmax_backward")},
    **{n: "dnnctl.ops.rownorm" for n in (
        "layer_norm_backward", "rms_norm_backward", "layer_norm_with_stats",
        "rms_norm_with_stats")},
    "batch_norm_backward": "dnnctl.ops.batch_norm",
    "group_norm_backward": "dnnctl.ops.group_norm",
    **{n: "dnnctl.ops.activation" for n in (
        "activation_backward", "relu_backward", "leaky_relu_backward", "gelu_backward",
        "gelu_tanh_backward", "silu_backward", "sigmoid_backward", "tanh_backward",
        "relu6_backward", "hardswish_backward", "hardsigmoid_backward")},
    **{n: "dnnctl.ops.pool.grad" for n in (
        "max_pool2d_with_indices", "max_pool2d_backward", "avg_pool2d_backward",
        "global_avg_pool2d_backward")},
}

__all__ = sorted(_PUBLIC)


def make_callable(module_name: str, fn: Callable[..., Any]) -> None:
    """Let module ``module_name`` be called as ``fn``.

    ``dnnctl.ops.softmax``, ``.batch_norm``, ``.group_norm``, ``.conv2d``, ``.matmul`` and
    ``.attention`` name both a submodule and a public
    function; importing the submodule binds the module on this package (Python does that for
    every submodule), so the module itself must behave as the function."""
    mod = sys.modules[module_name]
    mod.__dnnctl_call__ = fn  # type: ignore[attr-defined]
    # a module class of its own whose __call__ is ``fn`` itself (a static method: called
    # without the module), no forwarding frame
    mod.__class__ = type("_CallableModule", (types.ModuleType,),
                         {"__call__": staticmethod(fn), "__module__": __name__})


def __getattr__(name: str) -> Any:
    mod = _PUBLIC.get(name)
    if mod is None:
        raise AttributeError(f"module 'dnnctl.ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
