"""FedCEO's T-tSVD operator: the proximal operator of the tensor nuclear norm (spec fedceo §2).

The K client copies of one parameter are folded into a real tensor X of shape `[n1, n2, K]` (one frontal
slice per client, §2.1). `t_tsvd(X, thr)` takes the unnormalised DFT along the client mode, soft-thresholds
the singular values of every frequency slice at `thr` and transforms back (§2.2). By Theorem 3.1 this is

    argmin_W  (1/(2 thr)) ||W - X||_F^2 + (1/K) sum_i ||W̄_i||_*,

so removing the high-frequency (inter-client disagreement) part of each client's model is a closed-form
post-processing step. The DC slice is the client sum, hence the mean of the output is the FedAvg mean
soft-thresholded at thr/K (§2.4).

The schedule (§2.3) is thr_j = ϑ^j / (2λ) at the j-th smoothing round t = j·I. It grows without bound for
ϑ > 1 (ϑ = 2 passes the largest float at j = 1024); a threshold beyond the float range is +inf, which is the
limit of the operator: once thr ≥ ‖X̄_0‖_2 ≥ every slice's largest singular value, every singular value is
shrunk to 0 and T-tSVD returns Y = 0 (spec §2.4, Prop. 3.2's second case), so `t_tsvd(X, inf)` is the zero
tensor (and `svt(M, inf)` the zero matrix).
"""

from __future__ import annotations

import math
import numbers
import sys

import torch

_COMPLEX_OF = {torch.float64: torch.complex128, torch.float32: torch.complex64}
_GRAM_DTYPES = (torch.float64, torch.float32, torch.complex128, torch.complex64)
_LOG_FLOAT_MAX = math.log(sys.float_info.max)


# ---- fold / unfold (§2.1) ---------------------------------------------------------------------------


def fold(stacked: torch.Tensor) -> torch.Tensor:
    """`[K, s0, ..., s_{m-1}]` -> `[s_{m-1}·…·s_1, s0, K]`: all axes reversed, then reshaped.

    This is the authors' mapping, so frontal slice `[:, :, k]` is client k's matrix with the output axis
    as columns (Linear `(out, in)` -> `(in, out, K)`, bias `(out,)` -> `(1, out, K)`, Conv2d
    `(out, in, kh, kw)` -> `(kw·kh·in, out, K)`). A scalar parameter (`[K]`) folds to `(1, 1, K)`.
    The result may be a view of `stacked`.
    """
    if stacked.ndim < 1:
        raise ValueError("fold needs the client axis first: a tensor of shape [K, *shape]")
    K, shape = stacked.shape[0], tuple(stacked.shape[1:])
    if not shape:
        return stacked.reshape(1, 1, K)
    n1 = math.prod(shape[1:])  # empty product = 1 (biases)
    return stacked.permute(*reversed(range(stacked.ndim))).reshape(n1, shape[0], K)


