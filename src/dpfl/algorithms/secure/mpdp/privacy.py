"""MP-DP's privacy calculator: Theorems 10 (complete graph) and 11 (random n-out graph) from GOPA, a solver for
the client noise, and per-client composition over rounds — all NOMINAL (spec bidirectional.md §8).

Nominal: the theorems treat R∘η and R∘Δ as independent Gaussians, which holds only marginally over the server's
secret R (W1), and the correction terms Ψ, Φ are released noise-free (W2). So MP-DP rounds never enter dpfl's
RDP/PLD accountant; every figure here carries NOMINAL_LABEL.

θ uses the variance form 1/(σ_η² K) + 1/(σ_Δ² K) (the paper prints σ without the square; §8.1 says why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

NOMINAL_LABEL = "nominal — assumes the idealised Gaussian model of Theorems 5/6; see W1/W2"
Graph = Literal["complete", "n_out"]


class PrivacyConfigError(ValueError):
    """A parameter set the theorems do not cover; the message names each violated condition."""


def _c(delta: float) -> float:
    return max(1.0, 2 * math.log(2 / (delta * math.sqrt(2 * math.pi))))


def theta_max(eps: float, delta: float) -> float:
    """The largest θ with ε >= θ/2 + √θ and (ε - θ/2)^2 >= 2 ln(2/(δ√(2π))) θ: (√(c + 2ε) - √c)^2."""
    c = _c(delta)
    return (math.sqrt(c + 2 * eps) - math.sqrt(c)) ** 2


def epsilon_of_theta(theta: float, delta: float) -> float:
    """The smallest ε both inequalities allow for a given θ: θ/2 + √(c θ)."""
    return theta / 2 + math.sqrt(_c(delta) * theta)


def n_out_conditions(K: int, n: int, delta_inner: float) -> list[str]:
    """Theorem 11's conditions that fail, each with the smallest admissible value (empty: all hold)."""
    failed = []
    if K < 81:
        failed.append(f"K >= 81 (K = {K})")
    if n >= K:
        failed.append(f"n < K (n = {n}, K = {K})")
    bounds = {"n >= 4 ln(2K/(3δ))": 4 * math.log(2 * K / (3 * delta_inner)),
              "n >= 6 ln(K/3)": 6 * math.log(K / 3) if K > 0 else 0.0,
              "n >= 3/2 + (9/4) ln(2e/δ)": 1.5 + 2.25 * math.log(2 * math.e / delta_inner)}
    for name, bound in bounds.items():
        if n < bound:
            failed.append(f"{name} (needs n >= {bound:.2f}, n = {n})")
    if (n - 1) // 3 - 1 < 1:
        failed.append(f"floor((n-1)/3) - 1 >= 1 (n = {n})")
    return failed


