"""How much DP noise PFA's aggregate carries in the Robust-HDP settings, beside WeiAvg, FedAvg and the oracle.

PFA is not linear in the uploads, so the round-1 noise table (docs/papers/robust_hdp.md) leaves it out. Its aggregate is
(E_pub d_pub + E_pri (mu + V V^T (d_pri - mu))) / E with mu the mean of the public updates and V one direction per
tensor (spec heterogeneous_dp §4.2, `centered`, k = 1): up to the rank-1 term, the private clients' contribution is
replaced by the public mean. Its noise is then that of a weighted mean of the PUBLIC clients alone, with weights
eps_i / E + (E_pri / E) / |pub|, and sum_i w_i^2 sigma_i^2 / (p eta^2) gives its noise statistic (the
"public-part" column: an approximation, it drops the rank-1 term). The "measured" column checks the approximation:
the run's own PFA aggregator (its fitted split) is applied to pure-noise uploads drawn with each client's calibrated
per-coordinate variance, and ||aggregate||^2 / p is averaged over --draws draws. Pure noise is the worst case for
the subspace (V then follows the public noise); with signal in the uploads the rank-1 term differs.

Each client's sigma_i^2 / (p eta^2) = T_i C^2 z_i^2 / b_i^2 with T_i its planned DP-SGD steps per round (one
epoch), z_i the noise multiplier dpfl calibrates for the planned 200 rounds: the noise table's
analytic value, which the WeiAvg, FedAvg and oracle columns reproduce. Nothing is trained (calibration only).

With --runs OUT (a `dpfl reproduce robust-hdp --scale full` output), each finished seed-0 run's final parameter norm
(checkpoint.pt) is printed beside the norm the noise alone would give, sqrt(||w_0||^2 + R p eta^2 stat) after R
rounds: the DP noise adds a random walk to the weights, and the final norm shows how much of it each aggregator let
through. stat is the method's column above (PFA: the measured one; Robust-HDP: the oracle's, whose weights it
estimates).

With --round1 the run's own round 1 is trained (about a minute per distribution on one core) and the noise in its
real uploads is pushed through the projection fitted to them (`FederatedRun.noise_passthrough`, the runs' logged
`pfa_noise_passthrough`): the check that pure noise is a fair stand-in.

    python scripts/pfa_aggregate_noise.py [--dists Dist1,Dist5] [--draws 8] [--round1] [--runs OUT] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from dpfl.algorithms.server.oracle import NoiseChannel
from dpfl.algorithms.server.pfa import PFA
from dpfl.algorithms.server.view import ServerView
from dpfl.engine import params as P
from dpfl.experiment.build import build_run
from dpfl.experiment.federated_run import FederatedRun
from dpfl.experiment.run_directory import CHECKPOINT, SUMMARY, load_checkpoint
from dpfl.reproduce.robust_hdp import DISTS, grid

WALK_STAT = {"weiavg": "weiavg", "fedavg": "fedavg", "oracle": "oracle", "robust_hdp": "oracle", "pfa": "pfa_measured"}


@dataclass(frozen=True)
class NoiseShare:
    setting: str
    public: list[int]  # PFA's public clients (the run's fitted split)
    public_eps: list[float]
    weiavg: float
    fedavg: float
    oracle: float  # 1 / sigma_i^2 weights: the smallest any weighted mean can reach
    pfa_public_part: float  # the approximation (module docstring)
    pfa_measured: float  # the real aggregator on pure-noise uploads, mean over draws
    pfa_round1: float | None = None  # --round1: the run's own round-1 uploads, their noise passed through (one draw)
    norms: dict[str, dict[str, float]] = field(default_factory=dict)  # method -> {final, predicted} (--runs)


def noise_stat(weights: np.ndarray, variances: np.ndarray) -> float:
    """sum_i w_i^2 sigma_i^2 of a weighted mean of independent noises with per-coordinate variances sigma_i^2."""
    return float(np.sum(np.asarray(weights) ** 2 * np.asarray(variances)))


def public_part_weights(eps: np.ndarray, public: np.ndarray) -> np.ndarray:
    """PFA's weight on each client's noise when the private group contributes the public mean (module docstring):
    eps_i / E + (E_pri / E) / |pub| for public i, 0 for private i. They sum to 1."""
    eps, public = np.asarray(eps, dtype=np.float64), np.asarray(public, dtype=bool)
    if not public.any():
        raise ValueError("PFA needs at least one public client")
    total, private = eps.sum(), eps[~public].sum()
    return np.where(public, eps / total + private / total / public.sum(), 0.0)


def measured_pfa_noise(pfa: PFA, view: ServerView, variances: np.ndarray, shapes: dict[str, tuple[int, ...]],
                       draws: int, seed: int = 0) -> float:
    """Mean over `draws` of ||PFA(uploads)||^2 / p for uploads of pure Gaussian noise, client i's entries having
    variance variances[i]; `shapes` are the model's parameter shapes (PFA projects per tensor)."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.as_tensor(np.sqrt(variances), dtype=torch.float64)
    p = sum(int(np.prod(s)) for s in shapes.values())
    out = []
    for draw in range(draws):
        uploads = {name: torch.randn((len(view), *shape), generator=gen, dtype=torch.float64)
                   * scale.reshape(-1, *([1] * len(shape))) for name, shape in shapes.items()}
        agg = pfa.mean_update(uploads, view, seed, draw)
        out.append(sum(float(t.pow(2).sum()) for t in agg.values()) / p)
    return float(np.mean(out))


