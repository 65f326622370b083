"""Benchmark: one DP-SGD federated round, dpfl's vectorised engine vs per-client loops.

The same round is done three ways on the same data and model:

1. dpfl      -- `dpfl.engine.local_training.run_local`, all clients at once (the fast exact per-sample path of
                `dpfl.engine.per_sample` for the models it supports, else vmap over clients and samples);
2. opacus    -- a per-client loop, one `opacus.PrivacyEngine.make_private` per client (set-up time included),
                as the papers' reference code does;
3. nonprivate -- a per-client plain PyTorch SGD loop (no clipping, no noise): the floor a per-client loop
                can reach.
4. vectorised_nonprivate -- the right baseline for dpfl's cost of privacy: the same model code and the same
                batches of the same clients as dpfl (its own batch streams, all clients at once), trained
                without privacy: one `vmap` over clients of the model's forward on the padded client block,
                then one plain autograd backward of the sum of the clients' mean losses and `torch.optim.SGD`;
                no per-sample anything, no clipping, no noise. `dp_overhead_vs_vectorised_nonprivate` is dpfl's
                time over this one (fastDP reports 1.03-1.25x for its DP-SGD against such a baseline).
5. dpfl_nonprivate -- dpfl's own engine on the same batches without privacy (`run_local` with clip None: on the
                fast path one forward/backward with segmented GEMMs, no per-sample norms, clipping or noise);
                `dp_overhead_vs_dpfl_nonprivate` is what privacy costs inside the engine. Where it is faster than
                the plain-autograd baseline, that baseline is not the floor and this ratio is the stricter one.
With --with-vmap, also dpfl's generic engine (`run_local(engine="vmap")`: vmap(grad) per-sample gradients),
the engine before the fast path, as `dpfl_vmap`.

Each method is warmed up once, then run `--repeats` times interleaved (dpfl, baseline, opacus, plain, dpfl, ...);
the median of each is reported. This is a measurement, not a test: nothing here asserts a speed.
--device cuda runs every method on the GPU (the loops move each batch there; timings are bracketed by
torch.cuda.synchronize); --data synthetic needs no Fashion-MNIST; --loop-clients M times the two per-client
loops on M clients only and scales their seconds to the cohort (they are linear in clients; labelled so).

    python benchmarks/engine.py                 # readable table
    python benchmarks/engine.py --json          # one JSON object on stdout, progress on stderr
    python benchmarks/engine.py --skip-opacus   # when opacus is not installed (pip install opacus / '.[bench]')
    python benchmarks/engine.py --model lenet5 --clients 20 --steps 10 --batch 32   # FedCEO's LeNet-5
    python benchmarks/engine.py --device cuda --data synthetic --clients 2400 --steps 5 --loop-clients 24

See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import io
import json
import logging
import os
import platform
import pstats
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench_common import loadavg, log

MODEL = "cnn_pfa"  # default --model; the input shape is the model's reference shape (cnn_pfa: 1x28x28)
N_CLASSES = 10
LR = 0.1
CLIP = 1.0
NOISE = 1.0
SANITY_NOISE = 0.05  # "small noise" for the loss-decrease check of the dpfl engine
# the baseline alone on client 0 against a plain loop on the same batches, over SAME_BATCHES_STEPS steps: float32
# rounding only (a batched convolution sums in another order than one client's), measured 3e-8 to 7e-8 relative
SAME_BATCHES_RTOL = 1e-4
SAME_BATCHES_STEPS = 5
SEED = 0
WARMUP_STEPS = 5  # local steps per client in the (untimed) warm-up run of each method
DATA_SOURCES = ("auto", "fashion_mnist", "synthetic")
# Dense peaks (no sparsity) from NVIDIA's data sheets, GFLOP/s: (FP32 on the CUDA cores, BF16 on the tensor cores).
# Matched by substring of torch.cuda.get_device_name(); --peak-gflops overrides the FP32 one.
GPU_PEAKS = {
    "H200": (66_900.0, 989_400.0),
    "H100 NVL": (60_000.0, 835_000.0),
    "H100 PCIe": (51_200.0, 756_000.0),
    "H100": (66_900.0, 989_400.0),  # SXM (HBM3); after the more specific names
}


# ----------------------------------------------------------------------------------------------- data


def load_client_data(n_clients: int, samples: int, seed: int, shape: tuple[int, ...] = (1, 28, 28),
                     source: str = "auto") -> tuple[list[torch.Tensor], list[torch.Tensor], str, str]:
    """Per-client (x, y) on the CPU: Fashion-MNIST training images if available and of `shape`, else seeded
    synthetic images (a class prototype plus Gaussian noise). `source` "synthetic" never reads the dataset (a machine
    without it, e.g. the GPU check); "fashion_mnist" fails instead of falling back."""
    if source not in DATA_SOURCES:
        raise ValueError(f"data source must be one of {DATA_SOURCES}, got {source!r}")
    need = n_clients * samples
    reason = ""
    try:
        if source == "synthetic":
            raise LookupError("--data synthetic")
        from dpfl.data import load_dataset

        ds = load_dataset("fashion_mnist")
        if tuple(ds.x_train.shape[1:]) != tuple(shape) or ds.n_train < need:
            raise ValueError(f"fashion_mnist has {ds.n_train} x {tuple(ds.x_train.shape[1:])}, "
                             f"need {need} x {tuple(shape)}")
        g = torch.Generator().manual_seed(seed)
        rows = torch.randperm(ds.n_train, generator=g)[:need]
        x, y = ds.x_train[rows].contiguous(), ds.y_train[rows].contiguous()
        source = "fashion_mnist"
    except Exception as exc:  # noqa: BLE001 -- any failure to load means: use synthetic data
        if source == "fashion_mnist":
            raise
        reason = f"{type(exc).__name__}: {exc}"
        g = torch.Generator().manual_seed(seed)
        prototypes = torch.rand(N_CLASSES, *shape, generator=g)
        y = torch.randint(0, N_CLASSES, (need,), generator=g)
        x = (prototypes[y] + 0.5 * torch.randn(need, *shape, generator=g)).float()
        source = "synthetic"
    xs = [x[i * samples : (i + 1) * samples].clone() for i in range(n_clients)]
    ys = [y[i * samples : (i + 1) * samples].clone() for i in range(n_clients)]
    return xs, ys, source, reason


# -------------------------------------------------------------------------------------------- methods


def _loss_name(model: nn.Module) -> str:
    return getattr(model, "loss_kind", "cross_entropy")


def _mean_loss(model: nn.Module, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    from dpfl.engine.losses import per_sample_loss

    return per_sample_loss(_loss_name(model))(out, y).mean()


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def clock(device: torch.device) -> float:
    """time.perf_counter() once the device has finished its queued work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def run_dpfl(model: nn.Module, data, n_clients: int, steps: int, batch: int, noise: float = NOISE, clients=None,
             engine: str = "auto", sampling: str = "poisson", clip: float | None = CLIP):
    """One vectorised DP-SGD round for all clients; returns (seconds, stacked params [K, ...]).

    clip None (and noise 0) is dpfl's engine without privacy: plain SGD on the same batches (mean loss over each
    batch's drawn records), on the fast path one forward/backward with segmented GEMMs and no per-sample work."""
    from dpfl.engine import params as P
    from dpfl.engine.local_training import ClientPlan, LocalSpec, run_local

    device = _device_of(model)
    ids = range(n_clients) if clients is None else clients
    t0 = clock(device)
    spec = LocalSpec(lr=LR, loss=_loss_name(model), clip=clip, sampling=sampling)
    plans = [ClientPlan(client=i, batch_size=batch, steps=steps, noise_multiplier=noise) for i in ids]
    res = run_local(model, spec, plans, data, P.model_params(model), seed=SEED, round_=0, engine=engine)
    return clock(device) - t0, res.params


