"""Benchmark: the server steps (FedCEO's T-tSVD, Robust-HDP's PCP, PFA's projection) against a round's local training.

For P parameters and K clients (default sweep: P in 1e4, 1e5, 1e6; K in 10, 30, 100) it times, on the same
random client updates:

* ``t_tsvd``: FedCEO's smoothing of every tensor of an MLP with P parameters (float64, rfft: FedCEO's
  defaults), the current code (Gram-matrix SVT on tall/wide slices, no fold copies) and the previous route
  (fold, LAPACK SVD of every slice, unfold) as ``t_tsvd_old``;
* ``pcp_iter``: one iteration of Robust-HDP's PCP on the P x K update matrix (blocks of 200,000 rows, the
  defaults), as the mean over ``--pcp-iters`` iterations: the fused tall route (n x n Gram matrix, QR when
  it cannot resolve the kept values) and the plain dense-SVD loop (``pcp_iter_old``);
* ``pcp_solve``: whole PCP solves of the first row block (tol 1e-7) at each ``--pcp-growths`` rho (default 1.5,
  the spec's revised default; 1.02; 1.0, the authors' constant mu): iterations and seconds of each
  (``pcp_solve[rho] = {"iterations", "seconds", "rank"}``), where P K <= ``--pcp-solve-limit`` (a constant mu takes
  thousands of iterations: 5,459 at P = 1e5, K = 30 on planted data);
* ``pfa``: PFA's aggregation core for K/2 public and K/2 private clients, k = 1: the float64 group means, the
  top singular vectors of the public updates and the projection of the private mean; the current route (the
  m x m problem, chunked float64) and the previous one (float64 copies and a thin SVD of the K/2 x P matrix);
* ``round``: the local training the step follows: K clients x 10 DP-SGD steps at expected batch 16 through
  dpfl's engine on that MLP (a short round: real rounds are usually longer, so the shares below are upper
  bounds for rounds of that size).

    python benchmarks/server_steps.py                 # readable table
    python benchmarks/server_steps.py --json
    python benchmarks/server_steps.py --params 100000 --clients 30 --skip-old

Each step's share is its time / the round's time. No speed is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

import torch
from torch import nn

PARAMS = (10_000, 100_000, 1_000_000)
CLIENTS = (10, 30, 100)
HIDDEN = 100  # the MLP's hidden width: P = in * 100 + 100 + 100 * 10 + 10


def mlp(params: int) -> nn.Module:
    d_in = max(1, round((params - 1110) / HIDDEN))
    return nn.Sequential(nn.Linear(d_in, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))


def stacked_updates(model: nn.Module, clients: int, seed: int) -> dict[str, torch.Tensor]:
    """K noisy copies of a common update (rank-1 signal + per-client Gaussian noise of its own scale)."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-3, -1.3, clients)
    out = {}
    for name, p in model.named_parameters():
        common = 0.01 * torch.randn(p.shape, generator=g)
        noise = torch.randn((clients, *p.shape), generator=g) * scales.reshape(-1, *([1] * p.dim()))
        out[name] = common + noise
    return out


def timed(fn, repeats: int = 1) -> float:
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def time_t_tsvd(updates, old: bool) -> float:
    from dpfl.algorithms.server import t_tsvd

    def new():
        for x in updates.values():
            t_tsvd.smooth_stack_with_stats(x, 0.5, rfft=True, dtype=torch.float64)

    def previous():
        saved = t_tsvd._svt
        t_tsvd._svt = t_tsvd._svt_svd  # every slice by LAPACK's SVD
        try:
            for x in updates.values():
                t_tsvd.unfold(t_tsvd.t_tsvd(t_tsvd.fold(x), 0.5, rfft=True), tuple(x.shape[1:]))
        finally:
            t_tsvd._svt = saved

    return timed(previous if old else new, repeats=3)