def client_variances(run: FederatedRun, view: ServerView) -> np.ndarray:
    """sigma_i^2 / (p eta^2) = T_i C^2 z_i^2 / b_i^2 of each client's update (the oracle's `update_noise_variance`,
    T_i its planned steps per round), for the clients of `view`."""
    spec = run.algorithm.local.spec
    if spec.momentum != 0:
        raise ValueError("the per-update noise variance is for plain DP-SGD steps (no momentum)")
    ids = view.clients.numpy()
    plan = run.planned_run("dpsgd")
    channel = NoiseChannel(torch.as_tensor(np.asarray(plan.local_steps)[ids], dtype=torch.int64),
                           torch.as_tensor(np.asarray(run.noise)[ids], dtype=torch.float64), spec.clip, spec.lr)
    return (channel.update_noise_variance(view, 1) / (spec.lr * spec.lr)).numpy()


def walk_norms(row: NoiseShare, run: FederatedRun, runs: Path) -> dict[str, dict[str, float]]:
    """{method: {"final", "predicted", "rounds"}} of the finished seed-0 runs under runs/runs/<setting>/<method>."""
    w = {name: t.double() for name, t in P.model_params(run.model).items()}  # the initial model
    w0, p, lr = float(P.global_norms(w, leading=0)) ** 2, P.num_parameters(w), run.algorithm.local.spec.lr
    out = {}
    for method, column in WALK_STAT.items():
        run_dir = runs / "runs" / row.setting / method / "seed0"
        if not (run_dir / SUMMARY).is_file():
            continue
        state = load_checkpoint(run_dir / CHECKPOINT)
        final = float(P.global_norms({name: t.double() for name, t in state["params"].items()}, leading=0))
        rounds = len(state["history"])
        out[method] = {"final": final, "predicted": math.sqrt(w0 + rounds * p * lr * lr * getattr(row, column)),
                       "rounds": rounds}
    return out


