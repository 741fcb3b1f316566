"""dnnctl inside PyTorch: ``torch.ops.dnnctl.*`` operators, model patching and recording.

::

    import dnnctl, dnnctl.torch as dt
    wl = dt.record(model, (x,))             # the problems the model really runs
    wl.save("model.workload.yaml")          # then: dnnctl tune model.workload.yaml -o plan.yaml
    report = dt.patch(model, dnnctl.load_plan("plan.yaml"))  # backward="plan"|"dnnctl"|"torch"
    # graphs=True: inference calls replayed as CUDA graphs (dt.graph_info(model))
    dt.unpatch(model)                       # or: with dt.patched(model, plan): ...

Importing this module registers the operators; ``import dnnctl`` alone never imports torch.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without torch
    from dnnctl.errors import BackendUnavailableError

    raise BackendUnavailableError(
        "dnnctl.torch needs PyTorch, which is not installed",
        hint="pip install 'dnnctl[torch]'") from exc

from dnnctl.torch import library
from dnnctl.torch import patch as patch_module
from dnnctl.torch.grad_plan import BACKWARD_PATHS
from dnnctl.torch.graphs import info as graph_info
from dnnctl.torch.kernels import FALLBACKS, plan_handle
from dnnctl.torch.patch import PatchReport, is_patched, patch, patched, unpatch
from dnnctl.torch.record import record

OPS = library.OPS

__all__ = ["BACKWARD_PATHS", "FALLBACKS", "OPS", "PatchReport", "graph_info", "is_patched",
           "patch", "patched", "patch_module", "plan_handle", "record", "unpatch"]
