"""Benchmark: one round of user-level central DP-FedAvg, dpfl's engine vs a per-client loop vs pfl-research.

Central DP-FedAvg (McMahan, Ramage, Talwar, Zhang 2018; dpfl's `dp_fedavg_central`): every selected user runs
plain (non-private) local SGD; the trusted server clips each user's model update to L2 norm S, sums the
clipped updates, adds N(0, (zS)^2) to the sum, divides by the expected number of users and adds the result
to the global model. The same round is done three ways, on the same data and start model:

1. dpfl       -- `dpfl.engine.local_training.run_local` trains all users at once (stacked parameters, one vmap
                 over users), then the upload stage and `CentralDPFedAvg.aggregate` (clip, sum, noise, average,
                 apply) -- exactly the calls of `FederatedRun.local_round` + `_one_round` for this algorithm,
                 without the run's bookkeeping (privacy ledger, metrics row, evaluation);
2. loop       -- plain PyTorch per user: a fresh model copy, `torch.optim.SGD` over a shuffled `DataLoader`,
                 then the update, its clipping and the sum; noise and the average once at the end;
3. pfl        -- Apple's pfl-research (`pfl` on PyPI) in its own virtualenv, run by `benchmarks/pfl_central.py`
                 as a subprocess (FederatedAveraging + SimulatedBackend + a central GaussianMechanism);
                 only with `--pfl-python`, since pfl cannot be installed next to dpfl (dp-accounting pin).

Each method is warmed up once, then run `--repeats` times interleaved (dpfl, loop, pfl, dpfl, ...); the median
of each is reported. This is a measurement, not a test: nothing here asserts a speed.

    python benchmarks/central.py                    # readable table (dpfl vs the loop)
    python benchmarks/central.py --json             # one JSON object on stdout, progress on stderr
    python benchmarks/central.py --pfl-python /tmp/pfl-venv/bin/python   # also pfl-research

pfl's environment, made once outside the repository (pin torch: an unpinned one pulls a multi-GB CUDA build):

    python3 -m venv /tmp/pfl-venv
    /tmp/pfl-venv/bin/pip install torch==2.13.0 'pfl[pytorch]'

See benchmarks/README.md ("central.py").
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import io
import json
import math
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench_common import loadavg, log

MODEL = "cnn_pfa"
INPUT_SHAPE = (1, 28, 28)
N_CLASSES = 10
LR = 0.1  # local SGD learning rate
CLIP = 1.0  # S: L2 bound of each user's model update
NOISE = 1.0  # z: the server adds N(0, (z S)^2) to the sum of clipped updates
SERVER_LR = 1.0
SEED = 0
WARMUP_STEPS = 5  # local steps per user in the (untimed) warm-up run of dpfl and the loop
NORM_RATIO_BAND = (0.8, 1.25)  # dpfl vs loop mean update norm: "agree in distribution"
NOISE_STD_TOL = 0.05  # relative tolerance of the measured server-noise std against z S
SAME_BATCHES_TOL = 1e-3  # relative L2 difference of client 0's update, dpfl vs the loop on dpfl's own batches
PFL_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pfl_central.py")
PFL_VENV_HELP = (
    "python3 -m venv /tmp/pfl-venv && /tmp/pfl-venv/bin/pip install torch==2.13.0 'pfl[pytorch]'"
)




# ----------------------------------------------------------------------------------------------- data


def load_client_data(n_clients: int, samples: int,
                     seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor], str, str]:
    """Per-user (x, y): a seeded random subset of Fashion-MNIST's training images, else seeded synthetic images.

    The rows are drawn by a random permutation, so each user's records are already in random order (pfl,
    which iterates a user's records in order, sees random batches too).
    """
    need = n_clients * samples
    reason = ""
    try:
        from dpfl.data import load_dataset

        ds = load_dataset("fashion_mnist")
        if tuple(ds.x_train.shape[1:]) != INPUT_SHAPE or ds.n_train < need:
            raise ValueError(f"fashion_mnist has {ds.n_train} x {tuple(ds.x_train.shape[1:])}, "
                             f"need {need} x {INPUT_SHAPE}")
        g = torch.Generator().manual_seed(seed)
        rows = torch.randperm(ds.n_train, generator=g)[:need]
        x, y = ds.x_train[rows].float().contiguous(), ds.y_train[rows].long().contiguous()
        source = "fashion_mnist"
    except Exception as exc:  # noqa: BLE001 -- any failure to load means: use synthetic data
        reason = f"{type(exc).__name__}: {exc}"
        g = torch.Generator().manual_seed(seed)
        prototypes = torch.rand(N_CLASSES, *INPUT_SHAPE, generator=g)
        y = torch.randint(0, N_CLASSES, (need,), generator=g)
        x = (prototypes[y] + 0.5 * torch.randn(need, *INPUT_SHAPE, generator=g)).float()
        source = "synthetic"
    xs = [x[i * samples : (i + 1) * samples].clone() for i in range(n_clients)]
    ys = [y[i * samples : (i + 1) * samples].clone() for i in range(n_clients)]
    return xs, ys, source, reason


# -------------------------------------------------------------------------------------------- methods


def _algorithm(steps: int, noise: float):
    """dpfl's central DP-FedAvg: plain local SGD (shuffled batches), server clipping S and noise z."""
    from dpfl.algorithms.algorithm import central_dp_fedavg
    from dpfl.algorithms.client.program import sgd
    from dpfl.algorithms.selection import Selection

    return central_dp_fedavg(sgd(LR, steps=steps), CLIP, noise, Selection(kind="all"), server_lr=SERVER_LR)


