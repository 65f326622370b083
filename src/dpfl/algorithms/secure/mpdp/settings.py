"""Each method's round settings and the privacy statement they come with (spec bidirectional.md §8, §9): MP-DP's and
MP-DP-Naive's per-round guarantee is NOMINAL (never entered in dpfl's accountant, spec §8.6); MP-CDP's and TP-SMC's
Gaussian rounds are composed by dpfl's RDP accountant over the run's rounds (every client takes part in each), which
is their stated guarantee; none of them is entered in the run's per-client ledger (`in_ledger` false)."""

from __future__ import annotations

import math
from typing import Any

from dp_accounting import GaussianDpEvent, SelfComposedDpEvent

from dpfl.algorithms.secure.mpdp.round_settings import RoundSettings
from dpfl.algorithms.secure.mpdp.privacy import NOMINAL_LABEL, min_sigma_delta, solve_sigma_eta
from dpfl.privacy.accountant import epsilon as accountant_epsilon
from dpfl.privacy.analytic_gaussian import analytic_gaussian_sigma


def central_gaussian(epsilon: float, delta: float, rounds: int) -> tuple[float, dict[str, Any]]:
    """MP-CDP's and TP-SMC's one Gaussian per round: σ from the analytic calibration at the per-round (ε, δ), and
    the privacy fields of its RDP-accounted composition over `rounds`."""
    sigma = analytic_gaussian_sigma(epsilon, delta)
    total = accountant_epsilon(SelfComposedDpEvent(GaussianDpEvent(sigma), rounds), delta, "rdp")
    return sigma, {"per_round_epsilon": epsilon, "delta": delta, "sigma_cdp": sigma, "accountant": "rdp",
                   "in_ledger": False, "accounted_by": "dpfl's RDP accountant, for the event below: every client "
                   "takes part in every one of the run's rounds (not entered in a per-client ledger)",
                   "event": f"SelfComposed(Gaussian({sigma:.6g}), {rounds})", "epsilon_total": total}


def method_settings(method: str, p: Any, *, clients: int, lr: float, clip: float, rounds: int,
                    run_id: bytes) -> tuple[RoundSettings, dict[str, Any]]:
    """The round settings of `method` and its privacy block (per-round calibration) from the method's params `p`
    (`dpfl.algorithms.catalog.mpdp.MPDPParams`) and the clip norm B (sensitivity S = B, or 2B under replace)."""
    K, eps, delta = clients, p.epsilon, p.delta
    S = clip * (2.0 if p.adjacency == "replace" else 1.0)
    common = dict(method=method, lr=lr, S=S, clip=clip, clip_mode=p.clip_mode, graph=p.graph, n=p.n,
                  mask_scale=p.mask_scale, run_id=run_id, mask_corrections=p.mask_corrections,
                  noise_family=p.noise_family, delta=delta, dropout_policy=p.dropout_policy)
    if method == "mpdp":
        sigma_delta = p.sigma_delta_factor * min_sigma_delta(eps, delta, K, p.graph, p.n, p.mode)
        plan = solve_sigma_eta(eps, delta, K, sigma_delta, p.graph, p.n, p.mode)
        info = {"guarantee": "nominal", "label": plan.label, "theorem": plan.theorem, "per_round_epsilon": eps,
                "delta": delta, "sigma_eta": plan.sigma_eta, "sigma_delta": sigma_delta,
                "aggregate_std": plan.sigma_eta / math.sqrt(K), "stamps": list(plan.stamps),
                "accountant": None, "in_ledger": False}
        return RoundSettings(sigma_eta=plan.sigma_eta, sigma_delta=sigma_delta, **common), info
    if method == "mpdp_naive":
        sigma = analytic_gaussian_sigma(eps, delta)
        info = {"guarantee": "nominal", "label": f"{NOMINAL_LABEL}; each upload calibrated as an (ε, δ)-LDP Gaussian "
                "mechanism, but the server's recovered noise R∘η is not Gaussian (variance 1.5 S² σ²)",
                "per_round_epsilon": eps, "delta": delta, "sigma": sigma, "accountant": None, "in_ledger": False}
        return RoundSettings(sigma_naive=sigma, **common), info
    if method == "tp_smc":
        sigma, accounted = central_gaussian(eps, delta, rounds)
        h = p.tpsmc_honest or K
        threshold = p.tpsmc_threshold or K // 2 + 1
        info = {"guarantee": f"accounted, ASSUMING at least h = {h} of the {K} clients are honest (add their noise) "
                f"and fewer than {threshold} collude to decrypt; observer = the aggregator, which sees only the noisy "
                "sum (the models are broadcast in plaintext)",
                **accounted, "honest": h, "threshold": threshold,
                "client_noise_std": S * sigma / math.sqrt(h),
                "not_simulated": "zero-knowledge proofs of correct partial decryption; distributed key generation "
                                 "(a dealer makes the keys)",
                "key_bits": p.tpsmc_key_bits, "fraction_bits": p.tpsmc_fraction_bits, "packing": p.tpsmc_packing}
        return RoundSettings(sigma_cdp=sigma, **common), info
    if method == "mp_cdp":
        sigma, accounted = central_gaussian(eps, delta, rounds)
        info = {"guarantee": "accounted (trusted server: observer = anyone who sees the global models)", **accounted}
        return RoundSettings(sigma_cdp=sigma, **common), info
    return RoundSettings(**common), {"guarantee": "none (non-private reference)", "in_ledger": False}
