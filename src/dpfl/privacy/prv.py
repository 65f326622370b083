"""The PRV accountant (Gopi, Lee, Wutschitz, "Numerical Composition of Differential Privacy", NeurIPS 2021).

A mechanism's privacy loss random variable (PRV) for a dominating pair (P, Q) is Y = log(P(w) / Q(w)), w ~ P; then
delta(eps) = E[(1 - exp(eps - Y))_+], and composing mechanisms adds independent PRVs, so the composition's PMF is
a convolution. The paper truncates each PRV to [-L, L], discretises it on a mesh h (cell-centred, shifted so each
discrete PRV keeps the continuous mean), convolves by FFT, and proves (Theorem 5.5) that with
h = eps_error / sqrt(N/2 log(12 / delta_error)) (N compositions) the result brackets the true curve:
delta_est(eps + eps_error) - delta_error <= delta(eps) <= delta_est(eps - eps_error) + delta_error, so

    eps_lower = eps_est(delta + delta_error) - eps_error  <=  eps(delta)  <=  eps_upper = eps_est(delta - delta_error)
    + eps_error.

dpfl reports ``eps_upper`` (a guarantee) and keeps the other two as its error bars. The discretisation, the
truncation bound L (Remark 5.6, from RDP) and the FFT composition are the ``prv-accountant`` package's (0.2,
PyPI); dpfl adds, from the paper's definitions:

* the *add* direction of the Poisson-subsampled Gaussian. With M = (1-q) N(0, z^2) + q N(1, z^2) the package's
  PRV is the pair (M, N(0, z^2)) (remove a record); adding one is (N(0, z^2), M), whose PRV is -l(x), x ~ N(0, z^2),
  l(x) = log(1 - q + q exp((x - 1/2) / z^2)). Add/remove adjacency must hold both ways, so epsilon is the larger
  of the two compositions (as dp_accounting's PLD does). Its RDP, used only to size L, is bounded by the remove
  direction's (Mironov, Talwar, Zhang 2019, Theorem 5);
* the truncated PRVs' means by quadrature over the Gaussian sample x (the package integrates the CDF over
  [-L, L], which misses its mean by more than h / 2 for wide domains and then refuses);
* plain Gaussians composed exactly first (mu^2 = sum 1 / z_i^2: one composition instead of many), and every
  distinct (q, z) one PRV self-composed ``count`` times (the heterogeneous composition, ``max_self_compositions``);
* a budget of ``PRV_MAX_POINTS`` mesh points: a longer domain raises eps_error until it fits (the bound stays
  valid, just wider: ``PrvBounds.eps_error`` says which was used);
* a cache by event signature (the leaves and delta), so a per-client ledger pays once per distinct history.

Discretisation (dpfl's choice): eps_error = ``PRV_EPS_ERROR`` = 0.01 and delta_error = delta x
``PRV_DELTA_ERROR_FRACTION`` = delta / 1000 (the package's own DP-SGD default). 1,000 DP-SGD steps take ~0.3 s.
Supported: Gaussian and Poisson-subsampled Gaussian mechanisms, composed (add/remove adjacency); everything else
(fixed-size sampling, Laplace, zCDP, ...) raises ValueError (``check_prv_supports``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections import Counter

import dp_accounting as dpa
import numpy as np
from scipy import fft, integrate, special, stats

from dpfl.privacy.rdp_curves import Z_NO_PRIVACY

__all__ = [
    "PRV_DELTA_ERROR_FRACTION",
    "PRV_EPS_ERROR",
    "PRV_MAX_POINTS",
    "PrvBounds",
    "check_prv_supports",
    "prv_bounds",
]

PRV_EPS_ERROR = 0.01
PRV_DELTA_ERROR_FRACTION = 1e-3
PRV_MAX_POINTS = 2**21  # mesh points of one discretised PRV (long double: 32 MiB per array; ~0.2 s per FFT)
_SPAN = 40.0  # standard deviations of the Gaussian sample integrated over for a mean (mass beyond: ~1e-350)


@dataclasses.dataclass(frozen=True)
class PrvBounds:
    """The PRV accountant's answer at one delta: ``lower <= true epsilon <= upper``; ``estimate`` its point value.

    ``eps_error`` and ``delta_error`` are the discretisation's stated errors (upper = estimate at
    delta - delta_error, plus eps_error); dpfl reports ``upper``.
    """

    lower: float
    estimate: float
    upper: float
    eps_error: float
    delta_error: float


def _refuse(event: dpa.DpEvent) -> ValueError:
    return ValueError(
        f"accountant='prv' accounts Gaussian and Poisson-subsampled Gaussian mechanisms only (add/remove adjacency); "
        f"got {type(event).__name__}: use accountant='rdp'"
    )


def _leaves(event: dpa.DpEvent, count: int, gauss: list[float], sampled: Counter) -> bool:
    """Flatten ``event``: plain Gaussians' 1 / z^2 (times count) into ``gauss``, each Poisson-subsampled Gaussian's
    count into ``sampled[(q, z)]``. False if the event is non-private (epsilon inf); ValueError if unsupported."""
    if isinstance(event, dpa.NoOpDpEvent):
        return True
    if isinstance(event, dpa.NonPrivateDpEvent):
        return count == 0
    if isinstance(event, dpa.SelfComposedDpEvent):
        return _leaves(event.event, count * int(event.count), gauss, sampled)
    if isinstance(event, dpa.ComposedDpEvent):
        return all([_leaves(e, count, gauss, sampled) for e in event.events])  # every leaf checked
    if isinstance(event, dpa.GaussianDpEvent):
        q, z = 1.0, float(event.noise_multiplier)
    elif isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(event.event, dpa.GaussianDpEvent):
        q, z = float(event.sampling_probability), float(event.event.noise_multiplier)
    else:
        raise _refuse(event)
    if not z >= 0.0 or not 0.0 <= q <= 1.0:
        raise ValueError(f"noise multiplier must be >= 0 and sampling probability in [0, 1], got {event!r}")
    if q == 0.0 or count == 0 or z == math.inf:
        return True  # nobody sampled, composed zero times, or infinite noise: no privacy loss
    if z < Z_NO_PRIVACY:
        return False  # as the other accountants: +inf
    if q == 1.0:
        gauss.append(count / (z * z))
    else:
        sampled[(q, z)] += count
    return True


def check_prv_supports(event: dpa.DpEvent) -> None:
    """Raise ValueError for events the PRV accountant cannot account (fixed-size sampling, Laplace, zCDP, ...)."""
    _leaves(event, 1, [], Counter())


class _AddDirection:
    """The PRV of (N(0, z^2), M), M = (1-q) N(0, z^2) + q N(1, z^2): -l(x), x ~ N(0, z^2) (module docstring)."""

    def __init__(self, q: float, z: float) -> None:
        self.q, self.z = q, z

    def _x_of_loss(self, s):
        """l^{-1}(s) = 1/2 + z^2 log((e^s - 1 + q) / q) for s > log(1-q); -inf at or below it."""
        s = np.asarray(s, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            inner = np.expm1(s) + self.q
            x = 0.5 + self.z**2 * (np.log(np.where(inner > 0, inner, 1.0)) - math.log(self.q))
        return np.where(inner > 0, x, -np.inf)

    def cdf(self, t):
        """P(-l(x) <= t) = P(x >= l^{-1}(-t)) = Phi(-l^{-1}(-t) / z)."""
        return special.ndtr(-self._x_of_loss(-np.asarray(t, dtype=np.float64)) / self.z)

    def probability(self, a, b):
        """P(a < -l(x) <= b) = Phi(x_a / z) - Phi(x_b / z), x_t = l^{-1}(-t), as a difference of the smaller tails."""
        ua = self._x_of_loss(-np.asarray(a, dtype=np.float64)) / self.z
        ub = self._x_of_loss(-np.asarray(b, dtype=np.float64)) / self.z
        return np.maximum(_normal_mass(ub, ua), 0.0)


class _RemoveDirection(_AddDirection):
    """The PRV of (M, N(0, z^2)): l(x), x ~ M, the package's ``PoissonSubsampledGaussianMechanism`` written in
    float64 with both Gaussian components' masses as differences of their smaller tails (~5x faster; the package
    evaluates it in long double but rounds erfc's argument to double anyway)."""

    def cdf(self, t):
        """P(l(x) <= t) = (1 - q) Phi(x_t / z) + q Phi((x_t - 1) / z), x_t = l^{-1}(t)."""
        x = self._x_of_loss(np.asarray(t, dtype=np.float64))
        return (1 - self.q) * special.ndtr(x / self.z) + self.q * special.ndtr((x - 1.0) / self.z)

    def probability(self, a, b):
        xa = self._x_of_loss(np.asarray(a, dtype=np.float64))
        xb = self._x_of_loss(np.asarray(b, dtype=np.float64))
        return np.maximum((1 - self.q) * _normal_mass(xa / self.z, xb / self.z)
                          + self.q * _normal_mass((xa - 1.0) / self.z, (xb - 1.0) / self.z), 0.0)