def run_dpfl(model: nn.Module, data, n_records: list[int], steps: int, batch: int, noise: float = NOISE):
    """One central DP-FedAvg round through dpfl's engine.

    Returns (seconds, (new global params, stacked per-user updates [K, ...] before clipping)).
    The calls are those of `FederatedRun.local_round` and `_one_round` for `dp_fedavg_central` with all users
    selected: plans from the local program, `run_local`, updates = end - start, the upload stage (full update),
    the server's view, and `CentralDPFedAvg.aggregate` (clip each update to S, sum, + N(0, (zS)^2), / expected
    users, apply). The algorithm object is built outside the timed interval.
    """
    from dpfl.algorithms.server.view import ServerView
    from dpfl.engine import params as P
    from dpfl.engine.local_training import run_local

    alg = _algorithm(steps, noise)
    k = len(n_records)
    t0 = time.perf_counter()
    w = P.model_params(model)
    selected = alg.selection.select(np.arange(k), SEED, 0)
    expected = alg.selection.expected_count(k)
    plans = [alg.local.plan(int(i), n_records[i], batch, 0.0, 0) for i in selected]
    res = run_local(model, alg.local.spec, plans, data, w, seed=SEED, round_=0)
    deltas = P.sub(res.params, P.broadcast(w, len(selected)))
    uploads = alg.upload.apply(deltas, [int(i) for i in selected], SEED, 0)
    view = ServerView.simple([n_records[i] for i in selected], expected_clients=expected)
    new_w = alg.aggregator.aggregate(w, uploads, view, SEED, 0)
    return time.perf_counter() - t0, (new_w, deltas)


def _take_steps(loader: DataLoader, steps: int):
    """`steps` batches from `loader`, restarting it whenever it is exhausted."""
    taken = 0
    while taken < steps:
        for batch in loader:
            yield batch
            taken += 1
            if taken == steps:
                return