def draw_batches(data, clients: Sequence[int], steps: int, batch: int, sampling: str = "poisson",
                 seed: int = SEED, round_: int = 0) -> list[list[torch.Tensor]]:
    """The batches dpfl's engine draws for these clients: per step, one tensor of local record indices per client,
    from the same streams (`BatchStream` keyed by (seed, BATCH, round, client)), so a baseline trained on them sees
    exactly dpfl's batches."""
    from dpfl.engine.sampling import BatchStream
    from dpfl.seeding import Purpose, torch_generator

    streams = [BatchStream(sampling, data.size(c), batch, torch_generator(seed, Purpose.BATCH, round_, c), steps)
               for c in clients]
    return [[s.next() for s in streams] for _ in range(steps)]


@dataclass
class PaddedBatches:
    """A round's batches as padded client blocks: per step `rows` [K, W] (rows of the pooled data; padding repeats
    the client's first record) and `weights` [K, W] (1/n_k on client k's n_k drawn records, 0 on padding), or None for
    a step where no client drew a record. `records` drawn in all, `slots` the padded block's rows in all."""

    rows: list[torch.Tensor | None]
    weights: list[torch.Tensor | None]
    records: int
    slots: int


def pad_batches(data, clients: Sequence[int], batches: list[list[torch.Tensor]], device: torch.device,
                dtype: torch.dtype = torch.float32) -> PaddedBatches:
    """`batches` (per step, per client local indices) as padded blocks on `device`, with mean-loss weights."""
    k = len(clients)
    offsets = data.offsets[torch.as_tensor(list(clients), dtype=torch.int64)]
    out_rows: list[torch.Tensor | None] = []
    out_weights: list[torch.Tensor | None] = []
    records = slots = 0
    for idx in batches:
        counts = torch.tensor([len(i) for i in idx], dtype=torch.int64)
        width = int(counts.max()) if k else 0
        if width == 0:
            out_rows.append(None)
            out_weights.append(None)
            continue
        owner = torch.repeat_interleave(torch.arange(k), counts)
        rank = torch.arange(len(owner)) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        rows = offsets.unsqueeze(1).repeat(1, width)
        rows[owner, rank] = torch.cat(list(idx)) + offsets[owner]
        weights = torch.zeros(k, width, dtype=dtype)
        weights[owner, rank] = 1.0 / counts[owner].to(dtype)
        out_rows.append(rows.to(device))
        out_weights.append(weights.to(device))
        records += len(owner)
        slots += k * width
    return PaddedBatches(out_rows, out_weights, records, slots)


