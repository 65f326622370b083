"""What a round's metrics row says about its aggregation: the weights, the noise statistic of the weighted sum, the
oracle's weights for comparison, and PFA's noise passthrough.

Engine-side facts only: these read the true noise multipliers and the noise the clients drew (a round's
`LocalRound.channel` and `noise_sq_norm`), which no non-privileged aggregator ever sees. Apart from the round loop
because they change nothing in the run: they are computed from a round's uploads after the server's step, for
the row and for the round-1 diagnostics of `FederatedRun.first_round` (noise tables, PFA's aggregate noise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.server.oracle import OracleAverage
from dpfl.algorithms.stages import ServerStep
from dpfl.engine import params as P
from dpfl.engine.local_training import replay_noise, trainable_names
from dpfl.experiment.run_records import LocalRound

if TYPE_CHECKING:
    from dpfl.experiment.federated_run import FederatedRun


def aggregation_diagnostics(algorithm: Algorithm, aggregator: ServerStep, state: Any, local: LocalRound,
                            seed: int) -> dict[str, Any]:
    """Aggregation weights (`state`: the server step's state after the round's update), and (for DP-SGD clients and
    weighted-sum aggregators) the noise statistic."""
    view = local.view
    channel = local.channel if aggregator.privileged else None  # only an oracle reads the engine's noise
    w = aggregator.aggregation_weights(state, view, channel, local.dim)
    if w is None:
        return {}
    w = w.cpu()  # diagnostics beside the view and channel, which are on the CPU (a no-op there)
    out: dict[str, Any] = {"weights": w.to(torch.float64).tolist()}
    linear = aggregator.linear_in_updates  # PFA: private updates are projected
    stats = noise_statistics(algorithm, w, local)  # empty unless the clients run DP-SGD without momentum
    if linear:
        out.update(stats)
    public = aggregator.public_mask(view, seed)
    if public is not None:  # PFA's group labels (spec §5): which weights reach Δ̄ through the projection
        out["public"] = public.tolist()
    if stats:
        out.update(oracle_comparison(algorithm, w, local, stats["noise_stat_analytic"] if linear else None))
    return out


def oracle_comparison(algorithm: Algorithm, w: torch.Tensor, local: LocalRound, stat: float | None) -> dict[str, Any]:
    """Spec heterogeneous_dp §5 `weights`: the oracle's weights w* (∝ 1/σ_i², the smallest noise statistic a
    weighted mean of the round's uploads reaches), ||w − w*||₁ and, for weighted-sum aggregators,
    noise_stat(w) / noise_stat(w*) ≥ 1 (analytic). Engine-side: w* needs the true noise multipliers. Empty when
    a participant adds no noise (w* would give it all the weight)."""
    if not bool((local.channel.update_noise_variance(local.view, local.dim) > 0).all()):
        return {}
    star = OracleAverage().weights(local.view, local.channel, local.dim).to(torch.float64)
    out: dict[str, Any] = {"oracle_weights": star.tolist(),
                           "weights_l1_to_oracle": float((w.to(torch.float64) - star).abs().sum())}
    if stat is not None:
        out["noise_stat_ratio_to_oracle"] = stat / noise_statistics(algorithm, star, local)["noise_stat_analytic"]
    return out


def noise_passthrough(run: FederatedRun, local: LocalRound, r: int) -> dict[str, float]:
    """PFA's `pfa_noise_passthrough` (spec heterogeneous_dp §5): ||N||^2 / (p eta^2), N the part of the
    aggregate that is the clients' DP noise (their noise pushed through the round's projection). The noise is
    redrawn from the clients' generators (`replay_noise`), so only where the engine trains the clients itself,
    with plain DP-SGD steps at one rate (no momentum, no step schedule, one phase) and uploads equal to the
    updates; empty otherwise.

    Reads the run's algorithm, update_hook, remote_clients and seed, and the round's client plans (`run._plans`:
    records, batch sizes, noise multipliers), from which the noise is replayed.
    """
    alg = run.algorithm
    program = alg.local
    if (not alg.aggregator.replays_noise or local.noise_sq_norm is None or not program.private
            or len(program.phases) != 1 or alg.personal is not None
            or run.update_hook is not None or run.remote_clients is not None
            or not isinstance(alg.upload, FullUpdate)):
        return {}
    spec = program.spec_at(r)
    if spec.momentum != 0 or spec.sampling not in ("poisson", "fixed") or spec.adaptive_clipping is not None:
        return {}  # adaptive clipping: the noise's scale z_Delta,k C_k changed every step; the replay assumes z C
    plans = run._plans(program, local.view.clients.tolist(), r)
    if any(p.step_lrs is not None for p in plans):
        return {}
    like = {n: local.uploads[n] for n in trainable_names(spec, local.uploads)}  # as run_local flattens them
    sums = replay_noise(plans, P.num_parameters(like, leading=1), run.seed, r, run.device).to(torch.float64)
    # the noise in client i's update: -(eta / b_i) z_i C sum_t xi_t (Poisson: the nominal batch divides)
    scale = torch.tensor([-spec.lr * p.noise_multiplier * (spec.clip or 0.0) / p.batch_size for p in plans],
                         dtype=torch.float64, device=sums.device)
    flat = P.unflatten(sums * scale[:, None], like, leading=1)
    noise = {n: flat[n] if n in flat else torch.zeros_like(u, dtype=torch.float64)
             for n, u in local.uploads.items()}
    out = alg.aggregator.noise_passthrough(local.uploads, noise, local.view, run.seed, r)
    assert out is not None, "a step that replays noise returns its passthrough"
    sq = sum(float(t.pow(2).sum()) for t in out.values())
    return {"pfa_noise_passthrough": sq / (local.dim * spec.lr * spec.lr)}


def noise_statistics(algorithm: Algorithm, weights: torch.Tensor, local: LocalRound) -> dict[str, float]:
    """noise_stat = sum_i w_i^2 sigma_i^2 / (p eta^2) of a weighted sum of the round's updates.

    Spec heterogeneous_dp §5: `_analytic` with sigma_i^2 = T_i eta^2 p C^2 z_i^2 / b_i^2, `_empirical`
    with sigma_i^2 = ||n_i||^2, n_i = -(eta / b_i) sum_t xi_t the noise actually injected (exact for
    plain SGD steps, i.e. without momentum). Diagnostics only: never shown to a non-privileged
    aggregator. Empty unless the clients run DP-SGD without momentum.
    """
    spec = algorithm.local.spec
    if (not algorithm.local.private or spec.momentum != 0 or algorithm.personal is not None
            or spec.adaptive_clipping is not None):  # adaptive clips: sigma_i is not T eta^2 p C^2 z_i^2 / b_i^2
        return {}
    w, view, lr = weights.to(torch.float64), local.view, spec.lr
    scale = local.dim * lr * lr  # not lr**2: a float power overflows with an exception, a product to inf
    out = {"noise_stat_analytic": float((w.pow(2) * local.channel.update_noise_variance(view, local.dim)).sum()
                                        / scale)}
    if local.noise_sq_norm is not None:  # unknown when remote clients keep their noise secret
        n_sq = (torch.tensor(local.noise_sq_norm, dtype=torch.float64)
                * (lr / view.batch_sizes.to(torch.float64)) ** 2)
        out["noise_stat_empirical"] = float((w.pow(2) * n_sq).sum() / scale)
    return out