def noise_share(setting: str, draws: int, runs: Path | None = None, round1: bool = False) -> NoiseShare:
    """The row of `setting` (a Robust-HDP full-scale setting such as fmnist-Dist1), seed 0, PFA as the grid runs it;
    with `runs`, the final parameter norms of that output's finished runs beside the noise walk's; with `round1`,
    the noise PFA passes through on the run's own round 1 (trained here, about a minute)."""
    jobs = grid("full", seeds=1, settings_pattern=setting, methods=["pfa"]).jobs
    if len(jobs) != 1:
        raise SystemExit(f"{setting!r}: expected one Robust-HDP full-scale setting, matched {len(jobs)}")
    run = build_run(jobs[0].config)
    pfa = run.algorithm.aggregator
    if not isinstance(pfa, PFA) or pfa.subspace != "centered":
        raise SystemExit(f"{setting}: the approximation is for PFA's centred subspace, got {pfa!r}")
    eps = np.asarray(run.eps_reported, dtype=np.float64)
    k = len(eps)
    public = np.isin(np.arange(k), pfa.public_clients)
    plan = run.planned_run("dpsgd")
    view = ServerView(torch.arange(k), torch.as_tensor(plan.records, dtype=torch.int64),
                      torch.as_tensor(plan.batch_sizes, dtype=torch.int64), torch.as_tensor(eps),
                      torch.as_tensor([b.delta for b in plan.budgets], dtype=torch.float64), float(k))
    variances = client_variances(run, view)
    shapes = {name: tuple(t.shape) for name, t in run.model.named_parameters()}
    row = NoiseShare(
        setting, [int(c) for c in pfa.public_clients], [float(e) for e in eps[public]],
        weiavg=noise_stat(eps / eps.sum(), variances), fedavg=noise_stat(np.full(k, 1.0 / k), variances),
        oracle=noise_stat((1 / variances) / (1 / variances).sum(), variances),
        pfa_public_part=noise_stat(public_part_weights(eps, public), variances),
        pfa_measured=measured_pfa_noise(pfa, view, variances, shapes, draws, run.seed))
    if round1:
        _, local = run.first_round()
        row = replace(row, pfa_round1=run.noise_passthrough(local, 0)["pfa_noise_passthrough"])
    return row if runs is None else replace(row, norms=walk_norms(row, run, Path(runs)))


def markdown(rows: list[NoiseShare]) -> str:
    lines = ["| setting | PFA public clients (ε) | WeiAvg | FedAvg | oracle | PFA, public part | PFA, measured "
             "(pure noise) | PFA / WeiAvg |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        eps = ", ".join(f"{e:.2f}" for e in sorted(r.public_eps))
        measured = f"{r.pfa_measured:.3g}" + ("" if r.pfa_round1 is None else f" (round 1: {r.pfa_round1:.3g})")
        lines.append(f"| {r.setting} | {len(r.public)} ({eps}) | {r.weiavg:.3g} | {r.fedavg:.3g} | {r.oracle:.3g} | "
                     f"{r.pfa_public_part:.3g} | {measured} | {r.pfa_measured / r.weiavg:.2f} |")
    if any(len(r.public) == 1 for r in rows):
        lines += ["", "With one public client the centre is 0 and the projection keeps one direction of the private "
                  "mean: the private clients' signal is dropped with their noise, so a low noise value there is not "
                  "an advantage."]
    norms = [(r.setting, m, v) for r in rows for m, v in r.norms.items()]
    if norms:
        lines += ["", "| setting | method | rounds | final ‖w‖ | noise walk sqrt(‖w₀‖² + R p η² stat) |",
                  "|---|---|---|---|---|"]
        lines += [f"| {s} | {m} | {v['rounds']} | {v['final']:.1f} | {v['predicted']:.1f} |" for s, m, v in norms]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dists", default=",".join(DISTS), help="comma-separated budget distributions (Dist1-9)")
    parser.add_argument("--dataset", default="fmnist", help="the settings' dataset prefix (default fmnist)")
    parser.add_argument("--draws", type=int, default=8, help="pure-noise draws for the measured column")
    parser.add_argument("--round1", action="store_true", help="also train round 1 and pass its real noise through")
    parser.add_argument("--runs", type=Path, help="a `dpfl reproduce robust-hdp` OUT: compare its runs' final norms")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a Markdown table")
    args = parser.parse_args(argv)
    if args.draws < 1:
        parser.error("--draws must be >= 1")
    dists = [d.strip() for d in args.dists.split(",") if d.strip()]
    rows = [noise_share(f"{args.dataset}-{d}", args.draws, args.runs, args.round1) for d in dists]
    print(json.dumps([asdict(r) for r in rows], indent=1) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
