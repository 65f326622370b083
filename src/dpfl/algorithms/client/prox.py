"""FedProx's local program: SGD (or DP-SGD) on f_i(w) + mu/2 ||w - w_global||^2.

The proximal gradient mu (w - w_global) does not touch data, so under DP it is added after clipping and
noise and costs no privacy.
"""

from __future__ import annotations

from dpfl.algorithms.client.program import LocalProgram, dpsgd, sgd


def fedprox(lr: float, mu: float, *, steps: int | None = None, epochs: float | None = None,
            clip: float | None = None, sampling: str = "poisson", loss: str = "cross_entropy") -> LocalProgram:
    """FedProx local program; private (DP-SGD) when `clip` is given."""
    if not mu > 0:
        raise ValueError(f"FedProx needs mu > 0, got {mu}")
    if clip is None:
        return sgd(lr, steps=steps, epochs=epochs, loss=loss, prox_mu=mu)
    return dpsgd(lr, clip, steps=steps, epochs=epochs, sampling=sampling, loss=loss, prox_mu=mu)
