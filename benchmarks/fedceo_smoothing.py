"""FedCEO's smoothing cost against a round's local training, at LeNet-5 size (spec fedceo.md §5 / issue 5).

Times (1) T-tSVD over every LeNet-5 parameter tensor for K stacked client models, in the configurations
dpfl offers (float64 full FFT, float64 rfft = the default, float32 rfft), and (2) one round of the
paper's local training for the same K clients: DP-SGD at an expected batch of 64 over `--epochs` epochs
of `--samples` 3x32x32 images each, through dpfl's engine. Reports the smoothing's share of a smoothing
round. Local training time is measured for `--epochs` epochs (default 1) and, for the paper's E = 30,
extrapolated linearly (labelled): a round is E times the same epoch.

Synthetic CIFAR-sized data (seeded); the timings do not depend on the pixel values.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from dpfl.algorithms.server.t_tsvd import fold, t_tsvd, unfold
from dpfl.engine import params as P
from dpfl.engine.local_training import ClientPlan, LocalSpec, run_local
from dpfl.engine.pooled import PooledData
from dpfl.models import build_model


def smoothing_seconds(stacked: P.Params, thr: float, *, rfft: bool, dtype: torch.dtype, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for t in stacked.values():
            unfold(t_tsvd(fold(t), thr, rfft=rfft, dtype=dtype), tuple(t.shape[1:]))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def local_round_seconds(model, w: P.Params, k: int, samples: int, epochs: int, batch: int, repeats: int) -> float:
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(samples, 3, 32, 32, generator=g) for _ in range(k)]
    ys = [torch.randint(0, 10, (samples,), generator=g) for _ in range(k)]
    data = PooledData.from_clients(xs, ys)
    steps = epochs * -(-samples // batch)
    spec = LocalSpec(lr=0.1, clip=1.0, sampling="poisson", momentum=0.5)
    plans = [ClientPlan(i, batch, steps, 1.5) for i in range(k)]
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        run_local(model, spec, plans, data, w, seed=0, round_=r)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=10, help="K, clients per round (paper: 10)")
    p.add_argument("--samples", type=int, default=400, help="training images per client (CIFAR-10 / 100 clients, 80%%)")
    p.add_argument("--epochs", type=int, default=1, help="local epochs actually timed (paper: 30, extrapolated)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threshold", type=float, default=2.7028, help="thr_j (default: LeNet σ_g = 2.0, last smoothing)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    model = build_model("lenet5", (3, 32, 32), 10, seed=0)
    w = P.model_params(model)
    g = torch.Generator().manual_seed(1)
    stacked = {n: t.unsqueeze(0) + 0.05 * torch.randn(args.clients, *t.shape, generator=g) for n, t in w.items()}
    print(f"LeNet-5: {P.num_parameters(w):,} parameters, K = {args.clients}", file=sys.stderr)
    smooth = {
        "float64_fft": smoothing_seconds(stacked, args.threshold, rfft=False, dtype=torch.float64,
                                         repeats=args.repeats),
        "float64_rfft": smoothing_seconds(stacked, args.threshold, rfft=True, dtype=torch.float64,
                                          repeats=args.repeats),
        "float32_rfft": smoothing_seconds(stacked, args.threshold, rfft=True, dtype=torch.float32,
                                          repeats=args.repeats),
    }
    print(f"smoothing: {smooth}", file=sys.stderr)
    local = local_round_seconds(model, w, args.clients, args.samples, args.epochs, args.batch, args.repeats)
    per_epoch = local / args.epochs
    out = {
        "parameters": P.num_parameters(w), "clients": args.clients, "samples": args.samples, "batch": args.batch,
        "threads": torch.get_num_threads(), "smoothing_seconds": smooth,
        "local_round_seconds": {f"{args.epochs}_epochs_measured": local, "30_epochs_extrapolated": 30 * per_epoch},
        "smoothing_share": {
            name: {f"{args.epochs}_epochs": s / (s + local), "30_epochs_extrapolated": s / (s + 30 * per_epoch)}
            for name, s in smooth.items()},
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"local round ({args.epochs} epoch(s), measured): {local:.1f} s; "
              f"30 epochs (extrapolated): {30 * per_epoch:.1f} s")
        for name, s in smooth.items():
            share = out["smoothing_share"][name]
            print(f"{name:13s} smoothing {s:6.2f} s: {100 * share[f'{args.epochs}_epochs']:.1f}% of a round at "
                  f"{args.epochs} epoch(s), {100 * share['30_epochs_extrapolated']:.1f}% at 30 epochs (extrapolated)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
