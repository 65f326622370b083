"""The server steps' fast routes equal the plain dense computations they replace (issue 15).

* PCP / Robust-HDP (`rpca`): the SVT of a tall matrix through its n x n Gram matrix (QR when the Gram matrix
  cannot resolve the kept singular values), and the fused tall/wide PCP loop, against the dense thin-SVD SVT and
  the dense ALM loop.
* T-tSVD / FedCEO (`t_tsvd`): the Gram-matrix SVT of tall and wide (complex) slices against LAPACK's SVD,
  including slices the Gram route must hand back to the SVD.
* PFA (`subspace`, `pfa`, `pfa_plus`): the top right singular vectors of a wide public-update matrix through the
  m x m problem (Gram or QR), the chunked float64 group means and centred codes, against the dense formulas.

Tolerances: float64 throughout. The Gram route's error bound is ~1e4 eps s_max relative (the code uses it only
then), so 1e-9 relative is loose enough for rounding and far tighter than any real bug (which shows at O(1)).
"""

import numpy as np
import pytest
import torch

from dpfl.algorithms.server import rpca, subspace, t_tsvd
from dpfl.algorithms.server.pfa import weighted_rows64
from dpfl.algorithms.server.pfa_plus import centred_codes64

REL = 1e-9


def _dense_svt(x: np.ndarray, tau: float) -> np.ndarray:
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    return (u * np.maximum(s - tau, 0.0)) @ vt


def _matrix(rng, m, n, singular_values):
    """m x n with the given singular values (descending) and random singular vectors."""
    u, _ = np.linalg.qr(rng.standard_normal((m, len(singular_values))))
    v, _ = np.linalg.qr(rng.standard_normal((n, len(singular_values))))
    return (u * np.asarray(singular_values)) @ v.T


def _close(a, b, rel=REL):
    a, b = np.asarray(a), np.asarray(b)
    scale = max(float(np.abs(b).max()), 1e-300)
    assert float(np.abs(a - b).max()) <= rel * scale


@pytest.mark.parametrize("spectrum, qr_route", [
    (np.geomspace(10.0, 1.0, 12), False),   # well conditioned: the Gram route
    (np.r_[10.0, 5.0, 1e-7, 1e-8], True),   # kept values far below s_max: the Gram matrix cannot resolve them
    (np.r_[3.0, 2.0, 1.0], False),          # rank-deficient (3 of 12 columns)
])
def test_rpca_svt_of_a_tall_matrix_equals_the_dense_svt(spectrum, qr_route, monkeypatch):
    rng = np.random.default_rng(0)
    x = _matrix(rng, 400, 12, spectrum)
    tau = float(spectrum[-1]) / 2  # keeps every non-zero singular value, so the smallest decides the route
    calls = []
    real = rpca._qr_factors
    monkeypatch.setattr(rpca, "_qr_factors", lambda a: calls.append(1) or real(a))
    out, rank = rpca.svt(torch.from_numpy(x), tau)
    assert bool(calls) == qr_route
    assert rank == len(spectrum)
    _close(out, _dense_svt(x, tau))


def test_rpca_svt_that_keeps_nothing_is_zero():
    x = _matrix(np.random.default_rng(1), 200, 10, [1.0, 0.5])
    out, rank = rpca.svt(torch.from_numpy(x), 2.0)
    assert rank == 0 and not out.any()


@pytest.mark.parametrize("shape", [(600, 20), (20, 600)])
@pytest.mark.parametrize("mu_growth", [
    rpca.MU_GROWTH,  # the default: a growing mu, capped at 1e7 mu_0
    # constant mu (the thesis code's): the same loop over thousands of iterations, up to ~3 min on 2 cores
    pytest.param(1.0, marks=pytest.mark.integration)])
def test_fused_pcp_loop_equals_the_dense_loop(shape, mu_growth):
    """The tall (and, transposed, the wide) PCP loop runs the dense loop's iteration: same iterations, same
    convergence, the same L and S to rounding."""
    rng = np.random.default_rng(2)
    m, n = shape
    low = _matrix(rng, m, n, [5.0, 3.0, 2.0])
    sparse = np.where(rng.random((m, n)) < 0.05, rng.normal(0, 3, (m, n)), 0.0)
    M = low + sparse
    L, S, info = rpca.pcp(M, tol=1e-9, mu_growth=mu_growth)
    norm_m = float(np.linalg.norm(M))
    lam = 1.0 / np.sqrt(max(m, n))
    mu = rpca.mu_default(M, rpca.default_mu_norm(mu_growth))  # m n / (4 ||M||_1) at a constant mu
    L_ref, S_ref, state = rpca._pcp_dense(torch.from_numpy(M), lam, mu, 1e-9 * norm_m, 10_000, mu_growth,
                                           rpca.MU_MAX_FACTOR * mu)
    assert info.converged and state[1]
    assert info.iterations == state[0]
    _close(L, L_ref, 1e-7)
    _close(S, S_ref, 1e-7)
    assert info.rank == state[3]


def test_fused_pcp_loop_falls_back_to_qr_and_still_matches():
    """A tall matrix whose kept singular values span more than the Gram route resolves: counted fallbacks,
    same answer as the dense loop."""
    rng = np.random.default_rng(3)
    M = _matrix(rng, 400, 10, [1e4, 1e3, 1e-2, 1e-3])
    L, S, info = rpca.pcp(M, max_iter=40, lam=10.0, mu=1e4, mu_growth=1.0)
    lam, mu = 10.0, 1e4
    L_ref, S_ref, state = rpca._pcp_dense(torch.from_numpy(M), lam, mu, 1e-7 * float(np.linalg.norm(M)), 40, 1.0,
                                           float("inf"))
    assert info.svt_fallbacks > 0
    assert info.iterations == state[0]
    _close(L, L_ref, 1e-7)
    _close(S, S_ref, 1e-7)


