"""Shared settings for the model tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    """Run each model test with one intra-op thread, restoring the setting afterwards.

    The models here are small and the batches tiny, so threads buy nothing; but on a loaded 2-core
    machine OpenMP's barrier waits made the ResNet per-sample tests ~10x slower (2 min vs 30 s for
    this folder). Results do not depend on the thread count beyond float rounding, which the
    tolerances already cover.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