def _normal_mass(ua, ub):
    """Phi(ub) - Phi(ua) for ua <= ub, as a difference of the smaller tails."""
    with np.errstate(invalid="ignore"):
        return np.where(ua > 0, special.ndtr(-ua) - special.ndtr(-ub), special.ndtr(ub) - special.ndtr(ua))


def _loss(x: np.ndarray, q: float, z: float) -> np.ndarray:
    """l(x) = log(1 - q + q exp((x - 1/2) / z^2)), stably."""
    return np.logaddexp(math.log1p(-q), math.log(q) + (x - 0.5) / (z * z))


def _normal_mean(fn, lo: float, hi: float, shift: float, z: float) -> tuple[float, float]:
    """(integral of fn(x) phi((x - shift) / z) / z over [lo, hi], its mass), by quadrature in s = (x - shift) / z."""
    a, b = max((lo - shift) / z, -_SPAN), min((hi - shift) / z, _SPAN)
    if not a < b:
        return 0.0, 0.0
    mass = float(special.ndtr(b) - special.ndtr(a)) if b <= 0 else float(special.ndtr(-a) - special.ndtr(-b))
    points = [p for p in (-8.0, -3.0, -1.0, 0.0, 1.0, 3.0, 8.0) if a < p < b]
    value, _ = integrate.quad(lambda s: fn(shift + z * s) * math.exp(-0.5 * s * s) / math.sqrt(2 * math.pi), a, b,
                              points=points or None, limit=400, epsabs=1e-15, epsrel=1e-12)
    return float(value), mass