@pytest.mark.parametrize("shape", [(40, 8), (8, 40), (30, 12)])
@pytest.mark.parametrize("complex_", [False, True])
def test_t_tsvd_gram_svt_equals_lapack_svd(shape, complex_):
    g = torch.Generator().manual_seed(4)
    dtype = torch.complex128 if complex_ else torch.float64
    x = torch.randn(5, *shape, generator=g, dtype=dtype)
    thr = 0.8 * float(torch.linalg.svdvals(x).median())
    y, s = t_tsvd._svt(x, thr)
    y_ref, s_ref = t_tsvd._svt_svd(x, thr)
    _close(y.numpy(), y_ref.numpy())
    _close(s.numpy(), s_ref.numpy())


def test_t_tsvd_gram_svt_hands_unresolvable_slices_to_the_svd(monkeypatch):
    rng = np.random.default_rng(5)
    good = _matrix(rng, 40, 8, np.geomspace(5.0, 1.0, 8))
    bad = _matrix(rng, 40, 8, [1e3, 1e-3])  # keeps a value 1e-6 s_max: beyond the Gram route
    x = torch.tensor(np.stack([good, bad]))
    calls = []
    real = t_tsvd._svt_svd
    monkeypatch.setattr(t_tsvd, "_svt_svd", lambda m, thr: calls.append(m.shape[0]) or real(m, thr))
    y, _ = t_tsvd._svt(x, 1e-4)
    assert calls == [1]  # only the bad slice
    _close(y[1].numpy(), _dense_svt(bad, 1e-4))
    _close(y[0].numpy(), _dense_svt(good, 1e-4))


@pytest.mark.parametrize("shape", [(6, 5, 3, 3), (10, 50), (7,)])
def test_smooth_stack_equals_fold_t_tsvd_unfold(shape):
    g = torch.Generator().manual_seed(6)
    stacked = torch.randn(6, *shape[1:], generator=g, dtype=torch.float64) if len(shape) > 1 else torch.randn(
        6, generator=g, dtype=torch.float64)
    for rfft in (False, True):
        ref = t_tsvd.unfold(t_tsvd.t_tsvd(t_tsvd.fold(stacked), 1.5, rfft=rfft), tuple(stacked.shape[1:]))
        out = t_tsvd.smooth_stack(stacked, 1.5, rfft=rfft)
        _close(out.numpy(), ref.numpy())


# The singular vectors of a value s are determined only to ~eps s_max / gap (Wedin's theorem), by any
# backward-stable method, the dense SVD reference included: 1e-8 of the projector's scale where the gaps are
# O(1), 1e-6 where the smallest gap is 9e-7 (eps 10 / 9e-7 ~ 2.5e-9 absolute on entries of ~6e-3).
@pytest.mark.parametrize("spectrum, k, rel", [
    (np.geomspace(10.0, 1.0, 6), 4, 1e-8),        # Gram route
    (np.r_[10.0, 1.0, 1e-6, 1e-7], 4, 1e-6),      # the 3rd/4th values are beyond the Gram route: QR route
    (np.r_[2.0, 1.0], 4, 1e-8),                   # rank 2 < k: truncated (with a warning), as the dense SVD does
])
def test_pfa_top_right_singular_vectors_of_a_wide_matrix_span_the_dense_ones(spectrum, k, rel):
    rng = np.random.default_rng(7)
    A = torch.tensor(_matrix(rng, 6, 3000, spectrum))
    with pytest.warns(RuntimeWarning) if len(spectrum) < k else _no_warning():
        V = subspace.top_right_singular_exact(A, k)
    _, s, vh = np.linalg.svd(A.numpy(), full_matrices=False)
    rank = int((s > subspace.RANK_TOL * s[0]).sum())
    V_ref = vh[: min(k, rank)].T
    assert V.shape == V_ref.shape
    _close((V.T @ V).numpy(), np.eye(V.shape[1]), 1e-12)
    _close((V @ V.T).numpy(), V_ref @ V_ref.T, rel)  # the projector PFA uses (vectors are defined up to sign)


class _no_warning:
    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error", RuntimeWarning)

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


def test_chunked_float64_group_means_and_codes_equal_the_dense_formulas(monkeypatch):
    import dpfl.algorithms.server.pfa as pfa_module

    monkeypatch.setattr(pfa_module, "_CHUNK_ELEMENTS", 64)  # many chunks (both use its chunks), a ragged last one
    g = torch.Generator().manual_seed(8)
    flat = torch.randn(7, 1001, generator=g)  # float32 uploads
    weights = torch.rand(2, 7, generator=g, dtype=torch.float64)
    weights[0, 3:] = 0.0
    _close(weights_rows := weighted_rows64(flat, weights).numpy(), (weights @ flat.to(torch.float64)).numpy(), 1e-13)
    assert weights_rows.dtype == np.float64
    mu = torch.randn(1001, generator=g, dtype=torch.float64)
    V = torch.linalg.qr(torch.randn(1001, 3, generator=g, dtype=torch.float64))[0]
    _close(centred_codes64(flat, mu, V).numpy(), ((flat.to(torch.float64) - mu) @ V).numpy(), 1e-12)
