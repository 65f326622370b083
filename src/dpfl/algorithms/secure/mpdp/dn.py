"""The DN distributions of MP-DP's Theorem 3: products of them are exactly Gaussian (spec bidirectional.md §2).

For Z ~ N(0, σ^2) and m, n >= 1, Z =d X_1...X_m Y_1...Y_n with X_i i.i.d. DN*(m) and Y_j i.i.d. DN(σ, n):
    DN*(m)  =d β exp{-Σ_{l>=1} [G_{1/m,l} / (2l+1) - ln(1 + 1/l) / (2m)]}
    DN(σ,n) =d β exp{ln(√2 σ)/n - G_{1/n}}
with G_{a,.} ~ Gamma(a, 1) independent and β a Rademacher sign. The server's factors use only |DN*(m)|
(positivity commutes with ReLU); the clients' noise carries the sign.

Gamma draws come from an explicit numpy Generator (torch has no seeded Gamma sampler); results are float64
torch tensors.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.special import digamma, polygamma


def _shape(shape: int | tuple[int, ...]) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(shape)


def dn_star_abs(m: int, shape: int | tuple[int, ...], gen: np.random.Generator, lmax: int = 2000,
                tail: bool = True, chunk: int = 4096, series: bool = False) -> torch.Tensor:
    """|DN*(m)| samples. m = 1 is exact as sqrt(Gamma(3/2, 1)) unless `series` (for testing the series).

    m >= 2 sums the series to `lmax` terms, `chunk` samples at a time; `tail` adds T ~ N(μ_T, v_T) to the
    log-magnitude, the exact mean and variance of the omitted terms (a CLT approximation of their shape).
    """
    if m < 1 or lmax < 1:
        raise ValueError(f"DN*(m) needs m >= 1 and lmax >= 1, got m={m}, lmax={lmax}")
    shape = _shape(shape)
    count = math.prod(shape)
    if m == 1 and not series:
        return torch.from_numpy(np.sqrt(gen.standard_gamma(1.5, size=count))).reshape(shape)
    ell = np.arange(1, lmax + 1, dtype=np.float64)
    weights = 1.0 / (2 * ell + 1)
    drift = np.log1p(1.0 / ell).sum() / (2 * m)
    out = np.empty(count)
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        g = gen.standard_gamma(1.0 / m, size=(n, lmax))
        out[start:start + n] = drift - g @ weights
    if tail:
        mu_t = (digamma(lmax + 1.5) - math.log(lmax + 1)) / (2 * m)
        v_t = polygamma(1, lmax + 1.5) / (4 * m)
        out += gen.normal(mu_t, math.sqrt(v_t), size=count)
    return torch.from_numpy(np.exp(out)).reshape(shape)


def dn_star_abs_from_uniforms(m: int, u: np.ndarray, lmax: int) -> np.ndarray:
    """|DN*(m)| from uniforms u of shape [count, lmax + 2]: Gamma(1/m) quantiles (scipy's gammaincinv) for the series
    and a Box-Muller normal from the last two for the tail term. Used where both ends of an edge must draw the same
    factor from a shared stream (spec §7.3)."""
    from scipy.special import gammaincinv

    if u.ndim != 2 or u.shape[1] != lmax + 2:
        raise ValueError(f"need uniforms of shape [count, {lmax + 2}], got {u.shape}")
    ell = np.arange(1, lmax + 1, dtype=np.float64)
    g = gammaincinv(1.0 / m, u[:, :lmax])
    log = np.log1p(1.0 / ell).sum() / (2 * m) - g @ (1.0 / (2 * ell + 1))
    z = np.sqrt(-2 * np.log(u[:, lmax])) * np.cos(2 * np.pi * u[:, lmax + 1])
    mu_t = (digamma(lmax + 1.5) - math.log(lmax + 1)) / (2 * m)
    v_t = polygamma(1, lmax + 1.5) / (4 * m)
    return np.exp(log + mu_t + math.sqrt(v_t) * z)


def dn(sigma: float, n: int, shape: int | tuple[int, ...], gen: np.random.Generator) -> torch.Tensor:
    """Signed DN(σ, n) samples; n = 1 is exactly Uniform(-√2 σ, √2 σ) (exp(-Exp(1)) ~ U(0, 1))."""
    if not sigma > 0 or n < 1:
        raise ValueError(f"DN(σ, n) needs σ > 0 and n >= 1, got σ={sigma}, n={n}")
    shape = _shape(shape)
    count = math.prod(shape)
    if n == 1:
        return torch.from_numpy(gen.uniform(-math.sqrt(2) * sigma, math.sqrt(2) * sigma, size=count)).reshape(shape)
    magnitude = np.exp(math.log(math.sqrt(2) * sigma) / n - gen.standard_gamma(1.0 / n, size=count))
    sign = gen.integers(0, 2, size=count) * 2 - 1
    return torch.from_numpy(sign * magnitude).reshape(shape)


def reference_moments(m: int) -> dict[str, float]:
    """E ln|DN*(m)|, Var ln|DN*(m)|, E|DN*(m)|, E[DN*(m)^2] (spec §2)."""
    return {"mean_log": float(digamma(1.5)) / (2 * m), "var_log": float(polygamma(1, 1.5)) / (4 * m),
            "mean_abs": (2 / math.sqrt(math.pi)) ** (1 / m), "mean_sq": 1.5 ** (1 / m)}
