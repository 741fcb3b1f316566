"""A patched model's whole training step (autocast forward on dnnctl, backward by torch's
formulas or dnnctl's kernels, optimizer step) captured as one CUDA graph with torch's
whole-network recipe: its replays give the losses and weights of the same steps run one
by one.

    PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_torch_graph_train.py
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA build of torch and a GPU", allow_module_level=True)
pytest.importorskip("cupy")
dt = pytest.importorskip("dnnctl.torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from _torch_models import train_step, training_case  # noqa: E402

from dnnctl.torch import grad_plan  # noqa: E402

pytestmark = pytest.mark.gpu
WARMUP, STEPS = 3, 4


@pytest.mark.parametrize("backward", ["torch", "dnnctl"])
@pytest.mark.parametrize("case", ["resnet", "vit"])
def test_captured_patched_step_replays_the_eager_steps(case, backward):
    model, x, y, loss_fn, amp, make_opt = training_case(case)
    graphed = copy.deepcopy(model)
    report = dt.patch(model, backward=backward)
    dt.patch(graphed, backward=backward)
    assert report.covered
    # one by one: WARMUP + STEPS steps
    opt = make_opt(model.parameters())
    losses = []
    for _ in range(WARMUP + STEPS):
        opt.zero_grad(set_to_none=True)
        losses.append(float(train_step(model, opt, x, y, loss_fn, amp).detach()))
    # captured: the same warm-up steps on a side stream, then STEPS replays
    gopt = make_opt(graphed.parameters())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            gopt.zero_grad(set_to_none=True)
            train_step(graphed, gopt, x, y, loss_fn, amp)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    gopt.zero_grad(set_to_none=True)
    grad_plan.BACKWARD_PATHS.clear()
    with torch.cuda.graph(graph):
        static_loss = train_step(graphed, gopt, x, y, loss_fn, amp, cache=False)
    paths = grad_plan.paths_summary()
    own = sum(v["dnnctl"] for v in paths.values())
    assert own > 0 if backward == "dnnctl" else own == 0, paths  # whose kernels were captured
    replayed = []
    for _ in range(STEPS):
        graph.replay()
        replayed.append(float(static_loss))
    torch.testing.assert_close(replayed, losses[WARMUP:], rtol=2e-3, atol=1e-4)
    for (n, p), q in zip(model.named_parameters(), graphed.parameters()):
        torch.testing.assert_close(q, p, rtol=2e-2, atol=2e-3, msg=n)
