"""The torch PCP (`dpfl.algorithms.server.rpca`, issue 67) against the NumPy solver it replaced
(tests/algorithms/rpca_numpy.py, kept unchanged as the reference).

Both run the same iteration with the same routes (dense thin SVD, the fused tall/wide sweep with the n x n Gram
matrix, the QR fallback) and the same operations per entry; only the BLAS/LAPACK behind them sums in another order
(torch's against NumPy's), so the iterates differ by rounding, ~1e-16 per iteration. The ALM is contractive near its
fixed point, so these differences do not grow: measured max |L - L_ref| / max |L_ref| 3e-15 to 7e-15 on the small
instances below and 1.3e-12 on a 100,000 x 30 Robust-HDP-shaped block; the bound 1e-10 leaves room for other BLAS
builds, while any real difference (a wrong threshold, a missed route, one iteration more or less) shows at 1e-3
or above. The iteration count, the rank and the route (fallbacks) must be equal.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from algorithms import rpca_numpy as ref
from dpfl.algorithms.server import rpca
from dpfl.algorithms.server.robust_hdp import RobustHDP, last_weights
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs

REL = 1e-10


def _matrix(rng, m, n, singular_values):
    u, _ = np.linalg.qr(rng.standard_normal((m, len(singular_values))))
    v, _ = np.linalg.qr(rng.standard_normal((n, len(singular_values))))
    return (u * np.asarray(singular_values)) @ v.T


def _low_rank_plus_sparse(seed, m, n):
    rng = np.random.default_rng(seed)
    return _matrix(rng, m, n, [5.0, 3.0, 2.0]) + np.where(rng.random((m, n)) < 0.05, rng.normal(0, 3, (m, n)), 0.0)


def _rel(a: torch.Tensor, b: np.ndarray) -> float:
    return float(np.abs(a.numpy() - b).max() / max(np.abs(b).max(), 1e-300))


@pytest.mark.parametrize("shape", [(600, 20), (20, 600), (120, 100)])  # tall (fused), wide (transposed), dense
@pytest.mark.parametrize("mu_growth, tol", [(rpca.MU_GROWTH, 1e-9), (1.0, 1e-7)])
def test_torch_pcp_equals_the_numpy_pcp(shape, mu_growth, tol):
    M = _low_rank_plus_sparse(2, *shape)
    L_ref, S_ref, info_ref = ref.pcp(M, tol=tol, mu_growth=mu_growth, max_iter=3_000)
    L, S, info = rpca.pcp(torch.from_numpy(M), tol=tol, mu_growth=mu_growth, max_iter=3_000)
    assert L.dtype == S.dtype == torch.float64 and L.shape == S.shape == shape
    assert (info.iterations, info.converged, info.rank, info.svt_fallbacks) == (
        info_ref.iterations, info_ref.converged, info_ref.rank, info_ref.svt_fallbacks)
    assert info.lam == info_ref.lam and info.mu == pytest.approx(info_ref.mu, rel=1e-14)  # the same start
    assert info.mu_final == pytest.approx(info_ref.mu_final, rel=1e-15)
    assert info.residual == pytest.approx(info_ref.residual, rel=1e-6, abs=1e-12 * np.linalg.norm(M))
    assert _rel(L, L_ref) < REL and _rel(S, S_ref) < REL


def test_torch_pcp_qr_fallback_equals_the_numpy_pcp():
    M = _matrix(np.random.default_rng(3), 400, 10, [1e4, 1e3, 1e-2, 1e-3])
    L_ref, S_ref, info_ref = ref.pcp(M, max_iter=40, lam=10.0, mu=1e4, mu_growth=1.0)
    L, S, info = rpca.pcp(M, max_iter=40, lam=10.0, mu=1e4, mu_growth=1.0)  # a NumPy input: solved on the CPU
    assert info.svt_fallbacks == info_ref.svt_fallbacks > 0 and info.iterations == info_ref.iterations
    assert _rel(L, L_ref) < REL and _rel(S, S_ref) < REL


@pytest.mark.parametrize("mu_norm", rpca.MU_NORMS)
def test_mu_default_and_svt_equal_the_numpy_ones(mu_norm):
    M = _low_rank_plus_sparse(4, 300, 12)
    assert rpca.mu_default(torch.from_numpy(M), mu_norm) == pytest.approx(ref.mu_default(M, mu_norm), rel=1e-14)
    out, r = rpca.svt(torch.from_numpy(M), 1.0)
    out_ref, r_ref = ref.svt(M, 1.0)
    assert r == r_ref and _rel(out, out_ref) < 1e-12


def test_robust_hdp_weights_equal_those_of_the_numpy_pcp():
    """The aggregation weights from the torch PCP equal those the NumPy solver gives (the sigma_i^2 summed the
    same way) to 1e-12 relative."""
    rng = np.random.default_rng(0)
    k, p = 12, 6_000
    s2 = np.r_[np.full(4, 1.0), np.full(8, 0.01)] * rng.uniform(1.0, 2.0, k)
    u = 0.1 * rng.standard_normal(p) + 0.01 * rng.standard_normal((k, p)) + rng.standard_normal((k, p)) * np.sqrt(
        s2)[:, None]
    for growth in (rpca.MU_GROWTH, 1.0):
        agg = RobustHDP(mu_growth=growth)
        view = ServerView.simple([100] * k)
        zero = {"w": torch.zeros(p, dtype=torch.float64)}
        step = agg.update(agg.init(zero), zero, {"w": torch.from_numpy(u)}, RoundInputs(view, seed=0, round_=0))
        _, S_ref, _ = ref.pcp(np.ascontiguousarray(u.T), mu_growth=growth)
        sigma2 = np.einsum("ij,ij->j", S_ref, S_ref)
        w_ref = (1 / np.maximum(sigma2, 1e-6 * sigma2.max()))
        w_ref /= w_ref.sum()
        np.testing.assert_allclose(last_weights(step.state).numpy(), w_ref, rtol=1e-12, atol=0)