def _flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def run_loop(model: nn.Module, xs, ys, steps: int, batch: int, noise: float = NOISE, batches=None):
    """Per-user plain PyTorch loop, then the server's clipping, sum, noise and average.

    Returns (seconds, (new global params, [K, D] per-user updates before clipping)). `batches`, if given, is a
    list (one per user) of index tensors to use instead of a shuffled DataLoader (the same-batches check).
    """
    names = [n for n, _ in model.named_parameters()]
    t0 = time.perf_counter()
    start = _flat(model.parameters())
    total = torch.zeros_like(start)
    updates = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        local = copy.deepcopy(model)
        local.train()
        opt = torch.optim.SGD(local.parameters(), lr=LR)
        if batches is None:
            loader = DataLoader(
                TensorDataset(x, y), batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(SEED + i)
            )
            stream = _take_steps(loader, steps)
        else:
            stream = ((x[ix], y[ix]) for ix in batches[i])
        for xb, yb in stream:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(local(xb), yb).backward()
            opt.step()
        delta = _flat(local.parameters()) - start
        updates.append(delta)
        total += delta * min(1.0, CLIP / (float(delta.norm()) + 1e-12))
    g = torch.Generator().manual_seed(SEED)
    total += noise * CLIP * torch.randn(total.shape[0], generator=g)
    new = start + SERVER_LR * total / len(xs)
    out, offset = {}, 0
    for n, p in zip(names, model.parameters(), strict=True):
        out[n] = new[offset : offset + p.numel()].reshape(p.shape)
        offset += p.numel()
    return time.perf_counter() - t0, (out, torch.stack(updates))


def write_pfl_data(path: str, model: nn.Module, xs, ys) -> None:
    """The users' data and the start model for benchmarks/pfl_central.py (pfl's venv cannot import dpfl)."""
    params = {f"param:{n}": p.detach().numpy() for n, p in model.named_parameters()}
    np.savez(path, x=torch.stack(xs).numpy(), y=torch.stack(ys).numpy(), n_classes=np.array(N_CLASSES), **params)


def run_pfl(python: str, data_path: str, steps: int, batch: int, rounds: int, threads: int | None, malloc: bool,
            noise: float = NOISE) -> tuple[float, dict]:
    """One subprocess of benchmarks/pfl_central.py: an untimed warm-up round, then `rounds` timed rounds."""
    cmd = [python, PFL_SCRIPT, "--data", data_path, "--rounds", str(rounds), "--steps", str(steps), "--batch",
           str(batch), "--lr", str(LR), "--clip", str(CLIP), "--noise", str(noise), "--seed", str(SEED),
           "--malloc-tuning", "1" if malloc else "0"]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"pfl_central.py printed no JSON object ({exc}):\n{proc.stdout[-2000:]}") from exc
    return float(out["pfl_seconds"]), out


# --------------------------------------------------------------------------------------------- sanity


