"""dnnctl: doctor for the GPU deep-learning stack, cuDNN-class kernels, per-shape autotuning.

Run-time API::

    import dnnctl
    plan = dnnctl.load_plan("plan.yaml")
    y = dnnctl.ops.conv2d(x, w, padding=1, activation="relu", plan=plan)
    with dnnctl.use_plan(plan):
        p = dnnctl.ops.softmax(logits)
    with dnnctl.use_deterministic():  # no run-to-run variation (torch callers: also
        ...                           # torch.use_deterministic_algorithms(True))

Importing dnnctl needs neither a GPU nor CuPy.
"""

from __future__ import annotations

from typing import Any

from dnnctl import ops
from dnnctl._version import __version__
from dnnctl.errors import DnnctlError

__all__ = ["DnnctlError", "__version__", "load_plan", "ops", "use_deterministic", "use_plan"]


def __getattr__(name: str) -> Any:
    # use_plan lives with the dispatcher (NumPy); importing it lazily keeps `import dnnctl`
    # (and so every CLI start, doctor included) free of NumPy.
    if name == "use_plan":
        from dnnctl.ops.dispatch import use_plan

        return use_plan
    if name == "use_deterministic":
        from dnnctl.ops.registry import use_deterministic

        return use_deterministic
    raise AttributeError(f"module 'dnnctl' has no attribute {name!r}")


def load_plan(path: str, **kwargs: Any) -> Any:
    """Load and validate a plan file; select the section matching the running device.

    See :func:`dnnctl.plan.load_plan` for the options (``strict``, ``device``,
    ``record_misses``).
    """
    from dnnctl.plan import load_plan as _load

    return _load(path, **kwargs)