def c_n(K: int, n: int) -> float:
    """The σ_Δ^-2 coefficient of θ under Theorem 11: 1/(floor((n-1)/3) - 1) + (12 + 6 ln K)/K."""
    return 1.0 / ((n - 1) // 3 - 1) + (12 + 6 * math.log(K)) / K


@dataclass(frozen=True)
class PrivacyPlan:
    """Per-round (ε, δ) of DDP_Client with the noise multipliers that give it (units of the sensitivity S)."""

    eps: float
    delta: float
    sigma_eta: float
    sigma_delta: float
    K: int
    graph: str
    n: int | None
    theorem: str
    stamps: tuple[str, ...] = field(default_factory=tuple)  # UNVERIFIED markers, repeated wherever it is shown

    @property
    def label(self) -> str:
        return "; ".join((NOMINAL_LABEL,) + self.stamps)


def _check_common(eps: float | None, delta: float, K: int) -> None:
    if eps is not None and not eps > 0:
        raise PrivacyConfigError(f"ε must be > 0, got {eps}")
    if not 0 < delta < 1:
        raise PrivacyConfigError(f"δ must be in (0, 1), got {delta}")
    if K < 1:
        raise PrivacyConfigError(f"K must be >= 1, got {K}")


def _resolve(graph: Graph, K: int, n: int | None, delta: float, mode: str) -> tuple[float, float, str, tuple[str, ...]]:
    """(δ used inside the theorem, σ_Δ^-2 coefficient of θ, theorem, stamps) for the graph, or an error."""
    if mode not in ("verified", "unverified"):
        raise PrivacyConfigError(f"mode must be 'verified' or 'unverified', got {mode!r}")
    if graph == "complete":
        return delta, 1.0 / K, "Theorem 10 (complete graph)", ()
    if graph != "n_out":
        raise PrivacyConfigError(f"graph must be 'complete' or 'n_out', got {graph!r}")
    if n is None:
        raise PrivacyConfigError("an n-out graph needs n")
    failed = n_out_conditions(K, n, delta / 3)
    if not failed:
        return delta / 3, c_n(K, n), "Theorem 11 (random n-out graph), evaluated at δ/3", ()
    if mode == "verified":
        raise PrivacyConfigError("Theorem 11 conditions violated: " + "; ".join(failed) +
                                 " (mode='unverified' applies Theorem 10 as if the graph were complete, stamped)")
    return delta, 1.0 / K, "Theorem 10 applied to an n-out graph", (
        f"UNVERIFIED: Theorem 11 conditions violated ({'; '.join(failed)})",)


def solve_sigma_eta(eps: float, delta: float, K: int, sigma_delta: float, graph: Graph = "complete",
                    n: int | None = None, mode: str = "verified", k_honest: int | None = None) -> PrivacyPlan:
    """The σ_η that makes one round (ε, δ)-DP (nominal) given σ_Δ (math.inf allowed); `k_honest` replaces K under
    assumed collusion."""
    k = k_honest if k_honest is not None else K
    _check_common(eps, delta, k)
    inner, coeff, theorem, stamps = _resolve(graph, k, n, delta, mode)
    tmax = theta_max(eps, inner)
    pairwise = 0.0 if math.isinf(sigma_delta) or not sigma_delta > 0 else coeff / sigma_delta**2
    if not sigma_delta > 0 or pairwise >= tmax:
        smallest = math.sqrt(coeff / tmax)
        raise PrivacyConfigError(f"σ_Δ = {sigma_delta:g} is too small for ε = {eps:g}: it must exceed {smallest:.4g}")
    sigma_eta = 1.0 / math.sqrt(k * (tmax - pairwise))
    return PrivacyPlan(eps, delta, sigma_eta, sigma_delta, k, graph, n, theorem, stamps)


def min_sigma_delta(eps: float, delta: float, K: int, graph: Graph = "complete", n: int | None = None,
                    mode: str = "verified", k_honest: int | None = None) -> float:
    """The admissible minimum of σ_Δ (σ_Δ must exceed it): (K θ_max)^-1/2, or (c_n / θ_max)^1/2 for n-out."""
    k = k_honest if k_honest is not None else K
    _check_common(eps, delta, k)
    inner, coeff, _, _ = _resolve(graph, k, n, delta, mode)
    return math.sqrt(coeff / theta_max(eps, inner))


def epsilon_of(sigma_eta: float, sigma_delta: float, delta: float, K: int, graph: Graph = "complete",
               n: int | None = None, mode: str = "verified", k_honest: int | None = None) -> PrivacyPlan:
    """The per-round nominal ε of given noise multipliers."""
    k = k_honest if k_honest is not None else K
    _check_common(None, delta, k)
    if not sigma_eta > 0 or not sigma_delta > 0:
        raise PrivacyConfigError(f"σ_η and σ_Δ must be > 0, got {sigma_eta}, {sigma_delta}")
    inner, coeff, theorem, stamps = _resolve(graph, k, n, delta, mode)
    pairwise = 0.0 if math.isinf(sigma_delta) else coeff / sigma_delta**2
    theta = 1.0 / (k * sigma_eta**2) + pairwise
    return PrivacyPlan(epsilon_of_theta(theta, inner), delta, sigma_eta, sigma_delta, k, graph, n, theorem, stamps)


def composed(eps: float, delta: float, participations: int, delta_prime: float = 1e-5) -> dict[str, object]:
    """Per-client composition over p participations: basic, advanced (Dwork-Rothblum-Vadhan 2010), the tighter."""
    p = participations
    basic = (p * eps, p * delta)
    growth = math.expm1(eps) if eps < 700 else math.inf  # e^ε - 1 overflows a float beyond ε ≈ 709
    advanced = (eps * math.sqrt(2 * p * math.log(1 / delta_prime)) + p * eps * growth, p * delta + delta_prime)
    tighter = "basic" if basic[0] <= advanced[0] else "advanced"
    return {"participations": p, "per_round": {"epsilon": eps, "delta": delta},
            "basic": {"epsilon": basic[0], "delta": basic[1]},
            "advanced": {"epsilon": advanced[0], "delta": advanced[1], "delta_prime": delta_prime},
            "composed": {"epsilon": min(basic[0], advanced[0]), "delta": basic[1] if tighter == "basic" else
                         advanced[1], "which": tighter, "label": f"T-fold composed ({NOMINAL_LABEL})"},
            "label": NOMINAL_LABEL}


def conditional_audit(secrets, sigma_eta: float, sigma_delta: float, delta: float, K: int, graph: Graph = "complete",
                      n: int | None = None, mode: str = "unverified") -> dict[str, object]:
    """W1 audit of one round's factors under `gaussian_conditional` noise: given R the server's view of coordinate
    (i, j) is ∇F_ij + R_ij N(0, S² σ²); dividing by R_ij is a GOPA instance whose data term has sensitivity at most
    S / min R. Reports quantiles of R over the odd layers and the §8 bound at that effective sensitivity."""
    import torch

    L = len(secrets.r) + 1
    values = torch.cat([secrets.odd_factor(l).reshape(-1) for l in range(1, L + 1)])  # the distinct entries of R
    q = torch.quantile(values[: 2**24], torch.tensor([0.0, 0.01, 0.5, 0.99, 1.0], dtype=values.dtype)).tolist()
    min_r = q[0]
    scale = min_r  # σ' = σ min R in units of the effective sensitivity
    out = {"R_quantiles": dict(zip(("min", "q01", "median", "q99", "max"), q, strict=True)),
           "effective_sensitivity_factor": 1.0 / min_r, "epsilon_conditional": math.inf,
           "label": "conditional on R (gaussian_conditional): the §8 bound at sensitivity S / min R; " + NOMINAL_LABEL}
    if sigma_eta > 0:
        eff = epsilon_of(sigma_eta * scale, sigma_delta * scale if not math.isinf(sigma_delta) else math.inf, delta,
                         K, graph, n, mode)
        out.update(epsilon_conditional=eff.eps, label=out["label"].split("; ")[0] + "; " + eff.label)
    return out