def unfold(folded: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Inverse of `fold`: `[n1, n2, K]` -> `[K, *shape]` (contiguous); `unfold(fold(P), P.shape[1:]) == P`."""
    shape = tuple(int(s) for s in shape)
    if folded.ndim != 3:
        raise ValueError(f"unfold needs a folded [n1, n2, K] tensor, got shape {tuple(folded.shape)}")
    want = (math.prod(shape[1:]), shape[0]) if shape else (1, 1)
    if tuple(folded.shape[:2]) != want:
        raise ValueError(f"folded shape {tuple(folded.shape)} does not match parameter shape {shape}")
    K = folded.shape[2]
    out = folded.reshape(*reversed(shape), K)
    return out.permute(*reversed(range(out.ndim))).contiguous()


# ---- singular value thresholding ----------------------------------------------------------------------


def _as_float(name: str, v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {v!r}") from None


def _check_thr(thr: float) -> float:
    t = _as_float("thr", thr)
    if not t >= 0.0:  # NaN or negative; +inf is the limit (every singular value shrunk to 0)
        raise ValueError(f"thr must be a number >= 0 (+inf: shrink everything to 0), got {thr!r}")
    return t


# SVT of a tall or wide slice (longer side >= GRAM_MIN_ASPECT x the shorter side c) works on the c x c Gram
# matrix: its eigendecomposition gives the singular values and the singular vectors of the short side, and
# SVT(X) = X W diag(f) Wᴴ (tall) or W diag(f) Wᴴ X (wide) with f = max(1 - thr/s, 0). This is 1.6-2x faster
# than LAPACK's SVD from aspect 1.5 on (measured in benchmarks/server_steps.py), and T-tSVD's slices are
# often such: Conv2d weights fold to (kw·kh·in) x out, a Linear (out, in) to in x out, biases to 1 x out.
# The Gram matrix squares the condition number: a singular value s comes with a relative error
# ~eps (s_max/s)^2 and the SVT output with an absolute error ~eps s_max^2/s_r, s_r the smallest singular
# value kept. A slice's Gram result is therefore used only when s_r >= ratio·s_max (ratio 1e-4 in float64:
# error <~ 1e4 eps s_max ~ 2e-12 s_max; 1e-2 in float32: <~ 1e-5 s_max); other slices are redone by SVD.
GRAM_MIN_ASPECT = 1.5
_GRAM_MIN_RATIO = {torch.float64: 1e-4, torch.float32: 1e-2}


def _svt_svd(matrices: torch.Tensor, thr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched SVT by LAPACK's thin SVD, and the singular values (descending) before thresholding."""
    u, s, vh = torch.linalg.svd(matrices, full_matrices=False)
    shrunk = (s - thr).clamp_min(0.0)
    # Singular values come sorted descending, so only the first r columns can be non-zero in any slice.
    r = int((s > thr).sum(dim=-1).max()) if s.numel() else 0
    if r == 0:
        return torch.zeros_like(matrices), s
    u, shrunk, vh = u[..., :r], shrunk[..., :r], vh[..., :r, :]
    return (u * shrunk.unsqueeze(-2).to(u.dtype)) @ vh, s


def _svt_gram(matrices: torch.Tensor, thr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched SVT through the short side's Gram matrix (see above); slices it cannot resolve go to SVD."""
    tall = matrices.shape[-2] >= matrices.shape[-1]
    x = matrices
    g = x.mH @ x if tall else x @ x.mH  # [..., c, c] Hermitian
    evals, w = torch.linalg.eigh(g)
    s = evals.flip(-1).clamp_min(0.0).sqrt()  # descending, like the SVD's
    w = w.flip(-1)
    kept = (s > thr).sum(dim=-1)
    r = int(kept.max()) if s.numel() else 0
    if r == 0:
        return torch.zeros_like(matrices), s
    c = s.shape[-1]
    wr = w[..., :r]
    f = (1.0 - thr / s[..., :r]).clamp_min(0.0).to(w.dtype)  # 0 for the discarded (s <= thr, also s = 0)
    if tall:
        y = (x @ wr) @ (f.unsqueeze(-1) * wr.mH) if 2 * r <= c else x @ ((wr * f.unsqueeze(-2)) @ wr.mH)
    else:
        y = (wr * f.unsqueeze(-2)) @ (wr.mH @ x) if 2 * r <= c else ((wr * f.unsqueeze(-2)) @ wr.mH) @ x
    s_r = s.gather(-1, (kept - 1).clamp_min(0).unsqueeze(-1)).squeeze(-1)
    bad = (kept > 0) & (s_r < _GRAM_MIN_RATIO[s.dtype] * s[..., 0])
    if bool(bad.any()):
        y[bad], s[bad] = _svt_svd(matrices[bad], thr)
    return y, s


def _svt(matrices: torch.Tensor, thr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched SVT and the singular values before thresholding (for the zeroed-fraction statistic)."""
    a, b = matrices.shape[-2:]
    if matrices.numel() and max(a, b) >= GRAM_MIN_ASPECT * min(a, b) and matrices.dtype in _GRAM_DTYPES:
        return _svt_gram(matrices, thr)
    return _svt_svd(matrices, thr)


def svt(matrices: torch.Tensor, thr: float) -> torch.Tensor:
    """Soft-threshold the singular values of every matrix in a batch `[..., n1, n2]` (real or complex).

    `U diag(max(s - thr, 0)) Vᴴ` from the thin SVD: the prox of `thr·||·||_*`, i.e. shrinkage, not rank
    truncation. Computed in the input's dtype.
    """
    thr = _check_thr(thr)
    if matrices.ndim < 2:
        raise ValueError(f"svt needs matrices [..., n1, n2], got shape {tuple(matrices.shape)}")
    if thr == 0.0:
        return matrices.clone()
    if thr == math.inf:
        return torch.zeros_like(matrices)
    return _svt(matrices, thr)[0]


# ---- T-tSVD (§2.2) --------------------------------------------------------------------------------------


def t_tsvd_with_stats(
    x: torch.Tensor, thr: float, *, rfft: bool = False, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, float, float]:
    """T-tSVD of a real `[n1, n2, K]` tensor, plus `(fraction of singular values zeroed, max |imag|)`.

    The DFT is unnormalised (`norm="backward"`) because the thresholds (Theorem 3.1, the paper's λ) are
    calibrated for the singular values of unnormalised slices; `ortho` would change thr by √K. Work is
    done in `dtype` (float64 -> complex128 by default: the slices are large and the DC slice is a sum of
    K models) and the result is cast back to `x`'s dtype and device.

    `rfft=True` thresholds only slices 0..K//2 and uses Hermitian symmetry (SVT commutes with complex
    conjugation), halving the SVD work. The fraction counts singular values `s <= thr` over all K slices
    (the rfft path weights the mirrored slices twice, so both paths report the same number); 0.0 when
    thr == 0. `max |imag|` is the imaginary part the final `.real` discards (for rfft: the part irfft
    drops from the DC and Nyquist slices); it should be at rounding level, since the output is real in
    exact arithmetic.
    """
    thr = _check_thr(thr)
    if x.ndim != 3:
        raise ValueError(f"t_tsvd needs a folded [n1, n2, K] tensor, got shape {tuple(x.shape)}")
    _check_real(x, dtype)
    if thr == 0.0:  # every singular value kept unchanged: the identity
        return x.clone(), 0.0, 0.0
    if thr == math.inf:  # every singular value shrunk to 0 (the limit of a growing threshold): Y = 0
        return torch.zeros_like(x), (1.0 if x.shape[2] * min(x.shape[0], x.shape[1]) else 0.0), 0.0
    y, frac, max_imag = _t_tsvd_clients_first(x.permute(2, 0, 1), thr, rfft, dtype)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out.copy_(y.permute(1, 2, 0))  # one strided pass, casting back
    return out, frac, max_imag


def _check_real(x: torch.Tensor, dtype: torch.dtype) -> None:
    if not x.is_floating_point():
        raise ValueError(f"t_tsvd needs a real floating-point tensor, got dtype {x.dtype}")
    if dtype not in _COMPLEX_OF:
        raise ValueError(f"dtype must be torch.float64 or torch.float32, got {dtype}")


def _t_tsvd_clients_first(
    z: torch.Tensor, thr: float, rfft: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, float, float]:
    """T-tSVD with the client axis first: `z` is `[K, a, b]` (slice k = z[k]); returns y `[K, a, b]` in `dtype`.

    The FFT runs along dim 0; its output (frequency innermost in memory) is made contiguous once so the
    batched products and eigendecompositions read `[F, a, b]` slices with unit stride. The inverse FFT's
    result is returned as is (the caller copies it out, casting, in one pass). 0 < thr < inf.
    """
    K, a, b = z.shape
    zw = z.to(dtype=dtype)
    if rfft:
        zf = torch.fft.rfft(zw, dim=0).contiguous()  # [K//2 + 1, a, b]
        del zw
        yf, s = _svt(zf, thr)
        del zf
        # Slices 1..ceil(K/2)-1 stand for themselves and their conjugate mirror K - i.
        weight = torch.full((yf.shape[0],), 2.0, dtype=s.dtype, device=s.device)
        weight[0] = 1.0
        if K % 2 == 0:
            weight[-1] = 1.0
        zeroed = float(((s <= thr).to(s.dtype).sum(dim=-1) * weight).sum())
        # Imaginary part a full ifft of the Hermitian extension would give: (Im Ȳ_0 ± Im Ȳ_{K/2}) / K.
        imag = yf[0].imag.abs()
        if K % 2 == 0 and K > 1:
            imag = imag + yf[-1].imag.abs()
        max_imag = float(imag.max()) / K if imag.numel() else 0.0
        y = torch.fft.irfft(yf, n=K, dim=0)
    else:
        zf = torch.fft.fft(zw, dim=0).contiguous()  # [K, a, b]: one batched SVT
        del zw
        yf, s = _svt(zf, thr)
        del zf
        zeroed = float((s <= thr).sum())
        yc = torch.fft.ifft(yf, dim=0)
        max_imag = float(yc.imag.abs().max()) if yc.numel() else 0.0
        y = yc.real
    total = K * min(a, b)
    return y, (zeroed / total if total else 0.0), max_imag


def t_tsvd(x: torch.Tensor, thr: float, *, rfft: bool = False, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """T-tSVD(x, thr) of a real `[n1, n2, K]` tensor (see `t_tsvd_with_stats`); thr == 0 is the identity."""
    return t_tsvd_with_stats(x, thr, rfft=rfft, dtype=dtype)[0]


def smooth_stack_with_stats(
    stacked: torch.Tensor, thr: float, *, rfft: bool = False, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, float, float]:
    """T-tSVD of one parameter's K client copies `[K, *shape]`, returned as `[K, *shape]`, with the stats
    of `t_tsvd_with_stats` (fraction zeroed, max |imag|).

    Equal to `unfold(t_tsvd(fold(stacked), thr), shape)` up to rounding, without fold's permuted copies:
    it thresholds the slices of `stacked.reshape(K, out, -1)`, i.e. each client's matrix with the output
    axis as rows, the transpose of fold's slice up to the order of the non-output axes. SVT commutes with
    transposition and with row permutations, so this is an equivalent layout (spec fedceo §2.1, test T2).
    """
    thr = _check_thr(thr)
    if stacked.ndim < 1:
        raise ValueError("smooth_stack needs the client axis first: a tensor of shape [K, *shape]")
    _check_real(stacked, dtype)
    K = stacked.shape[0]
    z = stacked.reshape(K, 1, 1) if stacked.ndim == 1 else stacked.reshape(K, stacked.shape[1], -1)
    if thr == 0.0:
        return stacked.clone(), 0.0, 0.0
    if thr == math.inf:
        return torch.zeros_like(stacked), (1.0 if K * min(z.shape[1], z.shape[2]) else 0.0), 0.0
    y, frac, max_imag = _t_tsvd_clients_first(z, thr, rfft, dtype)
    out = torch.empty(stacked.shape, dtype=stacked.dtype, device=stacked.device)
    out.view(z.shape).copy_(y)  # one strided pass, casting back
    return out, frac, max_imag


def smooth_stack(stacked: torch.Tensor, thr: float, **kw) -> torch.Tensor:
    """T-tSVD of one parameter's K client copies `[K, *shape]`, returned as `[K, *shape]`."""
    return smooth_stack_with_stats(stacked, thr, **kw)[0]


# ---- schedule (§2.3) --------------------------------------------------------------------------------------


def _check_pos_int(name: str, v: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return int(v)


def threshold(j: int, lam: float, theta: float) -> float:
    """thr_j = ϑ^j / (2λ) for the j-th smoothing (j >= 1): τ_j = λ/ϑ^j shrinks, so smoothing grows with j.

    Never raises for valid arguments: a threshold beyond the float range is +inf (decided in log space,
    log thr_j = j log ϑ − log 2λ), which `t_tsvd` maps to the zero tensor, the operator's limit.
    """
    j = _check_pos_int("j", j)
    lam, theta = _as_float("lam", lam), _as_float("theta", theta)
    if not (math.isfinite(lam) and lam > 0.0):
        raise ValueError(f"lam must be a finite number > 0, got {lam!r}")
    if not (math.isfinite(theta) and theta >= 1.0):
        raise ValueError(f"theta must be a finite number >= 1, got {theta!r}")
    if theta == 1.0:
        return 1.0 / (2.0 * lam)  # the ϑ = 1 ablation: constant (also for a j too large for a float)
    try:
        log_thr = j * math.log(theta) - math.log(2.0) - math.log(lam)
        if log_thr > _LOG_FLOAT_MAX:
            return math.inf
        return theta**j / (2.0 * lam)  # the division itself rounds to inf if it overflows
    except OverflowError:  # j too large for a float, or ϑ^j just past the range
        return math.inf


def is_smoothing_round(t: int, interval: int) -> bool:
    """True at rounds t = I, 2I, ... (t is 1-based)."""
    t, interval = _check_pos_int("t", t), _check_pos_int("interval", interval)
    return t % interval == 0


def smoothing_index(t: int, interval: int) -> int:
    """j = t // I: the index of the latest smoothing at or before round t (j-th smoothing at t = j·I)."""
    t, interval = _check_pos_int("t", t), _check_pos_int("interval", interval)
    return t // interval
