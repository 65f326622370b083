"""Shared by the GPU tests: full float32 while comparing a device with the CPU."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _full_float32():
    """No TF32 (10-bit mantissa products) while comparing with the CPU: the tolerances are about the engine."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