def _loss(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        out = torch.func.functional_call(model.eval(), params, (x,))
        model.train()
        return float(F.cross_entropy(out, y))


def _unflat(model: nn.Module, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    out, offset = {}, 0
    for n, p in model.named_parameters():
        out[n] = flat[offset : offset + p.numel()].reshape(p.shape)
        offset += p.numel()
    return out


def _noise_std(start: torch.Tensor, new: torch.Tensor, updates: torch.Tensor, k: int) -> float:
    """The server noise actually added: (new - start) * K / server_lr - sum of clipped updates, its std."""
    factor = (CLIP / (updates.norm(dim=1) + 1e-12)).clamp(max=1.0)
    clipped_sum = (updates * factor[:, None]).sum(0)
    return float(((new - start) * k / SERVER_LR - clipped_sum).std())


def sanity(model, data, xs, ys, n_records, steps, batch, dpfl_out, loop_out, pfl_outs) -> dict:
    """Finite models; dpfl and the loop updates agree in distribution; the same batches give the same update."""
    from dpfl.engine import params as P
    from dpfl.engine.sampling import BatchStream
    from dpfl.seeding import Purpose, torch_generator

    k = len(xs)
    start = _flat(model.parameters())
    dpfl_new, dpfl_deltas = dpfl_out
    loop_new, loop_updates = loop_out
    dpfl_updates = P.flatten(dpfl_deltas)
    dpfl_norms, loop_norms = dpfl_updates.norm(dim=1), loop_updates.norm(dim=1)
    out: dict = {
        "dpfl_finite": bool(all(torch.isfinite(t).all() for t in dpfl_new.values())),
        "loop_finite": bool(all(torch.isfinite(t).all() for t in loop_new.values())),
        "pfl_finite": None if not pfl_outs else all(o["final_model_finite"] for o in pfl_outs),
        # per-user L2 norms of the local updates (before clipping): same distribution for dpfl and the loop
        "dpfl_update_norm_mean": float(dpfl_norms.mean()),
        "dpfl_update_norm_std": float(dpfl_norms.std()),
        "loop_update_norm_mean": float(loop_norms.mean()),
        "loop_update_norm_std": float(loop_norms.std()),
        "pfl_update_norm_mean": None if not pfl_outs else pfl_outs[-1].get("mean_update_norm_before_clipping"),
        "clipped_fraction_dpfl": float((dpfl_norms > CLIP).float().mean()),
        "clipped_fraction_loop": float((loop_norms > CLIP).float().mean()),
        # the mean update before noise, dpfl vs the loop (different batch orders): should point the same way
        "mean_update_cosine_dpfl_loop": float(F.cosine_similarity(dpfl_updates.mean(0), loop_updates.mean(0), dim=0)),
        # the server noise actually added, against z S
        "expected_noise_std": NOISE * CLIP,
        "dpfl_noise_std": _noise_std(start, P.flatten({n: t.unsqueeze(0) for n, t in dpfl_new.items()})[0],
                                     dpfl_updates, k),
        "loop_noise_std": _noise_std(start, _flat(loop_new.values()), loop_updates, k),
    }
    out["update_norm_ratio_dpfl_loop"] = out["dpfl_update_norm_mean"] / out["loop_update_norm_mean"]
    # Client 0 in the plain loop on dpfl's own batches (its shuffle stream): the same SGD, so the same update.
    stream = BatchStream("shuffle", n_records[0], batch, torch_generator(SEED, Purpose.BATCH, 0, 0), steps)
    idx = [stream.next() for _ in range(steps)]
    _, (_, same) = run_loop(model, xs[:1], ys[:1], steps, batch, noise=0.0, batches=[idx])
    out["client0_same_batches_rel_diff"] = float((same[0] - dpfl_updates[0]).norm() / (dpfl_updates[0].norm() + 1e-12))
    # local training works: client 0's own model after its local steps has a lower loss on its data
    x0, y0 = xs[0], ys[0]
    out["client0_initial_loss"] = _loss(model, _unflat(model, start), x0, y0)
    out["client0_local_loss_dpfl"] = _loss(model, _unflat(model, start + dpfl_updates[0]), x0, y0)
    out["client0_local_loss_loop"] = _loss(model, _unflat(model, start + loop_updates[0]), x0, y0)
    lo, hi = NORM_RATIO_BAND
    out["ok"] = bool(
        out["dpfl_finite"]
        and out["loop_finite"]
        and out["pfl_finite"] is not False
        and lo <= out["update_norm_ratio_dpfl_loop"] <= hi
        and abs(out["dpfl_noise_std"] / out["expected_noise_std"] - 1) <= NOISE_STD_TOL
        and abs(out["loop_noise_std"] / out["expected_noise_std"] - 1) <= NOISE_STD_TOL
        and out["client0_same_batches_rel_diff"] <= SAME_BATCHES_TOL
        and out["client0_local_loss_dpfl"] < out["client0_initial_loss"]
        and out["client0_local_loss_loop"] < out["client0_initial_loss"]
    )
    return out


# ------------------------------------------------------------------------------------------ profiling


def profile_dpfl(model, data, n_records, steps, batch) -> None:
    """Print the top costs of one dpfl round (cProfile by own and cumulative time, torch.profiler by op)."""
    prof = cProfile.Profile()
    prof.enable()
    t, _ = run_dpfl(model, data, n_records, steps, batch)
    prof.disable()
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(20)
        log(f"== cProfile of one dpfl round ({t:.2f} s under the profiler), sorted by {key} ==\n" + s.getvalue())
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as tp:
        run_dpfl(model, data, n_records, steps, batch)
    log("== torch.profiler of one dpfl round (by self CPU time) ==")
    log(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


# ----------------------------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress goes to stderr)")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions per method, interleaved (default 3)")
    p.add_argument("--clients", type=int, default=24, help="users per round (all take part)")
    p.add_argument("--steps", type=int, default=100, help="local SGD steps per user")
    p.add_argument("--batch", type=int, default=8, help="local batch size")
    p.add_argument("--samples", type=int, default=1200, help="training records per user (>= steps x batch for pfl)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads(N) first, in this process and pfl's (default: torch's default)")
    p.add_argument("--pfl-python", default=None, metavar="PYTHON",
                   help=f"python of a venv with pfl installed (make it with: {PFL_VENV_HELP}); without it the pfl "
                        "fields are null")
    p.add_argument("--pfl-rounds", type=int, default=1,
                   help="timed pfl rounds per repeat (one subprocess per repeat, after its own warm-up round)")
    p.add_argument("--no-sanity", action="store_true", help="skip the checks")
    p.add_argument("--profile", action="store_true", help="also profile one dpfl round; report on stderr")
    a = p.parse_args(argv)
    for name in ("repeats", "clients", "steps", "batch", "samples", "threads", "pfl_rounds"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.pfl_python is not None and a.steps > math.ceil(a.samples / a.batch):
        p.error("with --pfl-python, --steps x --batch must fit in --samples (pfl's local steps stay within one epoch)")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    real_stdout = sys.stdout
    # Keep stdout clean for --json: anything a library prints goes to stderr.
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        result, code = _run(args)
    if result is None:
        return code
    if args.json:
        print(json.dumps(result, indent=2), file=real_stdout, flush=True)
    else:
        print_table(result)
    return code


def _check_pfl(python: str) -> tuple[str | None, str | None, str]:
    """(pfl version, torch version, error) of the pfl interpreter."""
    probe = ("import json, torch; from importlib.metadata import version; import pfl.model.pytorch; "
             "print(json.dumps([version('pfl'), torch.__version__]))")
    try:
        proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, None, f"{type(exc).__name__}: {exc}"
    if proc.returncode != 0:
        return None, None, proc.stderr.strip()[-1500:]
    pfl_v, torch_v = json.loads(proc.stdout.strip().splitlines()[-1])
    return pfl_v, torch_v, ""


def _run(args) -> tuple[dict | None, int]:
    try:
        from dpfl.engine.allocator import tune_malloc
        from dpfl.engine.pooled import PooledData
        from dpfl.models import build_model, count_parameters
    except ImportError as exc:
        log(f"error: cannot import dpfl ({exc}); run this with dpfl's environment (.venv/bin/python).")
        return None, 2
    pfl_version = pfl_torch = None
    if args.pfl_python is not None:
        pfl_version, pfl_torch, err = _check_pfl(args.pfl_python)
        if err:
            log(f"error: {args.pfl_python} cannot import pfl with torch:\n{err}\n"
                f"       make the environment with: {PFL_VENV_HELP}")
            return None, 1
        if pfl_torch != torch.__version__:
            log(f"warning: pfl's venv has torch {pfl_torch}, this process {torch.__version__}: "
                "the comparison is skewed")

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    # dpfl's malloc settings (every FederatedRun applies them): process-wide, so the loop gets them too, and
    # pfl_central.py applies the same settings in its process.
    malloc = tune_malloc()
    log(f"dpfl malloc settings: {'on' if malloc else 'off'}")
    n, steps, batch, samples = args.clients, args.steps, args.batch, args.samples
    log(f"loading data ({n} users x {samples} records) ...")
    xs, ys, source, why = load_client_data(n, samples, SEED)
    if why:
        log(f"note: Fashion-MNIST not used ({why}); using synthetic data")
    data = PooledData.from_clients(xs, ys)
    n_records = [len(x) for x in xs]
    model = build_model(MODEL, INPUT_SHAPE, N_CLASSES, seed=0)
    model.train()

    tmp = tempfile.TemporaryDirectory(prefix="dpfl-central-")
    pfl_path = os.path.join(tmp.name, "round.npz")
    if args.pfl_python is not None:
        write_pfl_data(pfl_path, model, xs, ys)

    def methods(steps_now: int) -> dict:
        return {
            "dpfl": lambda: run_dpfl(model, data, n_records, steps_now, batch),
            "loop": lambda: run_loop(model, xs, ys, steps_now, batch),
            "pfl": (lambda: run_pfl(args.pfl_python, pfl_path, steps_now, batch, args.pfl_rounds, args.threads, malloc))
            if args.pfl_python is not None else None,
        }

    times: dict[str, list[float]] = {k: [] for k in methods(steps)}
    finals: dict[str, object] = {}
    pfl_outs: list[dict] = []
    load_before = loadavg()
    wall0 = time.perf_counter()
    try:
        # Warm-up of dpfl and the loop: the full code path (all users) but only a few steps. pfl warms up inside
        # each of its subprocesses (one untimed round before the timed ones).
        warm_steps = min(steps, WARMUP_STEPS)
        for name, fn in methods(warm_steps).items():
            if fn is None or name == "pfl":
                continue
            torch.manual_seed(SEED)
            t, _ = fn()
            log(f"warm-up  {name:6s} {t:8.2f} s  ({warm_steps} steps)")
        for r in range(args.repeats):
            for name, fn in methods(steps).items():
                if fn is None:
                    continue
                torch.manual_seed(SEED)
                t, out = fn()
                times[name].append(t)
                if name == "pfl":
                    pfl_outs.append(out)
                else:
                    finals[name] = out
                log(f"repeat {r + 1}/{args.repeats} {name:6s} {t:8.2f} s  (load {(loadavg() or ['?'])[0]})")
    finally:
        tmp.cleanup()
    bench_wall = time.perf_counter() - wall0
    load_after = loadavg()

    med = {k: (statistics.median(v) if v else None) for k, v in times.items()}
    san = None
    if not args.no_sanity:
        san = sanity(model, data, xs, ys, n_records, steps, batch, finals["dpfl"], finals["loop"], pfl_outs)
        log("sanity: " + json.dumps(san))
        if not san["ok"]:
            log("warning: a sanity check failed (see 'sanity' above)")
    if args.profile:
        profile_dpfl(model, data, n_records, steps, batch)

    def ratio(a, b):
        return None if a is None or b is None or b == 0 else a / b

    result = {
        "dpfl_seconds": med["dpfl"],
        "loop_seconds": med["loop"],
        "pfl_seconds": med["pfl"],
        "speedup_vs_loop": ratio(med["loop"], med["dpfl"]),
        "speedup_vs_pfl": ratio(med["pfl"], med["dpfl"]),
        "pfl_vs_loop": ratio(med["loop"], med["pfl"]),
        "dpfl_client_steps_per_second": ratio(n * steps, med["dpfl"]),
        "loop_client_steps_per_second": ratio(n * steps, med["loop"]),
        "pfl_client_steps_per_second": ratio(n * steps, med["pfl"]),
        "raw_seconds": {
            "dpfl": times["dpfl"],
            "loop": times["loop"],
            "pfl": times["pfl"] if args.pfl_python is not None else None,
        },
        "pfl_round_seconds": [o["round_seconds"] for o in pfl_outs] if pfl_outs else None,
        "pfl_warmup_seconds": [o["warmup_seconds"] for o in pfl_outs] if pfl_outs else None,
        "dpfl_path": "run_local + FullUpdate + CentralDPFedAvg.aggregate (FederatedRun.local_round/_one_round calls, "
                     "no ledger/metrics/evaluation)",
        "repeats": args.repeats,
        "pfl_rounds_per_repeat": args.pfl_rounds if args.pfl_python is not None else None,
        "clients": n,
        "steps": steps,
        "batch_size": batch,
        "samples_per_client": samples,
        "local_sampling": "shuffle",
        "clip": CLIP,
        "noise_multiplier": NOISE,
        "lr": LR,
        "server_lr": SERVER_LR,
        "model": MODEL,
        "parameters": count_parameters(model),
        "data": source,
        "threads": torch.get_num_threads(),
        "threads_set_by_flag": args.threads is not None,
        "interop_threads": torch.get_num_interop_threads(),
        "cpu_count": os.cpu_count(),
        "malloc_tuning": malloc,
        "torch_version": torch.__version__,
        "pfl_version": pfl_version,
        "pfl_torch_version": pfl_torch,
        "pfl_python": args.pfl_python,
        "pfl_threads": pfl_outs[-1]["threads"] if pfl_outs else None,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "benchmark_wall_seconds": bench_wall,
        "warmup_steps": warm_steps,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "sanity": san,
    }
    return result, 0


def print_table(r: dict) -> None:
    def fmt(x, spec=".2f", unit=""):
        return "n/a" if x is None else f"{x:{spec}}{unit}"

    print(
        f"One central DP-FedAvg round: {r['clients']} users x {r['steps']} local SGD steps, batch {r['batch_size']} "
        f"({r['samples_per_client']} records each), {r['model']} ({r['parameters']:,} params), "
        f"update clip S={r['clip']}, server noise z={r['noise_multiplier']}, lr={r['lr']}"
    )
    print(
        f"data: {r['data']}; torch {r['torch_version']}, pfl {r['pfl_version'] or 'not run'}, "
        f"{r['threads']} threads; median of {r['repeats']} interleaved repeats"
    )
    if r["loadavg_before"] is not None:
        print(
            f"load average before/after: {r['loadavg_before'][0]:.2f} / {r['loadavg_after'][0]:.2f} "
            f"on {r['cpu_count']} CPUs (other load distorts the timings)"
        )
    print()
    print(f"{'method':<28}{'median s':>10}{'client-steps/s':>16}{'dpfl speed-up':>15}   raw s")
    rows = [
        ("dpfl (vectorised engine)", "dpfl", None),
        ("plain per-user loop", "loop", "speedup_vs_loop"),
        ("pfl-research simulation", "pfl", "speedup_vs_pfl"),
    ]
    for label, key, sp in rows:
        raw = r["raw_seconds"][key]
        raw_s = "not run (--pfl-python)" if raw is None else " ".join(f"{t:.2f}" for t in raw)
        speed = "" if sp is None else fmt(r[sp], ".2f", "x")
        print(f"{label:<28}{fmt(r[key + '_seconds']):>10}{fmt(r[key + '_client_steps_per_second'], '.0f'):>16}"
              f"{speed:>15}   {raw_s}")
    print()
    print("speed-up = method's median time / dpfl's median time (>1: dpfl is faster)")
    s = r["sanity"]
    if s is not None:
        pfl_norm = s["pfl_update_norm_mean"]
        print(
            f"sanity: finite dpfl={s['dpfl_finite']} loop={s['loop_finite']} pfl={s['pfl_finite']}; "
            f"mean update norm dpfl {s['dpfl_update_norm_mean']:.3f} / loop {s['loop_update_norm_mean']:.3f} / "
            f"pfl {fmt(pfl_norm, '.3f')}; server noise std dpfl {s['dpfl_noise_std']:.3f} loop "
            f"{s['loop_noise_std']:.3f} (zS={s['expected_noise_std']}); client 0 on the same batches: rel. diff "
            f"{s['client0_same_batches_rel_diff']:.1e}  [{'ok' if s['ok'] else 'FAILED'}]"
        )


if __name__ == "__main__":
    sys.exit(main())
