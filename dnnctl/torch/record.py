"""``record(model, example_inputs)``: the dnnctl problems a model really runs, as a workload.

The model runs once, patched (as :func:`dnnctl.torch.patch` would route it), with a
recorder on the ops: every call dnnctl runs adds its problem key. ``train=True`` runs a
training step (forward and backward of the outputs' sum) and also records the backward
problems of the ops whose key has a ``pass`` field. The model's parameters, buffers,
gradients and modes are restored afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dnnctl.errors import UsageError
from dnnctl.torch import kernels
from dnnctl.torch.patch import is_patched, patched
from dnnctl.workloads import Workload


def _outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _outputs(o)]
    return []


def record(model: nn.Module, example_inputs: Any, train: bool = False, *,
           plan: Any = None, name: str | None = None) -> Workload:
    """Run ``model(*example_inputs)`` once and return the workload of its dnnctl problems
    (``example_inputs``: one tensor, a tuple / list of positional arguments, or a dict of
    keyword arguments, as ``model(**inputs)`` of a Hugging Face style model)."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"record: expected a torch.nn.Module, got {type(model).__name__}")
    kwargs: dict[str, Any] = {}
    if isinstance(example_inputs, dict):
        inputs: Sequence[Any] = ()
        kwargs = dict(example_inputs)
    else:
        inputs = (example_inputs if isinstance(example_inputs, (tuple, list))
                  else (example_inputs,))
    wl = Workload(name or type(model).__name__ + ("-train" if train else ""))

    def add(op: str, key: dict[str, Any]) -> None:
        wl.add(op, key)

    modes = {m: m.training for m in model.modules()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    grads = {p: p.grad for p in model.parameters()}
    kernels.RECORDERS.append(add)
    try:
        model.train(train)
        with _patched_unless(model, plan):
            if train:
                loss = sum(t.float().sum() for t in _outputs(model(*inputs, **kwargs))
                           if t.requires_grad)
                if isinstance(loss, torch.Tensor):
                    loss.backward()
            else:
                with torch.no_grad():
                    model(*inputs, **kwargs)
    finally:
        kernels.RECORDERS.remove(add)
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(buffers[n])
        for p, g in grads.items():
            p.grad = g
        for m, mode in modes.items():
            m.training = mode
    return wl


class _patched_unless:
    """patched(model) for the block, unless the model is patched already."""

    def __init__(self, model: nn.Module, plan: Any):
        self.ctx = None if is_patched(model) else patched(model, plan)

    def __enter__(self) -> None:
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
