"""The gradient-inversion attacks on a CUDA model against the same attack on the CPU (issue 67, item 1: the attacks
follow the device). Marked `gpu`: skipped where CUDA is absent; `DPFL_GPU_TEST_DEVICE=cpu` runs the comparisons CPU
against CPU (then exact).

Tolerance. The dummy start is drawn on the CPU and moved, so both runs start from the same images; the objective's
gradients are float64 here, computed by cuBLAS/cuDNN in other summation orders (~1e-15 relative per kernel). Inverting
Gradients' 40 Adam steps on a cosine objective are not contractive everywhere, but at these sizes the rounding stays
far below 1e-6 in the reconstruction; a wrong device or a dropped target shows at 1e-2 or above.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

from dpfl.attacks.image_metrics import feature_mse
from dpfl.attacks.inversion import evaluate, inverting_gradients, observed_gradient

DEVICE = os.environ.get("DPFL_GPU_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE != "cpu" and not torch.cuda.is_available(), reason="needs CUDA")]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Sigmoid(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10)).double()


def test_inverting_gradients_on_the_device_matches_the_cpu():
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(2, 1, 8, 8, generator=gen, dtype=torch.float64)
    y = torch.tensor([3, 7])
    cpu_model = _model()
    dev_model = copy.deepcopy(cpu_model).to(DEVICE)
    target = observed_gradient(cpu_model, x, y)
    cpu = inverting_gradients(cpu_model, target, y, x.shape, steps=40, lr=0.1, tv_weight=1e-4, seed=3)
    dev = inverting_gradients(dev_model, target, y, x.shape, steps=40, lr=0.1, tv_weight=1e-4, seed=3)
    assert dev.reconstruction.device.type == torch.device(DEVICE).type
    assert torch.allclose(dev.reconstruction.cpu(), cpu.reconstruction, rtol=1e-6, atol=1e-6)
    assert abs(dev.loss - cpu.loss) <= 1e-6 * max(1.0, abs(cpu.loss))
    # the metrics take a reconstruction on the device and the truth on the CPU
    assert evaluate(dev, x)["psnr"] == pytest.approx(evaluate(cpu, x)["psnr"], rel=1e-6)
    extractor = _model().to(DEVICE)
    assert feature_mse(extractor, dev.reconstruction, x) == pytest.approx(
        feature_mse(_model(), cpu.reconstruction, x), rel=1e-6)
