"""FedCEO T-tSVD operator (spec fedceo §2; Math tests T1–T11 of §9).

References are written independently in NumPy (np.fft along the client axis, per-slice np.linalg.svd).
"""

from __future__ import annotations

import math
import sys
from itertools import pairwise

import numpy as np
import pytest
import torch

from dpfl.algorithms.server.t_tsvd import (
    fold,
    is_smoothing_round,
    smooth_stack,
    smoothing_index,
    svt,
    t_tsvd,
    t_tsvd_with_stats,
    threshold,
    unfold,
)

ATOL = 1e-10
KS = (1, 2, 3, 4, 7, 10)


def _shapes() -> dict[str, tuple[int, int]]:
    rng = np.random.default_rng(20230)
    n1 = int(rng.integers(2, 5))
    wide = (n1, n1 + int(rng.integers(1, 4)))
    n2 = int(rng.integers(2, 5))
    tall = (n2 + int(rng.integers(1, 4)), n2)
    row = (1, int(rng.integers(2, 7)))
    return {"wide": wide, "tall": tall, "row": row}


SHAPES = _shapes()
CASES = [(name, K) for name in SHAPES for K in KS]
CASE_IDS = [f"{name}-K{K}" for name, K in CASES]


def _x(name: str, K: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    n1, n2 = SHAPES[name]
    g = torch.Generator().manual_seed(1000 * seed + 10 * K + len(name))
    return scale * torch.randn(n1, n2, K, generator=g, dtype=torch.float64)


# ---- NumPy references -----------------------------------------------------------------------------------


def np_svt(a: np.ndarray, thr: float) -> np.ndarray:
    u, s, vh = np.linalg.svd(a, full_matrices=False)
    return (u * np.maximum(s - thr, 0.0)) @ vh


def np_t_tsvd(x: np.ndarray, thr: float) -> np.ndarray:
    xf = np.fft.fft(x, axis=2)
    yf = np.empty_like(xf)
    for i in range(x.shape[2]):
        yf[:, :, i] = np_svt(xf[:, :, i], thr)
    return np.fft.ifft(yf, axis=2).real


def slice_svals(x: np.ndarray) -> np.ndarray:
    """Singular values of every unnormalised DFT slice, all slices concatenated."""
    xf = np.fft.fft(x, axis=2)
    return np.concatenate([np.linalg.svd(xf[:, :, i], compute_uv=False) for i in range(x.shape[2])])


def spectral_norms(x: np.ndarray) -> np.ndarray:
    xf = np.fft.fft(x, axis=2)
    return np.array([np.linalg.norm(xf[:, :, i], 2) for i in range(x.shape[2])])


def mid_thr(svals: np.ndarray) -> float:
    """A threshold in a clear gap between singular values, near the median: zeroes some, keeps some.

    With a single distinct singular value it returns half of it (shrinks, zeroes nothing).
    """
    s = np.sort(np.asarray(svals))
    gaps = np.diff(s)
    ok = np.nonzero(gaps > 1e-6 * s[-1])[0]
    if ok.size == 0:
        return float(s[-1] / 2)
    i = ok[np.argmin(np.abs(ok - (len(s) - 1) / 2))]
    return float((s[i] + s[i + 1]) / 2)


def nuclear_objective(w: np.ndarray, x: np.ndarray, thr: float) -> float:
    """F(W) = (1/(2 thr)) ||W - X||_F^2 + (1/K) sum_i ||W̄_i||_*  (Theorem 3.1 with τ = 1/(2 thr))."""
    K = x.shape[2]
    wf = np.fft.fft(w, axis=2)
    nuc = sum(np.linalg.svd(wf[:, :, i], compute_uv=False).sum() for i in range(K))
    return float(np.sum((w - x) ** 2) / (2 * thr) + nuc / K)


# ---- T1: fold / unfold ------------------------------------------------------------------------------------

PARAM_SHAPES = {
    "linear": ((4, 3), (3, 4)),  # (out, in) -> (in, out)
    "bias": ((5,), (1, 5)),  # (out,) -> (1, out)
    "conv2d": ((4, 3, 2, 5), (5 * 2 * 3, 4)),  # (out, in, kh, kw) -> (kw*kh*in, out)
    "3d": ((3, 4, 2), (2 * 4, 3)),
}


@pytest.mark.parametrize("K", KS)
@pytest.mark.parametrize("kind", list(PARAM_SHAPES))
def test_t1_fold_unfold_roundtrip_and_layout(kind, K):
    shape, (n1, n2) = PARAM_SHAPES[kind]
    g = torch.Generator().manual_seed(K)
    P = torch.randn(K, *shape, generator=g, dtype=torch.float64)
    F = fold(P)
    assert tuple(F.shape) == (n1, n2, K)
    back = unfold(F, shape)
    assert back.shape == P.shape and torch.equal(back, P)
    # Element layout of §2.1: F[ravel(i_{m-1}, ..., i_1), i_0, k] = P[k, i_0, ..., i_{m-1}].
    Pn, Fn = P.numpy(), F.numpy()
    rest = tuple(reversed(shape[1:]))
    for idx in np.ndindex(*P.shape):
        k, i0, tail = idx[0], idx[1], idx[2:]
        row = int(np.ravel_multi_index(tuple(reversed(tail)), rest)) if tail else 0
        assert Fn[row, i0, k] == Pn[idx]
    if kind == "linear":  # frontal slice k is client k's matrix, transposed: (in, out)
        for k in range(K):
            assert torch.equal(F[:, :, k], P[k].T)


def test_t1_unfold_rejects_wrong_shape_and_scalar_roundtrip():
    P = torch.randn(3, 4, 5, dtype=torch.float64)
    with pytest.raises(ValueError):
        unfold(fold(P), (5, 4))
    with pytest.raises(ValueError):
        unfold(P[0], (4, 5))
    s = torch.randn(6, dtype=torch.float64)  # a scalar parameter stacked over K = 6 clients
    assert tuple(fold(s).shape) == (1, 1, 6)
    assert torch.equal(unfold(fold(s), ()), s)


# ---- T2: alternative matricisations -----------------------------------------------------------------------


@pytest.mark.parametrize("K", KS)
@pytest.mark.parametrize("kind", ["linear", "conv2d", "3d"])
def test_t2_alternative_matricisation(kind, K):
    shape = PARAM_SHAPES[kind][0]
    out = shape[0]
    g = torch.Generator().manual_seed(100 + K)
    P = torch.randn(K, *shape, generator=g, dtype=torch.float64)
    thr = mid_thr(slice_svals(fold(P).numpy()))
    ref = smooth_stack(P, thr)
    assert not torch.allclose(ref, P)  # the threshold really acts

    flat = P.reshape(K, out, -1)
    # [n, out, K]: output axis as columns, other axes in (in, kh, kw) order instead of (kw, kh, in).
    y1 = t_tsvd(flat.permute(2, 1, 0), thr).permute(2, 1, 0).reshape(P.shape)
    # [out, n, K]: the transposed layout.
    y2 = t_tsvd(flat.permute(1, 2, 0), thr).permute(2, 0, 1).reshape(P.shape)
    torch.testing.assert_close(y1, ref, rtol=0, atol=ATOL)
    torch.testing.assert_close(y2, ref, rtol=0, atol=ATOL)

    if kind == "conv2d":  # a non-equivalent grouping (out*in, kh*kw) must differ: the test can tell
        bad = P.reshape(K, shape[0] * shape[1], -1).permute(1, 2, 0)
        y3 = t_tsvd(bad, thr).permute(2, 0, 1).reshape(P.shape)
        assert (y3 - ref).abs().max() > 1e-6


# ---- T3: matches the loop reference -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "K"), CASES, ids=CASE_IDS)
def test_t3_matches_numpy_loop_reference(name, K):
    x = _x(name, K, seed=3, scale=2.0)
    xn = x.numpy()
    for thr in (mid_thr(slice_svals(xn)), 0.1 * mid_thr(slice_svals(xn))):
        y = t_tsvd(x, thr)
        assert y.dtype == torch.float64 and y.shape == x.shape
        np.testing.assert_allclose(y.numpy(), np_t_tsvd(xn, thr), rtol=0, atol=ATOL)


# ---- T4: rfft path ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "K"), CASES, ids=CASE_IDS)
def test_t4_rfft_equals_full_fft(name, K):
    x = _x(name, K, seed=4)
    thr = mid_thr(slice_svals(x.numpy()))
    y_full, frac_full, _ = t_tsvd_with_stats(x, thr)
    y_r, frac_r, imag_r = t_tsvd_with_stats(x, thr, rfft=True)
    torch.testing.assert_close(y_r, y_full, rtol=0, atol=ATOL)
    assert frac_r == pytest.approx(frac_full, abs=1e-12)
    assert imag_r < 1e-10

    x32 = x.float()
    y32_full = t_tsvd(x32, thr, dtype=torch.float32)
    y32_r = t_tsvd(x32, thr, rfft=True, dtype=torch.float32)
    assert y32_full.dtype == y32_r.dtype == torch.float32
    scale = float(y_full.abs().max())
    torch.testing.assert_close(y32_r, y32_full, rtol=1e-4, atol=1e-4 * scale)
    torch.testing.assert_close(y32_full.double(), y_full, rtol=1e-4, atol=1e-4 * scale)


# ---- T5: zero threshold -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "K"), CASES, ids=CASE_IDS)
def test_t5_zero_threshold_is_identity(name, K):
    x = _x(name, K, seed=5)
    for rfft in (False, True):
        y, frac, imag = t_tsvd_with_stats(x, 0.0, rfft=rfft)
        assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()
        assert frac == 0.0 and imag == 0.0
        assert torch.equal(y.mean(dim=2), x.mean(dim=2))  # the mean is exactly FedAvg
    # The same through the full FFT/SVD pipeline (a positive but negligible threshold: no short cut).
    torch.testing.assert_close(t_tsvd(x, 1e-300), x, rtol=0, atol=ATOL)
    torch.testing.assert_close(t_tsvd(x, 1e-300, rfft=True), x, rtol=0, atol=ATOL)
    P = x.permute(2, 1, 0)  # [K, out, in] stack for a Linear weight
    assert torch.equal(smooth_stack(P, 0), P)


# ---- T6: mean identity ------------------------------------------------------------------------------------

T6_CASES = [c for c in CASES if c != ("row", 1)]  # a single 1x1 slice has one singular value only


@pytest.mark.parametrize(("name", "K"), T6_CASES, ids=[f"{n}-K{k}" for n, k in T6_CASES])
def test_t6_mean_identity(name, K):
    x = _x(name, K, seed=6)
    xn = x.numpy()
    svals = slice_svals(xn)
    thrs = [mid_thr(svals)]
    dc = np.linalg.svd(xn.sum(axis=2), compute_uv=False)
    if dc.size >= 2:  # also a threshold that zeroes some but not all of the DC slice's singular values
        thrs.append(mid_thr(dc))
    for thr in thrs:
        zeroed = int(np.sum(svals <= thr))
        assert 0 < zeroed < svals.size  # the chosen thr zeroes some, but not all, singular values
        y, frac, _ = t_tsvd_with_stats(x, thr)
        assert frac == pytest.approx(zeroed / svals.size, abs=1e-12)
        x_avg = xn.mean(axis=2)
        want = np_svt(x_avg, thr / K)
        assert np.abs(want - x_avg).max() > 1e-6  # the identity is not the trivial one
        np.testing.assert_allclose(y.numpy().mean(axis=2), want, rtol=0, atol=ATOL)
        torch.testing.assert_close(y.mean(dim=2), svt(x.mean(dim=2), thr / K), rtol=0, atol=ATOL)


# ---- T7: Proposition 3.2 (fallback to FedAvg) -------------------------------------------------------------

T7_CASES = [c for c in CASES if c[1] > 1]  # K = 1 has no non-DC slice (see T10)


@pytest.mark.parametrize(("name", "K"), T7_CASES, ids=[f"{n}-K{k}" for n, k in T7_CASES])
def test_t7_fallback_to_fedavg(name, K):
    n1, n2 = SHAPES[name]
    g = torch.Generator().manual_seed(70 + K)
    r = min(2, n1, n2)
    common = 10.0 * torch.randn(n1, r, generator=g, dtype=torch.float64) @ torch.randn(
        r, n2, generator=g, dtype=torch.float64
    )
    x = common[:, :, None] + 1e-2 * torch.randn(n1, n2, K, generator=g, dtype=torch.float64)
    xn = x.numpy()
    norms = spectral_norms(xn)
    assert norms[0] > 10 * norms[1:].max()  # the DC slice dominates (Remark B.2)
    x_avg = xn.mean(axis=2)
    rank = np.linalg.matrix_rank(x_avg)

    thr = (1 + 1e-9) * norms[1:].max()
    y = t_tsvd(x, thr).numpy()
    want = np_svt(x_avg, thr / K)
    for k in range(K):
        np.testing.assert_allclose(y[:, :, k], want, rtol=0, atol=ATOL)
        # Equality when every singular value of X_avg exceeds thr/K (the usual case here): allow rounding.
        assert np.linalg.norm(y[:, :, k] - x_avg) <= math.sqrt(rank) * thr / K * (1 + 1e-9)
    # Control: just below that threshold a non-DC slice survives and the clients differ.
    thr_lo = (1 - 1e-2) * norms[1:].max()
    y_lo = t_tsvd(x, thr_lo).numpy()
    assert max(np.abs(y_lo[:, :, k] - np_svt(x_avg, thr_lo / K)).max() for k in range(K)) > 1e-9

    thr_all = (1 + 1e-9) * norms.max()
    assert float(t_tsvd(x, thr_all).abs().max()) == 0.0
    assert float(t_tsvd(x, thr_all, rfft=True).abs().max()) == 0.0
    assert float(t_tsvd(x, (1 - 1e-6) * norms.max()).abs().max()) > 0.0


# ---- T8: Theorem 3.1 optimality ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "K"), CASES, ids=CASE_IDS)
def test_t8_prox_optimality(name, K):
    x = _x(name, K, seed=8)
    xn = x.numpy()
    thr = mid_thr(slice_svals(xn))
    y = t_tsvd(x, thr).numpy()
    f_y = nuclear_objective(y, xn, thr)
    tol = 1e-11 * max(1.0, abs(f_y))
    # F is (1/thr)-strongly convex, so at the minimiser F(W) >= F(Y) + ||W - Y||_F^2 / (2 thr) for every W.
    rng = np.random.default_rng(800 + K)
    for _ in range(20):
        R = rng.standard_normal(xn.shape)
        for eps in (1e-3, 1e-1):
            w = y + eps * R
            f_w = nuclear_objective(w, xn, thr)
            assert f_y <= f_w + tol
            assert f_w - f_y >= np.sum((w - y) ** 2) / (2 * thr) - tol
    # Specific wrong candidates: the input, zero, and the thr·K (wrong FFT normalisation) result.
    for w in (xn, np.zeros_like(xn), np_t_tsvd(xn, thr * K)):
        assert nuclear_objective(w, xn, thr) - f_y >= np.sum((w - y) ** 2) / (2 * thr) - tol


# ---- T9: real output, dtype and device --------------------------------------------------------------------

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize(("name", "K"), CASES, ids=CASE_IDS)
def test_t9_imaginary_part_and_zeroed_fraction(name, K):
    x = _x(name, K, seed=9, scale=3.0)
    svals = slice_svals(x.numpy())
    thr = mid_thr(svals)
    for rfft in (False, True):
        _, frac, imag = t_tsvd_with_stats(x, thr, rfft=rfft)
        assert 0.0 <= imag < 1e-10
        assert frac == pytest.approx(np.mean(svals <= thr), abs=1e-12)
    _, frac_all, _ = t_tsvd_with_stats(x, 2 * svals.max())
    assert frac_all == 1.0


def test_t9_stats_report_the_discarded_imaginary_part(monkeypatch):
    # The diagnostic must measure what `.real` drops: inject a known imaginary part after the inverse FFT.
    x = _x("wide", 4, seed=9)
    thr = mid_thr(slice_svals(x.numpy()))
    y_ref = t_tsvd(x, thr)
    real_ifft = torch.fft.ifft
    monkeypatch.setattr(torch.fft, "ifft", lambda *a, **k: real_ifft(*a, **k) + 1j * 1e-3)
    y, _, imag = t_tsvd_with_stats(x, thr)
    assert imag == pytest.approx(1e-3, rel=1e-6)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=ATOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rfft", [False, True])
@pytest.mark.parametrize("prox_dtype", [torch.float64, torch.float32])
def test_t9_dtype_and_device_preserved(prox_dtype, rfft, device):
    x64 = _x("tall", 7, seed=9).to(device)
    thr = mid_thr(slice_svals(x64.cpu().numpy()))
    ref = torch.from_numpy(np_t_tsvd(x64.cpu().numpy(), thr))
    for x in (x64.float(), x64):
        y = t_tsvd(x, thr, rfft=rfft, dtype=prox_dtype)
        assert y.dtype == x.dtype and y.device == x.device and y.shape == x.shape
        tol = 1e-10 if (x.dtype == prox_dtype == torch.float64) else 1e-4 * float(ref.abs().max())
        torch.testing.assert_close(y.cpu().double(), ref, rtol=0, atol=tol)
    P = x64.float().permute(2, 1, 0).contiguous()  # [K, out, in]
    yp = smooth_stack(P, thr, rfft=rfft, dtype=prox_dtype)
    assert yp.dtype == torch.float32 and yp.device == P.device and yp.shape == P.shape


# ---- T10: K = 1 is matrix SVT; svt itself -----------------------------------------------------------------


@pytest.mark.parametrize("name", list(SHAPES))
def test_t10_single_client_is_matrix_svt(name):
    x = _x(name, 1, seed=10)[:, :, 0]
    s = np.linalg.svd(x.numpy(), compute_uv=False)
    for thr in (0.5 * s.min(), mid_thr(s), 1.5 * s.max()):
        want = np_svt(x.numpy(), thr)
        for rfft in (False, True):
            y = t_tsvd(x[:, :, None], thr, rfft=rfft)[:, :, 0]
            np.testing.assert_allclose(y.numpy(), want, rtol=0, atol=ATOL)
        np.testing.assert_allclose(svt(x, thr).numpy(), want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("complex_", [False, True])
def test_svt_batched_matches_numpy(complex_):
    g = torch.Generator().manual_seed(11)
    a = torch.randn(2, 3, 4, 6, generator=g, dtype=torch.float64)
    if complex_:
        a = torch.complex(a, torch.randn(2, 3, 4, 6, generator=g, dtype=torch.float64))
    an = a.numpy()
    thr = mid_thr(np.linalg.svd(an, compute_uv=False).ravel())
    got = svt(a, thr)
    assert got.dtype == a.dtype and got.shape == a.shape
    for idx in np.ndindex(2, 3):
        np.testing.assert_allclose(got[idx].numpy(), np_svt(an[idx], thr), rtol=0, atol=ATOL)
    assert torch.equal(svt(a, 0.0), a)
    assert float(svt(a, 1e6).abs().max()) == 0.0


# ---- §2.4 bias shrink identity ----------------------------------------------------------------------------


def _shrink(v: np.ndarray, thr: float) -> np.ndarray:
    n = np.linalg.norm(v)
    return v * max(1.0 - thr / n, 0.0) if n > 0 else v * 0


def test_bias_shrink_single_client():
    v = torch.randn(1, 9, 1, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    norm = float(v.norm())
    for thr in (0.3 * norm, 0.9 * norm, 1.1 * norm):
        want = _shrink(v.numpy()[0, :, 0], thr)
        np.testing.assert_allclose(t_tsvd(v, thr).numpy()[0, :, 0], want, rtol=0, atol=ATOL)
    assert float(t_tsvd(v, 1.1 * norm).abs().max()) == 0.0


@pytest.mark.parametrize("K", [k for k in KS if k > 1])
def test_bias_shrink_per_frequency(K):
    b = torch.randn(K, 9, generator=torch.Generator().manual_seed(13 + K), dtype=torch.float64)  # [K, out]
    bf = np.fft.fft(b.numpy(), axis=0)  # frequency i in row i
    norms = np.linalg.norm(bf, axis=1)
    thr = float(np.median(norms))
    want = np.fft.ifft(np.stack([_shrink(bf[i], thr) for i in range(K)]), axis=0).real
    for rfft in (False, True):
        np.testing.assert_allclose(smooth_stack(b, thr, rfft=rfft).numpy(), want, rtol=0, atol=ATOL)


# ---- input validation -------------------------------------------------------------------------------------


@pytest.mark.parametrize("thr", [-1.0, -1e-300, float("nan"), -float("inf"), None, "x"])
def test_invalid_threshold_raises(thr):
    x = _x("wide", 3)
    with pytest.raises(ValueError):
        t_tsvd(x, thr)
    with pytest.raises(ValueError):
        t_tsvd_with_stats(x, thr, rfft=True)
    with pytest.raises(ValueError):
        svt(x[:, :, 0], thr)
    with pytest.raises(ValueError):
        smooth_stack(x.permute(2, 0, 1), thr)


def test_invalid_inputs_raise():
    x = _x("wide", 3)
    with pytest.raises(ValueError):
        t_tsvd(x[:, :, 0], 1.0)  # not folded
    with pytest.raises(ValueError):
        t_tsvd(torch.complex(x, x), 1.0)  # complex input
    with pytest.raises(ValueError):
        t_tsvd(torch.ones(2, 3, 4, dtype=torch.int64), 1.0)
    with pytest.raises(ValueError):
        t_tsvd(x, 1.0, dtype=torch.float16)
    with pytest.raises(ValueError):
        fold(torch.tensor(1.0))


# ---- T11: threshold schedule ------------------------------------------------------------------------------

# §4 table: (lam, theta, I, thr_1, thr_{T/I}) with T = 300.
TABLE = [
    (70, 1.08, 30, 0.0077143, 0.015421),
    (0.5, 1.04, 20, 1.04, 1.8009),
    (0.03, 1.06, 20, 17.667, 39.943),
    (85, 1.03, 15, 0.0060588, 0.010624),
    (10, 1.07, 10, 0.0535, 0.38061),
    (0.6, 1.04, 10, 0.86667, 2.7028),
]


@pytest.mark.parametrize(("lam", "theta", "interval", "thr_first", "thr_last"), TABLE)
def test_t11_schedule_matches_table(lam, theta, interval, thr_first, thr_last):
    T = 300
    rounds = [t for t in range(1, T + 1) if is_smoothing_round(t, interval)]
    assert rounds == list(range(interval, T + 1, interval))
    js = [smoothing_index(t, interval) for t in rounds]
    assert js == list(range(1, T // interval + 1))
    assert threshold(js[0], lam, theta) == pytest.approx(thr_first, rel=1e-4)
    assert threshold(js[-1], lam, theta) == pytest.approx(thr_last, rel=1e-4)
    thrs = [threshold(j, lam, theta) for j in js]
    assert all(b > a for a, b in pairwise(thrs))  # ϑ > 1: strictly increasing


def test_t11_theta_one_is_constant_and_smoothing_rounds():
    assert {threshold(j, 0.5, 1.0) for j in range(1, 31)} == {1.0}
    assert threshold(3, 2.0, 1.1) == pytest.approx(1.1**3 / 4.0, rel=1e-15)
    assert [t for t in range(1, 13) if is_smoothing_round(t, 4)] == [4, 8, 12]
    assert [smoothing_index(t, 4) for t in (3, 4, 7, 8)] == [0, 1, 1, 2]
    assert all(is_smoothing_round(t, 1) for t in range(1, 5))


# ---- a threshold past the float range (FedCEO's growing schedule) ----------------------------------------


@pytest.mark.parametrize(
    ("j", "lam", "theta"),
    [(31, 1.0, 1e10), (1024, 1.0, 2.0), (1023, 0.25, 2.0), (2000, 0.5, 1.5), (10**400, 1.0, 1.05), (5, 1e-320, 1e100)],
)
def test_t11_threshold_past_the_float_range_is_inf_not_an_exception(j, lam, theta):
    assert threshold(j, lam, theta) == math.inf  # raised OverflowError (theta**j) before


def test_t11_threshold_is_unchanged_below_the_float_range_and_monotone():
    assert threshold(1023, 0.5, 2.0) == 2.0**1023  # the largest power of two: still finite and exact
    assert threshold(30, 1.0, 1e10) == 1e300 / 2.0
    assert threshold(10**400, 0.5, 1.0) == 1.0  # ϑ = 1 stays constant for any j
    thrs = [threshold(j, 0.03, 2.0) for j in range(1, 1100)]
    assert all(b >= a for a, b in pairwise(thrs))
    assert math.isfinite(thrs[1010]) and thrs[-1] == math.inf


@pytest.mark.parametrize("rfft", [False, True])
@pytest.mark.parametrize(("name", "K"), [("wide", 3), ("tall", 4), ("row", 1), ("wide", 10)])
def test_infinite_threshold_is_the_limit_zero(name, K, rfft):
    """thr ≥ ‖X̄_0‖_2 already gives Y = 0 exactly (§2.4); thr = inf is that limit, without an SVD."""
    x = _x(name, K, scale=1e3)
    y, frac, imag = t_tsvd_with_stats(x, math.inf, rfft=rfft)
    assert torch.equal(y, torch.zeros_like(x)) and (frac, imag) == (1.0, 0.0)
    big = float(spectral_norms(x.numpy()).max()) * (1 + 1e-9)  # a finite threshold past every singular value
    y_big, frac_big, _ = t_tsvd_with_stats(x, big, rfft=rfft)
    np.testing.assert_array_equal(y_big.numpy(), y.numpy())
    assert frac_big == frac
    for thr in (1e300, sys.float_info.max):
        np.testing.assert_array_equal(t_tsvd(x, thr, rfft=rfft).numpy(), 0.0)
    assert torch.equal(svt(x[:, :, 0], math.inf), torch.zeros_like(x[:, :, 0]))
    stacked = x.permute(2, 0, 1).contiguous()
    assert torch.equal(smooth_stack(stacked, threshold(1024, 1.0, 2.0), rfft=rfft), torch.zeros_like(stacked))


def test_fedceo_schedule_past_the_float_range_smooths_to_zero():
    """The server's threshold at round 1024 of ϑ = 2 is inf: T-tSVD's limit, every model (and the mean) 0."""
    from dpfl.algorithms.server.fedceo import FedCEO, _smooth

    server = FedCEO(lam=1.0, theta=2.0, interval=1)
    assert server.threshold_at(1022) == 2.0**1023 / 2.0 and server.threshold_at(1023) == math.inf
    stacked = _x("wide", 4).permute(2, 0, 1).contiguous()
    smoothed, zeroed = _smooth(stacked, server.threshold_at(5000), True, torch.float64)
    assert torch.equal(smoothed, torch.zeros_like(stacked)) and zeroed == 1.0


@pytest.mark.parametrize(
    ("j", "lam", "theta"),
    [(0, 1.0, 1.05), (-1, 1.0, 1.05), (1.5, 1.0, 1.05), (True, 1.0, 1.05), (1, 0.0, 1.05), (1, -2.0, 1.05),
     (1, float("nan"), 1.05), (1, float("inf"), 1.05), (1, 1.0, 0.99), (1, 1.0, float("nan")), (1, None, 1.05)],
)
def test_t11_invalid_schedule_raises(j, lam, theta):
    with pytest.raises(ValueError):
        threshold(j, lam, theta)


@pytest.mark.parametrize(("t", "interval"), [(0, 5), (-1, 5), (3, 0), (3, -2), (2.0, 5)])
def test_t11_invalid_rounds_raise(t, interval):
    with pytest.raises(ValueError):
        is_smoothing_round(t, interval)
    with pytest.raises(ValueError):
        smoothing_index(t, interval)


# ---- issue 67 5(b): float32 SVT at the benchmark sizes -------------------------------------------------------------
def _benchmark_stacks(kind: str, params: int, clients: int) -> dict[str, torch.Tensor]:
    """The K stacked models the benchmarks smooth: fedceo_smoothing.py's LeNet-5 (copies of the initial model plus
    0.05 N(0, 1)) or server_steps.py's MLP with P parameters (its model plus its noisy rank-1 updates)."""
    import importlib.util
    from pathlib import Path

    from dpfl.engine import params as EP
    from dpfl.models import build_model

    if kind == "lenet5":
        w = EP.model_params(build_model("lenet5", (3, 32, 32), 10, seed=0))
        g = torch.Generator().manual_seed(1)
        return {n: t.unsqueeze(0) + 0.05 * torch.randn(clients, *t.shape, generator=g) for n, t in w.items()}
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "server_steps.py"
    spec = importlib.util.spec_from_file_location("server_steps_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    torch.manual_seed(0)
    model = bench.mlp(params)
    ups = bench.stacked_updates(model, clients, 0)
    return {n: p.detach().unsqueeze(0) + ups[n] for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind, params, clients, thr", [
    ("lenet5", 0, 10, 2.7028),  # fedceo_smoothing.py: K = 10, its default threshold (LeNet sigma_g = 2.0, last)
    ("lenet5", 0, 10, 0.5),
    ("mlp", 10_000, 10, 0.5), ("mlp", 10_000, 30, 0.5), ("mlp", 10_000, 100, 0.5),  # server_steps.py, thr 0.5
    ("mlp", 100_000, 10, 0.5), ("mlp", 100_000, 30, 0.5),
    pytest.param("mlp", 100_000, 100, 0.5, marks=pytest.mark.integration),
    pytest.param("mlp", 1_000_000, 10, 0.5, marks=pytest.mark.integration),
    pytest.param("mlp", 1_000_000, 30, 0.5, marks=pytest.mark.integration),
    pytest.param("mlp", 1_000_000, 100, 0.5, marks=pytest.mark.integration),
])
def test_float32_svt_smooths_like_float64_at_the_benchmark_sizes(kind, params, clients, thr):
    """The condition for float32 as FedCEO's default prox dtype: every smoothed tensor within 1e-4 relative (max
    |y32 - y64| / max |y64|) of the float64 result on the same float32 models. Measured 5e-7 to 3.4e-6 at every
    size here (float32's eps is 1.2e-7; the soft threshold is 1-Lipschitz, so SVT errors do not grow through it)."""
    for name, x in _benchmark_stacks(kind, params, clients).items():
        y64 = smooth_stack(x.double(), thr, rfft=True, dtype=torch.float64)
        y32 = smooth_stack(x, thr, rfft=True, dtype=torch.float32)
        assert y32.dtype == torch.float32
        scale = float(y64.abs().max())
        assert float((y32.double() - y64).abs().max()) <= 1e-4 * scale, name