class _Truncated:
    """A PRV conditioned on [t_min, t_max], with its mean computed accurately (the discretiser keeps it)."""

    pm_inf = 0.0

    def __init__(self, prv, t_min: float, t_max: float, mean: float) -> None:
        self.prv, self.t_min, self.t_max, self._mean = prv, t_min, t_max, mean
        self.remaining_mass = float(prv.probability(np.float64(t_min), np.float64(t_max)))

    def probability(self, a, b):
        a = np.clip(a, self.t_min, self.t_max)
        b = np.clip(b, self.t_min, self.t_max)
        return self.prv.probability(a, b) / self.remaining_mass

    def mean(self) -> float:
        return self._mean


def _truncated_mean(kind: str, q: float, z: float, t_min: float, t_max: float) -> float:
    """E[Y | t_min <= Y <= t_max] of the leaf's PRV Y ("gauss": q is mu; "remove" / "add": subsampled Gaussian)."""
    if kind == "gauss":
        mu = q
        loc, scale = mu * mu / 2.0, mu
        return float(stats.truncnorm.mean((t_min - loc) / scale, (t_max - loc) / scale, loc=loc, scale=scale))
    x_lo_hi = _AddDirection(q, z)._x_of_loss
    if kind == "remove":  # Y = l(x), x ~ M: Y in [a, b] <=> x in [l^-1(a), l^-1(b)]
        lo, hi = float(x_lo_hi(t_min)), float(x_lo_hi(t_max))
        v0, m0 = _normal_mean(lambda x: float(_loss(np.float64(x), q, z)), lo, hi, 0.0, z)
        v1, m1 = _normal_mean(lambda x: float(_loss(np.float64(x), q, z)), lo, hi, 1.0, z)
        return ((1 - q) * v0 + q * v1) / ((1 - q) * m0 + q * m1)
    lo, hi = float(x_lo_hi(-t_max)), float(x_lo_hi(-t_min))  # Y = -l(x), x ~ N(0, z^2)
    v, m = _normal_mean(lambda x: -float(_loss(np.float64(x), q, z)), lo, hi, 0.0, z)
    return v / m


