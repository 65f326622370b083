"""Comparator for benchmarks/central.py: user-level central DP-FedAvg rounds in Apple's pfl-research (`pfl`).

This script does NOT run in dpfl's environment: pfl 0.6.0 pins `dp-accounting<0.6` and dpfl needs `>=0.6`.
It imports neither dpfl nor anything from the repository; it reads everything it needs from an .npz file
that `benchmarks/central.py --pfl-python PY` writes, and prints exactly one JSON object on stdout.

Make its environment once, outside the repository (pin torch, or pip pulls a multi-GB CUDA build):

    python3 -m venv /tmp/pfl-venv
    /tmp/pfl-venv/bin/pip install torch==2.13.0 'pfl[pytorch]'
    /tmp/pfl-venv/bin/python -c "import torch, pfl; print(torch.__version__)"   # 2.13.0+cpu, not another torch

What one round is, in pfl's own simulation (the pieces a pfl user would put together for central DP-FedAvg):
- `FederatedDataset.from_slices` over the users of the .npz (a `PyTorchTensorDataset` per user), sampled with
  pfl's `minimize_reuse` user sampler, cohort = all users, so every round trains every user once;
- `PyTorchModel` around the same CNN (same parameter names and start values as dpfl's `cnn_pfa`), local
  optimizer `torch.optim.SGD`, central optimizer `torch.optim.SGD(lr=1)` (so the averaged update is added);
- `FederatedAveraging` with `NNTrainHyperParams(local_num_epochs=None, local_num_steps=STEPS,
  local_batch_size=BATCH, local_learning_rate=LR)`: pfl iterates a user's records in order (no shuffle) in
  batches of BATCH and stops after STEPS batches, within one pass (so STEPS * BATCH must not exceed a
  user's records by more than a batch; the script refuses otherwise rather than time fewer steps) (central.py
  shuffles each user's records once when it writes the file, so the batches are a random draw);
- `SimulatedBackend(postprocessors=[CentrallyAppliedPrivacyMechanism(GaussianMechanism(S, z))])`: each user's
  model difference clipped to L2 norm S, the clipped differences summed, N(0, (zS)^2) added to the sum, then
  FederatedAveraging divides by the total weight (one per user: the number of users) and applies it.

Timing: one `algorithm.run` of 1 + ROUNDS central iterations. The first iteration is the warm-up and is not
timed (pfl also evaluates every user before and after local training in iteration 0, since
0 % evaluation_frequency == 0; later iterations do not evaluate). A callback takes `time.perf_counter()` after
every central iteration; the time of round i is the difference to the previous stamp, so it covers pfl's
whole round: choosing the cohort, building user datasets, local training, model differences, clipping,
summing, noise, averaging and the central optimizer step. Process start-up, imports and data loading are
not timed.

    /tmp/pfl-venv/bin/python benchmarks/pfl_central.py --data round.npz --rounds 1 --steps 100 --batch 8
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import math
import os
import platform
import statistics
import sys
import time
from itertools import pairwise


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _tune_malloc() -> bool:
    """The glibc malloc settings dpfl applies process-wide (dpfl.engine.allocator), so all methods run alike."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, 32 << 20)) and bool(libc.mallopt(-2, 1 << 30))  # M_MMAP_THRESHOLD, M_TOP_PAD
    except (OSError, AttributeError):
        return False


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help=".npz written by benchmarks/central.py (x, y, param:<name>)")
    p.add_argument("--rounds", type=int, default=1, help="timed rounds after the untimed warm-up round (default 1)")
    p.add_argument("--steps", type=int, default=100, help="local SGD steps per user")
    p.add_argument("--batch", type=int, default=8, help="local batch size")
    p.add_argument("--lr", type=float, default=0.1, help="local learning rate")
    p.add_argument("--clip", type=float, default=1.0, help="clipping norm S of each user's model update")
    p.add_argument("--noise", type=float, default=1.0, help="noise multiplier z: N(0, (zS)^2) on the sum")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--malloc-tuning", type=int, choices=(0, 1), default=1,
                   help="apply dpfl's glibc malloc settings (1, as central.py does for dpfl and the loop) or not (0)")
    a = p.parse_args(argv)
    for name in ("rounds", "steps", "batch"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the one JSON object only
        result = run(args)
    print(json.dumps(result), file=real_stdout, flush=True)
    return 0


def run(args) -> dict:
    malloc = _tune_malloc() if args.malloc_tuning else False
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn

    import pfl
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.pytorch import PyTorchTensorDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel
    from pfl.privacy import CentrallyAppliedPrivacyMechanism, GaussianMechanism

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    blob = np.load(args.data)
    x = torch.from_numpy(blob["x"]).float()  # [K, n, C, H, W]
    y = torch.from_numpy(blob["y"]).long()  # [K, n]
    init = {k[len("param:"):]: torch.from_numpy(blob[k]).float() for k in blob.files if k.startswith("param:")}
    n_users, n_classes = x.shape[0], int(blob["n_classes"])
    if args.steps > math.ceil(x.shape[1] / args.batch):
        # pfl runs local_num_steps within one pass over the user's records: it would silently do fewer steps
        raise SystemExit(f"{args.steps} steps of batch {args.batch} need more than the {x.shape[1]} records per user")

    class CNN(nn.Sequential):
        """dpfl's cnn_pfa (same layers and parameter names); pfl needs `loss` and `metrics` on the module."""

        def __init__(self, c: int, hw: int, classes: int) -> None:
            side = ((hw + 2 * 3 - 8) // 2 + 1) - 1  # conv1 (8x8, stride 2, pad 3) then pool1 (2, stride 1)
            side = ((side - 4) // 2 + 1) - 1  # conv2 (4x4, stride 2) then pool2 (2, stride 1)
            super().__init__()
            self.add_module("conv1", nn.Conv2d(c, 16, 8, stride=2, padding=3))
            self.add_module("relu1", nn.ReLU())
            self.add_module("pool1", nn.MaxPool2d(2, stride=1))
            self.add_module("conv2", nn.Conv2d(16, 32, 4, stride=2))
            self.add_module("relu2", nn.ReLU())
            self.add_module("pool2", nn.MaxPool2d(2, stride=1))
            self.add_module("flatten", nn.Flatten(start_dim=1))
            self.add_module("fc1", nn.Linear(32 * side * side, 32))
            self.add_module("relu3", nn.ReLU())
            self.add_module("fc2", nn.Linear(32, classes))

        def loss(self, xb, yb):
            self.train()
            return F.cross_entropy(self(xb), yb)

        @torch.no_grad()
        def metrics(self, xb, yb):
            self.eval()
            loss = F.cross_entropy(self(xb), yb, reduction="sum").item()
            return {"loss": Weighted(loss, len(yb))}

    net = CNN(x.shape[2], x.shape[3], n_classes)
    missing = set(dict(net.named_parameters())) ^ set(init)
    if missing:
        raise SystemExit(f"parameter names differ between the .npz and the CNN: {sorted(missing)}")
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(init[name])

    users = {u: PyTorchTensorDataset((x[u], y[u]), user_id=str(u)) for u in range(n_users)}
    federated = FederatedDataset(lambda u: users[u], get_user_sampler("minimize_reuse", list(range(n_users))))
    model = PyTorchModel(net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    mechanism = CentrallyAppliedPrivacyMechanism(GaussianMechanism(clipping_bound=args.clip,
                                                                   relative_noise_stddev=args.noise))
    backend = SimulatedBackend(training_data=federated, val_data=federated, postprocessors=[mechanism])
    algorithm_params = NNAlgorithmParams(central_num_iterations=1 + args.rounds,
                                         evaluation_frequency=10**9,  # iteration 0 only (the warm-up)
                                         train_cohort_size=n_users, val_cohort_size=0)
    train_params = NNTrainHyperParams(local_num_epochs=None, local_learning_rate=args.lr,
                                      local_batch_size=args.batch, local_num_steps=args.steps)

    class Stamps(TrainingProcessCallback):
        def __init__(self) -> None:
            self.t: list[float] = []
            self.norms: list[float] = []
            self.users: list[float] = []

        def on_train_begin(self, *, model):
            self.t.append(time.perf_counter())
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            # Every round starts from the same model, as dpfl's and the loop's rounds do: the noise of a
            # round (zS/K per coordinate) would otherwise change what the next round's local training sees.
            model.set_parameters(start)
            self.t.append(time.perf_counter())
            for name, value in aggregate_metrics:
                s = str(name)
                v = getattr(value, "overall_value", value)
                if "norm before clipping" in s:
                    self.norms.append(float(v))
                elif "number of devices" in s:
                    self.users.append(float(v))
            return False, Metrics()

    start = model.get_parameters()
    stamps = Stamps()
    log(f"pfl {pfl.__version__ if hasattr(pfl, '__version__') else '?'}: {n_users} users x {args.steps} steps, "
        f"batch {args.batch}; 1 warm-up + {args.rounds} timed round(s)")
    final = FederatedAveraging().run(algorithm_params=algorithm_params, backend=backend, model=model,
                                     model_train_params=train_params, callbacks=[stamps],
                                     send_metrics_to_platform=False)
    gaps = [b - a for a, b in pairwise(stamps.t)]
    warm, timed = gaps[0], gaps[1:]
    params = final.get_parameters()
    finite = all(bool(torch.isfinite(params[n]).all()) for n in params)
    try:
        from importlib.metadata import version

        pfl_version = version("pfl")
    except Exception:  # noqa: BLE001
        pfl_version = None
    return {
        "pfl_seconds": statistics.median(timed),
        "round_seconds": timed,
        "warmup_seconds": warm,
        "users_per_round": stamps.users[-1] if stamps.users else None,
        "mean_update_norm_before_clipping": stamps.norms[-1] if stamps.norms else None,
        "update_norms_per_round": stamps.norms,
        "final_model_finite": finite,
        "final_model_norm": math.sqrt(sum(float(params[n].pow(2).sum()) for n in params)),
        "pfl_version": pfl_version,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "malloc_tuning": malloc,
        "python_version": platform.python_version(),
        "pid": os.getpid(),
    }


if __name__ == "__main__":
    sys.exit(main())