def update_matrix(updates) -> torch.Tensor:
    """The P x K float64 matrix Robust-HDP runs PCP on (clients as columns)."""
    return torch.cat([u.reshape(u.shape[0], -1) for u in updates.values()], dim=1).to(torch.float64).T.contiguous()


def time_pcp_solves(updates, growths) -> dict:
    """Whole PCP solves (tol 1e-7, the spec's) of the first row block at each mu growth: iterations, seconds, rank."""
    from dpfl.algorithms.server import rpca

    M = update_matrix(updates)[:200_000]
    out = {}
    for rho in growths:
        t0 = time.perf_counter()
        _, _, info = rpca.pcp(M, mu_growth=rho)
        out[f"{rho:g}"] = {"iterations": info.iterations, "seconds": time.perf_counter() - t0, "rank": info.rank,
                           "converged": info.converged}
    return out


def time_pcp_iteration(updates, iters: int, old: bool) -> float:
    from dpfl.algorithms.server import rpca
    from dpfl.algorithms.server.robust_hdp import row_blocks

    M = update_matrix(updates)
    total = 0.0
    for start, stop in row_blocks(M.shape[0], 200_000, "all"):
        block = M[start:stop]
        lam = 1.0 / math.sqrt(max(block.shape))
        mu = block.numel() / (4.0 * float(block.abs().sum()))
        if old:
            t = timed(lambda block=block, lam=lam, mu=mu: rpca._pcp_dense(block, lam, mu, 0.0, iters, 1.0, math.inf))
        else:
            t = timed(lambda block=block, lam=lam, mu=mu: rpca.pcp(block, lam=lam, mu=mu, tol_abs=1e-300,
                                                                   mu_growth=1.0, max_iter=iters))
        total += t
    return total / iters


def time_pfa(updates, old: bool) -> float:
    from dpfl.algorithms.server import subspace
    from dpfl.algorithms.server.pfa import weighted_rows64

    flat = torch.cat([u.reshape(u.shape[0], -1) for u in updates.values()], dim=1)
    K = flat.shape[0]
    pub = torch.arange(K) < K // 2
    w = torch.zeros(2, K, dtype=torch.float64)
    w[0, pub] = 1.0 / int(pub.sum())
    w[1, ~pub] = 1.0 / int((~pub).sum())

    def new():
        means = weighted_rows64(flat, w)
        U = flat[pub].to(torch.float64)
        mu = means[0]
        V = subspace.top_right_singular_exact(U - mu, 1)
        return mu + V @ (V.T @ (means[1] - mu))

    def previous():
        X = flat.to(torch.float64)
        U = X[pub]
        mu = w[0, pub] @ U
        d_pri = w[1, ~pub] @ X[~pub]
        _, _, vh = torch.linalg.svd(U - mu, full_matrices=False)
        V = vh[:1].T
        return mu + V @ (V.T @ (d_pri - mu))

    return timed(previous if old else new, repeats=3)


def time_round(model: nn.Module, clients: int, seed: int) -> float:
    from dpfl.engine import params as P
    from dpfl.engine.local_training import ClientPlan, LocalSpec, run_local
    from dpfl.engine.pooled import PooledData

    d_in = model[0].in_features
    g = torch.Generator().manual_seed(seed)
    per = 160
    xs = [torch.randn(per, d_in, generator=g) for _ in range(clients)]
    ys = [torch.randint(0, 10, (per,), generator=g) for _ in range(clients)]
    data = PooledData.from_clients(xs, ys)
    spec = LocalSpec(lr=0.1, loss="cross_entropy", clip=1.0, sampling="poisson")
    plans = [ClientPlan(client=i, batch_size=16, steps=10, noise_multiplier=1.0) for i in range(clients)]
    start = P.model_params(model)
    run_local(model, spec, plans[:1], data, start, seed=seed, round_=0)  # warm-up
    return timed(lambda: run_local(model, spec, plans, data, start, seed=seed, round_=0), repeats=2)