def run_vectorised_nonprivate(model: nn.Module, data, n_clients: int, steps: int, batch: int, clients=None,
                              sampling: str = "poisson", info: dict | None = None):
    """Non-private SGD for all clients at once on dpfl's batches; returns (seconds, stacked params [K, ...]).

    The baseline dpfl's DP-SGD cost is measured against: the same model code, the same clients and the same
    batches (`draw_batches`), vectorised over clients the plain way: every client's parameters stacked [K, ...] as
    leaf tensors, one `vmap` over clients of the model's forward on the padded block [K, W, ...], the sum over
    clients of each client's mean loss over its drawn records (padding weighted 0), one autograd backward (its
    gradient w.r.t. client k's parameters is client k's mean-loss gradient) and one `torch.optim.SGD` step. No
    per-sample gradients, clipping or noise. An empty batch leaves its client's parameters as they are. Drawing and
    padding the batches is timed (dpfl's time includes its drawing); `info` receives its share and the padding.
    """
    from torch.func import functional_call, vmap

    from dpfl.engine.losses import per_sample_loss

    device = _device_of(model)
    ids = list(range(n_clients) if clients is None else clients)
    loss_fn = per_sample_loss(_loss_name(model))
    t0 = clock(device)
    padded = pad_batches(data, ids, draw_batches(data, ids, steps, batch, sampling), device)
    t_drawn = clock(device)
    params = {n: p.detach().unsqueeze(0).repeat(len(ids), *([1] * p.dim())).requires_grad_()
              for n, p in model.named_parameters()}
    opt = torch.optim.SGD(list(params.values()), lr=LR)
    forward = vmap(lambda p, x: functional_call(model, p, (x,)), randomness="different")
    for rows, weights in zip(padded.rows, padded.weights, strict=True):
        if rows is None:
            continue
        x, y = data.x[rows], data.y[rows]
        out = forward(params, x)
        loss = (loss_fn(out.flatten(0, 1), y.flatten(0, 1)) * weights.flatten()).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    seconds = clock(device) - t0
    if info is not None:
        info.update(draw_seconds=t_drawn - t0, records=padded.records, padded_slots=padded.slots)
    return seconds, {n: p.detach() for n, p in params.items()}


def reference_loop_on_batches(model: nn.Module, data, client: int, batches: Sequence[torch.Tensor]
                              ) -> dict[str, torch.Tensor]:
    """One client's plain non-private SGD (its own model copy, `torch.optim.SGD`, mean loss) on given local batches:
    what the vectorised baseline must equal for that client (an empty batch is skipped)."""
    device = _device_of(model)
    local = copy.deepcopy(model).train()
    opt = torch.optim.SGD(local.parameters(), lr=LR)
    x_all, y_all = data.client(client)
    for idx in batches:
        if len(idx) == 0:
            continue
        idx = idx.to(device)
        opt.zero_grad(set_to_none=True)
        _mean_loss(model, local(x_all[idx]), y_all[idx]).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in local.named_parameters()}


def forward_flops(model: nn.Module, shape: tuple[int, ...]) -> int:
    """FLOPs of one sample's forward pass (torch's FLOP counter: 2 per multiply-add of convolutions and matmuls)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.zeros(1, *shape, device=_device_of(model)))
    return int(counter.get_total_flops())


def _take_steps(loader: DataLoader, steps: int):
    """`steps` batches from `loader`, restarting it whenever it is exhausted."""
    taken = 0
    while taken < steps:
        for batch in loader:
            yield batch
            taken += 1
            if taken == steps:
                return


def run_opacus(model: nn.Module, xs, ys, steps: int, batch: int):
    """Per-client Opacus loop (make_private included); returns (seconds, list of per-client state dicts).

    The data stay on the CPU (`xs`, `ys`) and each batch is moved to the model's device, as a usual loop does."""
    import opacus

    device = _device_of(model)
    finals = []
    t0 = clock(device)
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        local = copy.deepcopy(model)
        local.train()
        opt = torch.optim.SGD(local.parameters(), lr=LR)
        loader = DataLoader(TensorDataset(x, y), batch_size=batch, generator=torch.Generator().manual_seed(SEED + i))
        engine = opacus.PrivacyEngine()
        local, opt, loader = engine.make_private(
            module=local,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=NOISE,
            max_grad_norm=CLIP,
            poisson_sampling=True,
        )
        for xb, yb in _take_steps(loader, steps):
            opt.zero_grad(set_to_none=True)
            _mean_loss(model, local(xb.to(device)), yb.to(device)).backward()
            opt.step()
        finals.append({n: p.detach().clone() for n, p in local._module.named_parameters()})
    return clock(device) - t0, finals


def run_plain(model: nn.Module, xs, ys, steps: int, batch: int):
    """Per-client non-private SGD loop; returns (seconds, list of per-client state dicts). Data as in `run_opacus`."""
    device = _device_of(model)
    finals = []
    t0 = clock(device)
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        local = copy.deepcopy(model)
        local.train()
        opt = torch.optim.SGD(local.parameters(), lr=LR)
        loader = DataLoader(
            TensorDataset(x, y), batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(SEED + i)
        )
        for xb, yb in _take_steps(loader, steps):
            opt.zero_grad(set_to_none=True)
            _mean_loss(model, local(xb.to(device)), yb.to(device)).backward()
            opt.step()
        finals.append({n: p.detach().clone() for n, p in local.named_parameters()})
    return clock(device) - t0, finals