def _fast_domain(length: float, mesh: float):
    """The package's aligned domain [-K mesh, (K + 1) mesh] (2K + 2 nodes, K mesh >= length: the layout its FFT
    composer assumes), with K raised so that 2K + 2 is a size FFTs are fast for (a large prime factor made one
    composition ~10x slower)."""
    from prv_accountant.domain import Domain

    size = fft.next_fast_len(2 * math.ceil(length / mesh) + 2, real=True)
    while size % 2:
        size = fft.next_fast_len(size + 1, real=True)
    k = size // 2 - 1
    return Domain(-k * mesh, (k + 1) * mesh, size)


def _domain_length(gauss_mu: float, sampled: tuple, eps_error: float, delta_error: float) -> float:
    """The truncation bound L of the paper's Remark 5.6 (the package's ``compute_safe_domain_size``): the RDP
    epsilon of the whole composition at delta_error / 4 and of each single mechanism at delta_error / (8 N), plus 3,
    from dpfl's cached RDP curves (dp_accounting's bounds; the package's scalar series took seconds). Both directions
    share it: the add direction's RDP is at most the remove direction's (Mironov, Talwar, Zhang 2019, Theorem 5)."""
    from dpfl.privacy.accountant import rdp_epsilon_and_order

    singles = [dpa.GaussianDpEvent(1.0 / gauss_mu)] if gauss_mu > 0.0 else []
    singles += [dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)) for q, z, _ in sampled]
    counts = ([1] if gauss_mu > 0.0 else []) + [n for _, _, n in sampled]
    whole = dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(e, n) for e, n in zip(singles, counts, strict=True)])
    total = sum(counts)
    length = rdp_epsilon_and_order(whole, delta_error / 4.0)[0]
    for e in singles:
        length = max(length, rdp_epsilon_and_order(e, delta_error / 8.0 / total)[0])
    return max(length, eps_error) + 3.0


def _compose(leaves: tuple, counts: list[int], length: float, eps_error: float, delta_error: float):
    """The package's PRVAccountant pipeline on ``leaves`` ((kind, q, z) per PRV) over [-length, length], with
    accurate truncated means; returns (the composed discrete PRV, the eps_error its mesh gives)."""
    from prv_accountant import GaussianMechanism, composers, discretisers

    prvs = []
    for kind, q, z in leaves:
        if kind == "gauss":
            prvs.append(GaussianMechanism(noise_multiplier=1.0 / q))
        elif kind == "remove":
            prvs.append(_RemoveDirection(q, z))
        else:
            prvs.append(_AddDirection(q, z))
    total = sum(counts)
    spread = math.sqrt(total / 2.0 * math.log(12.0 / delta_error))
    points = 2.0 * length * spread / eps_error
    if points > PRV_MAX_POINTS:  # a coarser mesh: the same bounds, wider
        eps_error *= points / PRV_MAX_POINTS
    domain = _fast_domain(length, eps_error / spread)
    discrete = []
    for (kind, q, z), prv in zip(leaves, prvs, strict=True):
        mean = _truncated_mean(kind, q, z, domain.t_min(), domain.t_max())
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            discrete.append(discretisers.CellCentred().discretise(
                _Truncated(prv, domain.t_min(), domain.t_max(), mean), domain))
    return composers.Heterogeneous(discrete).compute_composition(counts), eps_error