def one(params: int, clients: int, args) -> dict:
    torch.manual_seed(args.seed)
    model = mlp(params)
    n_params = sum(p.numel() for p in model.parameters())
    updates = stacked_updates(model, clients, args.seed)
    row = {"params": n_params, "clients": clients}
    row["round"] = time_round(model, clients, args.seed)
    row["t_tsvd"] = time_t_tsvd(updates, old=False)
    row["pcp_iter"] = time_pcp_iteration(updates, args.pcp_iters, old=False)
    row["pfa"] = time_pfa(updates, old=False)
    n_params_k = n_params * clients
    row["pcp_solve"] = time_pcp_solves(updates, args.pcp_growths) if n_params_k <= args.pcp_solve_limit else None
    if not args.skip_old:
        row["t_tsvd_old"] = time_t_tsvd(updates, old=True)
        row["pcp_iter_old"] = (time_pcp_iteration(updates, args.pcp_iters, old=True)
                               if n_params * clients <= 3e7 else None)
        row["pfa_old"] = time_pfa(updates, old=True)
    for step in ("t_tsvd", "pcp_iter", "pfa"):
        row[f"{step}_share"] = row[step] / row["round"]
    return row


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=int, nargs="*", default=list(PARAMS))
    p.add_argument("--clients", type=int, nargs="*", default=list(CLIENTS))
    p.add_argument("--pcp-iters", type=int, default=10, help="PCP iterations timed per block (mean reported)")
    p.add_argument("--pcp-growths", type=float, nargs="*", default=[1.5, 1.02, 1.0],
                   help="mu growths of the whole PCP solves (1.0: constant mu)")
    p.add_argument("--pcp-solve-limit", type=float, default=3e6,
                   help="whole PCP solves only where P x K is at most this")
    p.add_argument("--skip-old", action="store_true", help="do not time the previous implementations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()
    rows = []
    for params in args.params:
        for clients in args.clients:
            print(f"P = {params:,}, K = {clients} ...", file=sys.stderr, flush=True)
            rows.append(one(params, clients, args))
    out = {"rows": rows, "threads": torch.get_num_threads(), "torch": torch.__version__,
           "machine": platform.machine(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0

    def fmt(x):
        return "n/a" if x is None else f"{x:.3f}"

    print(f"{'P':>10} {'K':>4} {'round s':>8} | {'T-tSVD s':>9} {'old':>7} {'share':>6} | {'PCP s/it':>9} {'old':>7} "
          f"{'share':>6} | {'PFA s':>7} {'old':>7} {'share':>6}")
    for r in rows:
        print(f"{r['params']:>10,} {r['clients']:>4} {r['round']:>8.3f} | "
              f"{r['t_tsvd']:>9.3f} {fmt(r.get('t_tsvd_old')):>7} "
              f"{r['t_tsvd_share']:>6.1%} | {r['pcp_iter']:>9.4f} {fmt(r.get('pcp_iter_old')):>7} "
              f"{r['pcp_iter_share']:>6.1%} | "
              f"{r['pfa']:>7.3f} {fmt(r.get('pfa_old')):>7} {r['pfa_share']:>6.1%}")
    print()
    print(f"{'P':>10} {'K':>4} | whole PCP solves (tol 1e-7): rho -> iterations, seconds, rank")
    for r in rows:
        solves = r.get("pcp_solve")
        text = "not run (P K above --pcp-solve-limit)" if solves is None else "; ".join(
            f"{rho}: {v['iterations']} it, {v['seconds']:.2f} s, rank {v['rank']}"
            + ("" if v["converged"] else " (not converged)") for rho, v in solves.items())
        print(f"{r['params']:>10,} {r['clients']:>4} | {text}")
    print(f"(threads {out['threads']}; load average {load_before[0]:.2f} -> {out['loadavg_after'][0]:.2f}; "
          "shares: step time / round time; PCP per iteration)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