# --------------------------------------------------------------------------------------------- sanity


def _loss(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        out = torch.func.functional_call(model.eval(), params, (x,))
        model.train()
        return float(_mean_loss(model, out, y))


def _all_finite(param_sets) -> bool:
    return all(bool(torch.isfinite(t).all()) for ps in param_sets for t in ps.values())


def sanity(model, data, steps, batch, finals: dict, sampling: str = "poisson") -> dict:
    """Finiteness, client 0's loss before and after each method's round, two loss-decrease checks, and the
    baseline's check: client 0 alone through `run_vectorised_nonprivate` equals a plain loop on the same batches."""
    from dpfl.engine import params as P

    init = P.model_params(model)
    x0, y0 = data.client(0)

    def first(name):
        return None if finals.get(name) is None else {n: t[0] for n, t in finals[name].items()}

    def loss_or_none(params):
        return None if params is None else _loss(model, params, x0, y0)

    def finite_or_none(name, stacked=True):
        got = finals.get(name)
        return None if got is None else _all_finite([got] if stacked else got)

    plain0 = None if finals.get("nonprivate_loop") is None else finals["nonprivate_loop"][0]
    opacus0 = None if finals.get("opacus") is None else finals["opacus"][0]
    out = {
        "dpfl_finite": finite_or_none("dpfl"),
        "vectorised_nonprivate_finite": finite_or_none("vectorised_nonprivate"),
        "dpfl_nonprivate_finite": finite_or_none("dpfl_nonprivate"),
        "opacus_finite": finite_or_none("opacus", stacked=False),
        "nonprivate_finite": finite_or_none("nonprivate_loop", stacked=False),
        "client0_initial_loss": _loss(model, init, x0, y0),
        # after the benchmarked round (noise multiplier NOISE): informative only, noise may dominate
        "benchmark_noise_multiplier": NOISE,
        "client0_loss_dpfl": loss_or_none(first("dpfl")),
        "client0_loss_vectorised_nonprivate": loss_or_none(first("vectorised_nonprivate")),
        "client0_loss_opacus": loss_or_none(opacus0),
        "client0_loss_nonprivate": loss_or_none(plain0),
    }
    out["sanity_noise_multiplier"] = SANITY_NOISE
    out["client0_loss_dpfl_small_noise"] = None
    if finals.get("dpfl") is not None:
        # The loss-decrease check: dpfl on client 0 alone with small noise (cheap: one client).
        _, small = run_dpfl(model, data, 1, steps, batch, noise=SANITY_NOISE, clients=[0], sampling=sampling)
        out["client0_loss_dpfl_small_noise"] = _loss(model, {n: t[0] for n, t in small.items()}, x0, y0)
    # The baseline trains on dpfl's batches: client 0 through it alone equals client 0's plain loop on them (over a
    # few steps: rounding differences grow over many steps of SGD, to ~1e-3 after 100 at lr 0.1)
    few = min(steps, SAME_BATCHES_STEPS)
    _, alone = run_vectorised_nonprivate(model, data, 1, few, batch, clients=[0], sampling=sampling)
    ref = reference_loop_on_batches(model, data, 0, [b[0] for b in draw_batches(data, [0], few, batch, sampling)])
    diff = max(float((alone[n][0] - ref[n]).norm() / ref[n].norm().clamp(min=1e-12)) for n in ref)
    out["vectorised_nonprivate_vs_loop_on_same_batches_max_rel_diff"] = diff

    def below(a):
        return None if a is None else a < out["client0_initial_loss"]

    out["dpfl_small_noise_decreases_loss"] = below(out["client0_loss_dpfl_small_noise"])
    out["nonprivate_decreases_loss"] = below(out["client0_loss_nonprivate"])
    out["vectorised_nonprivate_decreases_loss"] = below(out["client0_loss_vectorised_nonprivate"])
    # The baseline's loss decrease is shown, not required: a few SGD steps on Poisson batches of a few records need
    # not lower the loss on all of client 0's records (seen at 3 steps of batch 4); that it trains as a plain loop
    # does is the same-batches check, and that plain SGD learns here is the loop's check.
    checks = [out["dpfl_finite"], out["vectorised_nonprivate_finite"], out["dpfl_nonprivate_finite"],
              out["opacus_finite"], out["nonprivate_finite"],
              out["dpfl_small_noise_decreases_loss"], out["nonprivate_decreases_loss"], diff <= SAME_BATCHES_RTOL]
    out["ok"] = all(c is not False for c in checks)  # None: that method was not run
    return out


# ------------------------------------------------------------------------------------------ profiling


def profile_dpfl(model, data, n_clients, steps, batch) -> None:
    """Print the top costs of one dpfl round (cProfile by own time, torch.profiler by op) to stderr.

    Run with one torch thread: with more, the engine runs groups of clients in worker threads, which neither
    profiler follows (they would show only the main thread's share). Shares are comparable, times are 1-thread times.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _profile_dpfl(model, data, n_clients, steps, batch)
    finally:
        torch.set_num_threads(threads)


def _profile_dpfl(model, data, n_clients, steps, batch) -> None:
    log("(profiles run with 1 torch thread, all client groups on the calling thread)")
    prof = cProfile.Profile()
    prof.enable()
    run_dpfl(model, data, n_clients, steps, batch)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
    log("== cProfile of one dpfl round (sorted by own time) ==\n" + s.getvalue())
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as tp:
        run_dpfl(model, data, n_clients, steps, batch)
    log("== torch.profiler of one dpfl round (by self CPU time) ==")
    log(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


# ----------------------------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress goes to stderr)")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions per method, interleaved (default 3)")
    p.add_argument("--clients", type=int, default=24)
    p.add_argument("--steps", type=int, default=100, help="local DP-SGD steps per client")
    p.add_argument("--batch", type=int, default=8, help="(expected) batch size; Poisson rate q = batch/samples")
    p.add_argument("--samples", type=int, default=1200, help="training samples per client")
    p.add_argument("--model", default=MODEL, help=f"registry model, at its reference input shape (default {MODEL})")
    p.add_argument("--sampling", choices=("poisson", "fixed"), default="poisson",
                   help="dpfl's and the vectorised baseline's batches: Poisson (default) or fixed-size (no padding "
                        "in the baseline's block); the per-client loops keep theirs")
    p.add_argument("--device", default="cpu",
                   help="cpu, cuda or cuda:N: where the model, the data and every method run (default cpu)")
    p.add_argument("--data", choices=DATA_SOURCES, default="auto",
                   help="auto: Fashion-MNIST when it loads and fits the model, else synthetic; synthetic: never read "
                        "the dataset; fashion_mnist: fail without it")
    p.add_argument("--loop-clients", type=int, default=None,
                   help="run the two per-client loops on the first M clients only and scale their seconds by "
                        "clients/M (a loop's time is linear in clients); default: all clients")
    p.add_argument("--with-vmap", action="store_true",
                   help="also time dpfl's generic engine (run_local engine='vmap', the engine before the fast path)")
    p.add_argument("--skip-baseline", action="store_true",
                   help="do not run the vectorised non-private baseline (its fields become null)")
    p.add_argument("--peak-gflops", type=float, default=None,
                   help="the machine's fp32 peak, GFLOP/s: report each method's fraction of it (on a known GPU the "
                        "data-sheet value is used when this is not given)")
    p.add_argument("--skip-opacus", action="store_true", help="do not run the Opacus loop (its fields become null)")
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads(N) first (default: leave torch's default)"
    )
    p.add_argument("--no-sanity", action="store_true", help="skip the finiteness / loss-decrease checks")
    p.add_argument("--profile", action="store_true", help="also profile one dpfl round; report on stderr")
    a = p.parse_args(argv)
    for name in ("repeats", "clients", "steps", "batch", "samples", "threads", "loop_clients"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.loop_clients is not None and a.loop_clients > a.clients:
        p.error(f"--loop-clients ({a.loop_clients}) must be at most --clients ({a.clients})")
    if a.sampling == "fixed" and a.batch > a.samples:
        p.error(f"--sampling fixed needs --batch ({a.batch}) <= --samples ({a.samples})")
    try:
        a.device = torch.device(a.device)
    except RuntimeError as exc:
        p.error(f"--device: {exc}")
    if a.device.type not in ("cpu", "cuda"):
        p.error(f"--device must be cpu, cuda or cuda:N, got {a.device}")
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


def gpu_peaks(device: torch.device) -> tuple[str | None, float | None, float | None]:
    """(name, FP32 peak, BF16 peak) in GFLOP/s of a CUDA device from `GPU_PEAKS` (None where unknown)."""
    if device.type != "cuda":
        return None, None, None
    name = torch.cuda.get_device_name(device)
    for key, (fp32, bf16) in GPU_PEAKS.items():
        if key in name:
            return name, fp32, bf16
    return name, None, None


def _run(args) -> tuple[dict | None, int]:
    try:
        import opacus

        opacus_version = opacus.__version__
    except ImportError:
        opacus_version = None
    if opacus_version is None and not args.skip_opacus:
        log(
            "error: Opacus is not installed, so the Opacus comparison cannot run.\n"
            "       Install it with `pip install opacus` (or `pip install -e '.[bench]'`),\n"
            "       or pass --skip-opacus to benchmark dpfl against the non-private loop only."
        )
        return None, 1
    run_opacus_loop = opacus_version is not None and not args.skip_opacus
    if opacus_version is None:
        log("note: Opacus is not installed; skipping the Opacus loop (opacus fields are null).")
    elif not run_opacus_loop:
        log("note: --skip-opacus given; skipping the Opacus loop (opacus fields are null).")

    try:
        from dpfl.engine.per_sample import compile_model
        from dpfl.engine.pooled import PooledData
        from dpfl.models import build_model, count_parameters, model_info
    except ImportError as exc:
        log(f"error: cannot import dpfl's engine/models ({exc}); the benchmark needs dpfl.models and dpfl.engine.")
        return None, 2

    device = args.device
    if device.type == "cuda" and not torch.cuda.is_available():
        log(f"error: --device {device} but torch {torch.__version__} sees no CUDA device.")
        return None, 2
    if run_opacus_loop:
        # Opacus warns about secure RNG, full backward hooks, etc.; none of it matters for timing.
        warnings.filterwarnings("ignore")
        logging.getLogger("opacus").setLevel(logging.ERROR)

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    # the malloc settings every dpfl run applies (dpfl.engine.allocator); process-wide, so all loops
    # get them. DPFL_MALLOC_TUNING=0 measures glibc's defaults instead.
    from dpfl.engine.allocator import tune_malloc

    log(f"dpfl malloc settings: {'on' if tune_malloc() else 'off'}")
    n, steps, batch, samples = args.clients, args.steps, args.batch, args.samples
    m = args.loop_clients or n
    try:
        shape = tuple(model_info(args.model).reference_shape)
    except ValueError as exc:
        log(f"error: {exc}")
        return None, 2
    log(f"loading data ({n} clients x {samples} samples of {shape}, --data {args.data}) ...")
    try:
        xs, ys, source, why = load_client_data(n, samples, SEED, shape, args.data)
    except Exception as exc:  # noqa: BLE001 -- only with --data fashion_mnist
        log(f"error: --data {args.data}: {type(exc).__name__}: {exc}")
        return None, 2
    if why and args.data == "auto":
        log(f"note: Fashion-MNIST not used ({why}); using synthetic data")
    pooled = PooledData.from_clients(xs, ys)
    # every method's data on the device once (a federated run builds its pooled data once); the per-client loops
    # keep theirs on the CPU and move each batch, as a usual training loop does
    data = PooledData(pooled.x.to(device), pooled.y.to(device), pooled.offsets, pooled.sizes)
    model = build_model(args.model, shape, N_CLASSES, seed=0)
    model.train()
    engine_path = "fast" if compile_model(model) is not None else "vmap"
    fwd_flops = forward_flops(model, shape)  # on the CPU: the count does not depend on the device
    model.to(device)
    # forward + backward (input and weight gradients, ~2x the forward) of every expected record
    workload_gflop = 3 * fwd_flops * n * steps * batch / 1e9
    gpu_name, fp32_peak, bf16_peak = gpu_peaks(device)
    peak = args.peak_gflops if args.peak_gflops is not None else fp32_peak
    baseline_info: dict = {}

    def loop(fn, steps_now: int):
        """A per-client loop on the first m clients, its seconds scaled to all n."""
        seconds, out = fn(model, xs[:m], ys[:m], steps_now, batch)
        return seconds * n / m, out

    def methods(steps_now: int) -> dict:
        return {
            "dpfl": lambda: run_dpfl(model, data, n, steps_now, batch, sampling=args.sampling),
            "vectorised_nonprivate": (None if args.skip_baseline else
                                      lambda: run_vectorised_nonprivate(model, data, n, steps_now, batch,
                                                                        sampling=args.sampling, info=baseline_info)),
            "dpfl_nonprivate": (None if args.skip_baseline else
                                lambda: run_dpfl(model, data, n, steps_now, batch, noise=0.0, clip=None,
                                                 sampling=args.sampling)),
            "dpfl_vmap": ((lambda: run_dpfl(model, data, n, steps_now, batch, engine="vmap", sampling=args.sampling))
                          if args.with_vmap else None),
            "opacus": (lambda: loop(run_opacus, steps_now)) if run_opacus_loop else None,
            "nonprivate_loop": lambda: loop(run_plain, steps_now),
        }

    times: dict[str, list[float]] = {k: [] for k in methods(steps)}
    peak_mib: dict[str, float | None] = {k: None for k in methods(steps)}
    finals: dict[str, object] = {}
    errors: dict[str, str] = {}
    load_before = loadavg()
    wall0 = time.perf_counter()
    # Warm-up: every method's full code path (all clients, Opacus set-up included) but only a few steps,
    # to pay one-off costs (lazy imports, first-call initialisation) outside the timed runs. A method that fails
    # here (e.g. one that does not run on this device yet) is reported in `errors` and left out.
    warm_steps = min(steps, WARMUP_STEPS)
    for name, fn in methods(warm_steps).items():
        if fn is None:
            continue
        torch.manual_seed(SEED)
        try:
            t, _ = fn()
        except Exception as exc:  # noqa: BLE001 -- reported, the other methods still run
            errors[name] = f"{type(exc).__name__}: {exc}"
            log(f"error: {name} failed in the warm-up and is left out:\n{traceback.format_exc()}")
            continue
        log(f"warm-up  {name:22s} {t:8.2f} s  ({warm_steps} steps)")
    for r in range(args.repeats):
        for name, fn in methods(steps).items():
            if fn is None or name in errors:
                continue
            torch.manual_seed(SEED)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t, out = fn()
            if device.type == "cuda":
                peak_mib[name] = max(peak_mib[name] or 0.0, torch.cuda.max_memory_allocated(device) / 2**20)
            times[name].append(t)
            finals[name] = out
            log(f"repeat {r + 1}/{args.repeats} {name:22s} {t:8.2f} s")
    bench_wall = time.perf_counter() - wall0
    load_after = loadavg()

    med = {k: (statistics.median(v) if v else None) for k, v in times.items()}
    san = None
    if not args.no_sanity:
        san = sanity(model, data, steps, batch, finals, args.sampling)
        log("sanity: " + json.dumps(san))
        if not san["ok"]:
            log("warning: a sanity check failed (see 'sanity' above)")
    if args.profile and "dpfl" not in errors:
        profile_dpfl(model, data, n, steps, batch)

    ratio = ratio_or_none
    result = {
        "dpfl_seconds": med["dpfl"],
        "vectorised_nonprivate_seconds": med["vectorised_nonprivate"],
        "opacus_seconds": med["opacus"],
        "nonprivate_loop_seconds": med["nonprivate_loop"],
        "dpfl_vmap_seconds": med["dpfl_vmap"],
        "dpfl_nonprivate_seconds": med["dpfl_nonprivate"],
        # dpfl's DP-SGD round over the same round without privacy, same batching (>1: what privacy costs)
        "dp_overhead_vs_vectorised_nonprivate": ratio(med["dpfl"], med["vectorised_nonprivate"]),
        # ... and over dpfl's own engine without privacy (clip None: no per-sample norms, clipping or noise)
        "dp_overhead_vs_dpfl_nonprivate": ratio(med["dpfl"], med["dpfl_nonprivate"]),
        "speedup_vs_opacus": ratio(med["opacus"], med["dpfl"]),
        "speedup_vs_nonprivate_loop": ratio(med["nonprivate_loop"], med["dpfl"]),
        "speedup_vs_dpfl_vmap": ratio(med["dpfl_vmap"], med["dpfl"]),
        "vectorised_nonprivate_speedup_vs_nonprivate_loop": ratio(med["nonprivate_loop"], med["vectorised_nonprivate"]),
        "dpfl_client_steps_per_second": ratio(n * steps, med["dpfl"]),
        "vectorised_nonprivate_client_steps_per_second": ratio(n * steps, med["vectorised_nonprivate"]),
        "opacus_client_steps_per_second": ratio(n * steps, med["opacus"]),
        "nonprivate_loop_client_steps_per_second": ratio(n * steps, med["nonprivate_loop"]),
        "workload_gflop": workload_gflop,
        "forward_mflop_per_sample": fwd_flops / 1e6,
        "dpfl_gflop_per_second": ratio(workload_gflop, med["dpfl"]),
        "vectorised_nonprivate_gflop_per_second": ratio(workload_gflop, med["vectorised_nonprivate"]),
        "opacus_gflop_per_second": ratio(workload_gflop, med["opacus"]),
        "nonprivate_loop_gflop_per_second": ratio(workload_gflop, med["nonprivate_loop"]),
        "dpfl_vmap_gflop_per_second": ratio(workload_gflop, med["dpfl_vmap"]),
        "dpfl_nonprivate_gflop_per_second": ratio(workload_gflop, med["dpfl_nonprivate"]),
        "peak_gflop_per_second": peak,
        "peak_source": ("--peak-gflops" if args.peak_gflops is not None
                        else "GPU_PEAKS (data sheet)" if fp32_peak is not None else None),
        "bf16_peak_gflop_per_second": bf16_peak,
        "dpfl_fraction_of_peak": ratio(ratio(workload_gflop, med["dpfl"]), peak),
        "dpfl_fraction_of_bf16_peak": ratio(ratio(workload_gflop, med["dpfl"]), bf16_peak),
        "vectorised_nonprivate_fraction_of_peak": ratio(ratio(workload_gflop, med["vectorised_nonprivate"]), peak),
        # the baseline's share of drawing and padding the batches, and how much of its block is padding
        "vectorised_nonprivate_draw_seconds": baseline_info.get("draw_seconds"),
        "vectorised_nonprivate_padding_fraction": (
            None if not baseline_info.get("padded_slots")
            else 1 - baseline_info["records"] / baseline_info["padded_slots"]),
        "engine_path": engine_path,
        "raw_seconds": {k: (v if v else None) for k, v in times.items()},
        "errors": errors or None,
        "repeats": args.repeats,
        "clients": n,
        "loop_clients": m,
        "loops_extrapolated": m < n,
        "steps": steps,
        "batch_size": batch,
        "samples_per_client": samples,
        "sampling": args.sampling,
        "sampling_rate": batch / samples,
        "noise_multiplier": NOISE,
        "clip": CLIP,
        "lr": LR,
        "model": args.model,
        "input_shape": list(shape),
        "parameters": count_parameters(model),
        "data": source,
        "device": str(device),
        "device_name": gpu_name if device.type == "cuda" else platform.processor() or platform.machine(),
        "cuda_version": torch.version.cuda if device.type == "cuda" else None,
        "cuda_peak_memory_mib": peak_mib if device.type == "cuda" else None,
        "threads": torch.get_num_threads(),
        "threads_set_by_flag": args.threads is not None,
        "interop_threads": torch.get_num_interop_threads(),
        "cpu_count": os.cpu_count(),
        "torch_version": torch.__version__,
        "opacus_version": opacus_version,
        "opacus_run": run_opacus_loop and "opacus" not in errors,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "benchmark_wall_seconds": bench_wall,
        "warmup_steps": warm_steps,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "sanity": san,
    }
    return result, 1 if errors else 0


def ratio_or_none(a, b):
    return None if a is None or b is None or b == 0 else a / b


def print_table(r: dict) -> None:
    def fmt(x, spec=".2f", unit=""):
        return "n/a" if x is None else f"{x:{spec}}{unit}"

    print(
        f"One DP-SGD round: {r['clients']} clients x {r['steps']} steps, batch {r['batch_size']} "
        f"({r['sampling']}, q={r['sampling_rate']:.4g}), {r['model']} ({r['parameters']:,} params), "
        f"z={r['noise_multiplier']}, C={r['clip']}, lr={r['lr']}"
    )
    print(
        f"workload {r['workload_gflop']:.1f} GFLOP (3 x {r['forward_mflop_per_sample']:.2f} MFLOP forward per expected "
        f"record); dpfl engine path: {r['engine_path']}"
    )
    print(
        f"data: {r['data']}; device {r['device']} ({r['device_name'] or 'unknown'}); torch {r['torch_version']}, "
        f"opacus {r['opacus_version'] or 'not installed'}, {r['threads']} threads; median of {r['repeats']} "
        f"interleaved repeats"
    )
    if r["loadavg_before"] is not None:
        print(
            f"load average before/after: {r['loadavg_before'][0]:.2f} / {r['loadavg_after'][0]:.2f} "
            f"on {r['cpu_count']} CPUs (other load distorts the timings)"
        )
    if r["loops_extrapolated"]:
        print(f"the per-client loops ran {r['loop_clients']} of {r['clients']} clients; their seconds are scaled "
              f"by {r['clients']}/{r['loop_clients']}")
    print()
    print(f"{'method':<34}{'median s':>10}{'client-steps/s':>16}{'GFLOP/s':>9}{'dpfl vs it':>12}   raw s")
    rows = [
        ("dpfl (vectorised DP-SGD)", "dpfl", None),
        ("vectorised non-private baseline", "vectorised_nonprivate", "dp_overhead_vs_vectorised_nonprivate"),
        ("dpfl engine without privacy", "dpfl_nonprivate", "dp_overhead_vs_dpfl_nonprivate"),
        ("Opacus per-client loop", "opacus", "speedup_vs_opacus"),
        ("non-private PyTorch loop", "nonprivate_loop", "speedup_vs_nonprivate_loop"),
    ]
    if r["raw_seconds"].get("dpfl_vmap") is not None:
        rows.append(("dpfl generic (vmap) path", "dpfl_vmap", "speedup_vs_dpfl_vmap"))
    for label, key, sp in rows:
        raw = r["raw_seconds"][key]
        raw_s = "skipped" if raw is None else " ".join(f"{t:.2f}" for t in raw)
        if sp is None:
            speed = ""
        elif key in ("vectorised_nonprivate", "dpfl_nonprivate"):
            speed = fmt(r[sp], ".2f", "x DP")
        else:
            speed = fmt(r[sp], ".2f", "x")
        steps_s = fmt(ratio_or_none(r["clients"] * r["steps"], r[key + "_seconds"]), ".0f")
        gflops = fmt(r[key + "_gflop_per_second"], ".1f")
        print(f"{label:<34}{fmt(r[key + '_seconds']):>10}{steps_s:>16}{gflops:>9}{speed:>12}   {raw_s}")
    if r.get("dpfl_fraction_of_peak") is not None:
        print(f"dpfl runs at {100 * r['dpfl_fraction_of_peak']:.2f}% of the {r['peak_gflop_per_second']:.0f} GFLOP/s "
              f"FP32 peak ({r['peak_source']})")
    if r.get("dpfl_fraction_of_bf16_peak") is not None:
        print(f"dpfl runs at {100 * r['dpfl_fraction_of_bf16_peak']:.3f}% of the "
              f"{r['bf16_peak_gflop_per_second']:.0f} GFLOP/s BF16 peak")
    if r.get("vectorised_nonprivate_padding_fraction") is not None:
        print(f"baseline: {100 * r['vectorised_nonprivate_padding_fraction']:.0f}% of its padded block is padding; "
              f"drawing the batches took {r['vectorised_nonprivate_draw_seconds']:.3f} s of its last run")
    print()
    print("dpfl vs it = method's median time / dpfl's (>1: dpfl is faster); for the two vectorised non-private "
          "rounds, dpfl's time / theirs (x DP: the overhead of privacy)")
    if r["errors"]:
        for name, err in r["errors"].items():
            print(f"FAILED {name}: {err}")
    s = r["sanity"]
    if s is not None:
        def num(x):
            return "n/a" if x is None else f"{x:.3f}"

        print(
            f"sanity: finite dpfl={s['dpfl_finite']} baseline={s['vectorised_nonprivate_finite']} "
            f"opacus={s['opacus_finite']} nonprivate={s['nonprivate_finite']}; client-0 loss "
            f"{s['client0_initial_loss']:.3f} -> dpfl(z={s['sanity_noise_multiplier']}) "
            f"{num(s['client0_loss_dpfl_small_noise'])}, baseline {num(s['client0_loss_vectorised_nonprivate'])}, "
            f"non-private loop {num(s['client0_loss_nonprivate'])}; baseline = loop on dpfl's batches to "
            f"{s['vectorised_nonprivate_vs_loop_on_same_batches_max_rel_diff']:.1e}  [{'ok' if s['ok'] else 'FAILED'}]"
        )


if __name__ == "__main__":
    sys.exit(main())