def _epsilons(composed, delta: float, delta_error: float, eps_error: float) -> tuple[float, float, float]:
    """The package's (lower, estimate, upper) from the composed PRV, with epsilons at or below the domain's start
    (no finite privacy loss left to spend: the PMF's first cell already meets delta) read as 0."""
    t, p = composed.domain.ts(), composed.pmf
    d1 = np.flip(np.flip(p).cumsum())
    d2 = np.flip(np.flip(p * np.exp(-t)).cumsum())
    neg_delta = np.exp(t) * d2 - d1

    def at(target: float) -> float:
        i = int(np.searchsorted(neg_delta, -target, side="left"))
        if i >= len(t):
            return math.inf
        return 0.0 if i == 0 else max(0.0, float(np.log((d1[i] - target) / d2[i])))

    if np.finfo(np.longdouble).eps * len(t) > delta - delta_error:
        raise ValueError(f"accountant='prv' cannot resolve delta={delta:g} (long-double rounding over "
                         f"{len(t)} points); use accountant='pld' or 'rdp'")
    upper = at(delta - delta_error) + eps_error
    lower = max(0.0, at(delta + delta_error) - eps_error)
    return lower, at(delta), upper


def _check_delta(delta: object) -> float:
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
    return float(delta)


@functools.lru_cache(maxsize=4096)
def _bounds(gauss_mu: float, sampled: tuple, delta: float, eps_error: float, delta_error: float) -> PrvBounds:
    """``prv_bounds`` of one signature: mu of the composed plain Gaussians, ((q, z, count), ...) sorted."""
    if gauss_mu == 0.0 and not sampled:
        return PrvBounds(0.0, 0.0, 0.0, eps_error, delta_error)
    results = []
    length = _domain_length(gauss_mu, sampled, eps_error, delta_error)
    for direction in ("remove", "add"):
        leaves, counts = [], []
        if gauss_mu > 0.0:
            leaves.append(("gauss", gauss_mu, math.inf))
            counts.append(1)
        for q, z, n in sampled:
            leaves.append((direction, q, z))
            counts.append(n)
        composed, used = _compose(tuple(leaves), counts, length, eps_error, delta_error)
        results.append((_epsilons(composed, delta, delta_error, used), used))
        if not sampled:
            break  # plain Gaussians: one direction (symmetric)
    lower, estimate, upper = (max(r[0][i] for r in results) for i in range(3))  # the worse direction, each bound
    return PrvBounds(lower, estimate, upper, max(r[1] for r in results), delta_error)


def prv_bounds(event: dpa.DpEvent, delta: float, *, eps_error: float = PRV_EPS_ERROR,
               delta_error: float | None = None) -> PrvBounds:
    """The PRV accountant's (lower, estimate, upper) epsilon of ``event`` at ``delta``; ``upper`` is a guarantee.

    ``delta_error`` defaults to ``delta x PRV_DELTA_ERROR_FRACTION``. Epsilon is inf (all three) for a non-private
    event. Cached by the event's signature (its plain-Gaussian mu and its (q, z, count) leaves) and delta.
    """
    delta = _check_delta(delta)
    if isinstance(eps_error, bool) or not isinstance(eps_error, numbers.Real) or not 0.0 < float(eps_error) <= 1.0:
        raise ValueError(f"eps_error must be a number in (0, 1], got {eps_error!r}")
    delta_error = delta * PRV_DELTA_ERROR_FRACTION if delta_error is None else float(delta_error)
    if not 0.0 < delta_error < delta:
        raise ValueError(f"delta_error must be in (0, delta), got {delta_error!r}")
    gauss: list[float] = []
    sampled: Counter = Counter()
    if not _leaves(event, 1, gauss, sampled):
        return PrvBounds(math.inf, math.inf, math.inf, float(eps_error), delta_error)
    mu = math.sqrt(math.fsum(gauss))
    if mu == math.inf:
        return PrvBounds(math.inf, math.inf, math.inf, float(eps_error), delta_error)
    leaves = tuple(sorted((q, z, n) for (q, z), n in sampled.items() if n > 0))
    return _bounds(mu, leaves, delta, float(eps_error), delta_error)
