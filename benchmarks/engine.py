"""Benchmark: one DP-SGD federated round, dpfl's vectorised engine vs per-client loops.

The same round is done three ways on the same data and model:

1. dpfl      -- `dpfl.engine.local_training.run_local`, all clients at once (the fast exact per-sample path of
                `dpfl.engine.per_sample` for the models it supports, else vmap over clients and samples);
2. opacus    -- a per-client loop, one `opacus.PrivacyEngine.make_private` per client (set-up time included),
                as the papers' reference code does;
3. nonprivate -- a per-client plain PyTorch SGD loop (no clipping, no noise): the floor a per-client loop
                can reach.
With --with-vmap, also dpfl's generic engine (`run_local(engine="vmap")`: vmap(grad) per-sample gradients),
the engine before the fast path, as `dpfl_vmap`.

Each method is warmed up once, then run `--repeats` times interleaved (dpfl, opacus, plain, dpfl, ...);
the median of each is reported. This is a measurement, not a test: nothing here asserts a speed.

    python benchmarks/engine.py                 # readable table
    python benchmarks/engine.py --json          # one JSON object on stdout, progress on stderr
    python benchmarks/engine.py --skip-opacus   # when opacus is not installed (pip install opacus / '.[bench]')
    python benchmarks/engine.py --model lenet5 --clients 20 --steps 10 --batch 32   # FedCEO's LeNet-5

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
import warnings

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
SEED = 0
WARMUP_STEPS = 5  # local steps per client in the (untimed) warm-up run of each method




# ----------------------------------------------------------------------------------------------- data


def load_client_data(n_clients: int, samples: int, seed: int, shape: tuple[int, ...] = (1, 28, 28)
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor], str, str]:
    """Per-client (x, y): Fashion-MNIST training images if available and of `shape`, else seeded synthetic images."""
    need = n_clients * samples
    reason = ""
    try:
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


def run_dpfl(model: nn.Module, data, n_clients: int, steps: int, batch: int, noise: float = NOISE, clients=None,
             engine: str = "auto"):
    """One vectorised DP-SGD round for all clients; returns (seconds, stacked params [K, ...])."""
    from dpfl.engine import params as P
    from dpfl.engine.local_training import ClientPlan, LocalSpec, run_local

    ids = range(n_clients) if clients is None else clients
    t0 = time.perf_counter()
    spec = LocalSpec(lr=LR, loss=_loss_name(model), clip=CLIP, sampling="poisson")
    plans = [ClientPlan(client=i, batch_size=batch, steps=steps, noise_multiplier=noise) for i in ids]
    res = run_local(model, spec, plans, data, P.model_params(model), seed=SEED, round_=0, engine=engine)
    return time.perf_counter() - t0, res.params


def forward_flops(model: nn.Module, shape: tuple[int, ...]) -> int:
    """FLOPs of one sample's forward pass (torch's FLOP counter: 2 per multiply-add of convolutions and matmuls)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.zeros(1, *shape))
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
    """Per-client Opacus loop (make_private included); returns (seconds, list of per-client state dicts)."""
    import opacus

    finals = []
    t0 = time.perf_counter()
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
            _mean_loss(model, local(xb), yb).backward()
            opt.step()
        finals.append({n: p.detach().clone() for n, p in local._module.named_parameters()})
    return time.perf_counter() - t0, finals


def run_plain(model: nn.Module, xs, ys, steps: int, batch: int):
    """Per-client non-private SGD loop; returns (seconds, list of per-client state dicts)."""
    finals = []
    t0 = time.perf_counter()
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        local = copy.deepcopy(model)
        local.train()
        opt = torch.optim.SGD(local.parameters(), lr=LR)
        loader = DataLoader(
            TensorDataset(x, y), batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(SEED + i)
        )
        for xb, yb in _take_steps(loader, steps):
            opt.zero_grad(set_to_none=True)
            _mean_loss(model, local(xb), yb).backward()
            opt.step()
        finals.append({n: p.detach().clone() for n, p in local.named_parameters()})
    return time.perf_counter() - t0, finals


# --------------------------------------------------------------------------------------------- sanity


def _loss(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        out = torch.func.functional_call(model.eval(), params, (x,))
        model.train()
        return float(_mean_loss(model, out, y))


def _all_finite(param_sets) -> bool:
    return all(bool(torch.isfinite(t).all()) for ps in param_sets for t in ps.values())


def sanity(model, data, xs, ys, steps, batch, dpfl_params, opacus_finals, plain_finals) -> dict:
    from dpfl.engine import params as P

    init = P.model_params(model)
    x0, y0 = xs[0], ys[0]
    first = {n: t[0] for n, t in dpfl_params.items()}
    out = {
        "dpfl_finite": _all_finite([dpfl_params]),
        "opacus_finite": None if opacus_finals is None else _all_finite(opacus_finals),
        "nonprivate_finite": _all_finite(plain_finals),
        "client0_initial_loss": _loss(model, init, x0, y0),
        # after the benchmarked round (noise multiplier NOISE): informative only, noise may dominate
        "benchmark_noise_multiplier": NOISE,
        "client0_loss_dpfl": _loss(model, first, x0, y0),
        "client0_loss_opacus": None if opacus_finals is None else _loss(model, opacus_finals[0], x0, y0),
        "client0_loss_nonprivate": _loss(model, plain_finals[0], x0, y0),
    }
    # The loss-decrease check: dpfl on client 0 alone with small noise (cheap: one client).
    _, small = run_dpfl(model, data, 1, steps, batch, noise=SANITY_NOISE, clients=[0])
    out["sanity_noise_multiplier"] = SANITY_NOISE
    out["client0_loss_dpfl_small_noise"] = _loss(model, {n: t[0] for n, t in small.items()}, x0, y0)
    out["dpfl_small_noise_decreases_loss"] = out["client0_loss_dpfl_small_noise"] < out["client0_initial_loss"]
    out["nonprivate_decreases_loss"] = out["client0_loss_nonprivate"] < out["client0_initial_loss"]
    out["ok"] = bool(
        out["dpfl_finite"]
        and out["opacus_finite"] is not False
        and out["nonprivate_finite"]
        and out["dpfl_small_noise_decreases_loss"]
        and out["nonprivate_decreases_loss"]
    )
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
    p.add_argument("--with-vmap", action="store_true",
                   help="also time dpfl's generic engine (run_local engine='vmap', the engine before the fast path)")
    p.add_argument("--peak-gflops", type=float, default=None,
                   help="the machine's fp32 peak, GFLOP/s: report dpfl's fraction of it")
    p.add_argument("--skip-opacus", action="store_true", help="do not run the Opacus loop (its fields become null)")
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads(N) first (default: leave torch's default)"
    )
    p.add_argument("--no-sanity", action="store_true", help="skip the finiteness / loss-decrease checks")
    p.add_argument("--profile", action="store_true", help="also profile one dpfl round; report on stderr")
    a = p.parse_args(argv)
    for name in ("repeats", "clients", "steps", "batch", "samples", "threads"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
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

    if run_opacus_loop:
        # Opacus warns about secure RNG, full backward hooks, etc.; none of it matters for timing.
        warnings.filterwarnings("ignore")
        logging.getLogger("opacus").setLevel(logging.ERROR)

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    # the malloc settings every dpfl run applies (dpfl.engine.allocator); process-wide, so all three loops
    # get them. DPFL_MALLOC_TUNING=0 measures glibc's defaults instead.
    from dpfl.engine.allocator import tune_malloc

    log(f"dpfl malloc settings: {'on' if tune_malloc() else 'off'}")
    n, steps, batch, samples = args.clients, args.steps, args.batch, args.samples
    try:
        shape = tuple(model_info(args.model).reference_shape)
    except ValueError as exc:
        log(f"error: {exc}")
        return None, 2
    log(f"loading data ({n} clients x {samples} samples of {shape}) ...")
    xs, ys, source, why = load_client_data(n, samples, SEED, shape)
    if why:
        log(f"note: Fashion-MNIST not used ({why}); using synthetic data")
    data = PooledData.from_clients(xs, ys)
    model = build_model(args.model, shape, N_CLASSES, seed=0)
    model.train()
    engine_path = "fast" if compile_model(model) is not None else "vmap"
    fwd_flops = forward_flops(model, shape)
    # forward + backward (input and weight gradients, ~2x the forward) of every expected record
    workload_gflop = 3 * fwd_flops * n * steps * batch / 1e9

    def methods(steps_now: int) -> dict:
        return {
            "dpfl": lambda: run_dpfl(model, data, n, steps_now, batch),
            "dpfl_vmap": ((lambda: run_dpfl(model, data, n, steps_now, batch, engine="vmap"))
                          if args.with_vmap else None),
            "opacus": (lambda: run_opacus(model, xs, ys, steps_now, batch)) if run_opacus_loop else None,
            "nonprivate_loop": lambda: run_plain(model, xs, ys, steps_now, batch),
        }

    times: dict[str, list[float]] = {k: [] for k in methods(steps)}
    finals: dict[str, object] = {}
    load_before = loadavg()
    wall0 = time.perf_counter()
    # Warm-up: every method's full code path (all clients, Opacus set-up included) but only a few steps,
    # to pay one-off costs (lazy imports, first-call initialisation) outside the timed runs.
    warm_steps = min(steps, WARMUP_STEPS)
    for name, fn in methods(warm_steps).items():
        if fn is None:
            continue
        torch.manual_seed(SEED)
        t, _ = fn()
        log(f"warm-up  {name:16s} {t:8.2f} s  ({warm_steps} steps)")
    for r in range(args.repeats):
        for name, fn in methods(steps).items():
            if fn is None:
                continue
            torch.manual_seed(SEED)
            t, out = fn()
            times[name].append(t)
            finals[name] = out
            log(f"repeat {r + 1}/{args.repeats} {name:16s} {t:8.2f} s")
    bench_wall = time.perf_counter() - wall0
    load_after = loadavg()

    med = {k: (statistics.median(v) if v else None) for k, v in times.items()}
    san = None
    if not args.no_sanity:
        san = sanity(model, data, xs, ys, steps, batch, finals["dpfl"], finals.get("opacus"), finals["nonprivate_loop"])
        log("sanity: " + json.dumps(san))
        if not san["ok"]:
            log("warning: a sanity check failed (see 'sanity' above)")
    if args.profile:
        profile_dpfl(model, data, n, steps, batch)

    def ratio(a, b):
        return None if a is None or b is None or b == 0 else a / b

    result = {
        "dpfl_seconds": med["dpfl"],
        "opacus_seconds": med["opacus"],
        "nonprivate_loop_seconds": med["nonprivate_loop"],
        "dpfl_vmap_seconds": med["dpfl_vmap"],
        "speedup_vs_opacus": ratio(med["opacus"], med["dpfl"]),
        "speedup_vs_nonprivate_loop": ratio(med["nonprivate_loop"], med["dpfl"]),
        "speedup_vs_dpfl_vmap": ratio(med["dpfl_vmap"], med["dpfl"]),
        "dpfl_client_steps_per_second": ratio(n * steps, med["dpfl"]),
        "opacus_client_steps_per_second": ratio(n * steps, med["opacus"]),
        "nonprivate_loop_client_steps_per_second": ratio(n * steps, med["nonprivate_loop"]),
        "workload_gflop": workload_gflop,
        "forward_mflop_per_sample": fwd_flops / 1e6,
        "dpfl_gflop_per_second": ratio(workload_gflop, med["dpfl"]),
        "opacus_gflop_per_second": ratio(workload_gflop, med["opacus"]),
        "nonprivate_loop_gflop_per_second": ratio(workload_gflop, med["nonprivate_loop"]),
        "dpfl_vmap_gflop_per_second": ratio(workload_gflop, med["dpfl_vmap"]),
        "peak_gflop_per_second": args.peak_gflops,
        "dpfl_fraction_of_peak": ratio(ratio(workload_gflop, med["dpfl"]), args.peak_gflops),
        "engine_path": engine_path,
        "raw_seconds": {
            "dpfl": times["dpfl"],
            "opacus": times["opacus"] if run_opacus_loop else None,
            "nonprivate_loop": times["nonprivate_loop"],
            "dpfl_vmap": times["dpfl_vmap"] if args.with_vmap else None,
        },
        "repeats": args.repeats,
        "clients": n,
        "steps": steps,
        "batch_size": batch,
        "samples_per_client": samples,
        "sampling_rate": batch / samples,
        "noise_multiplier": NOISE,
        "clip": CLIP,
        "lr": LR,
        "model": args.model,
        "input_shape": list(shape),
        "parameters": count_parameters(model),
        "data": source,
        "threads": torch.get_num_threads(),
        "threads_set_by_flag": args.threads is not None,
        "interop_threads": torch.get_num_interop_threads(),
        "cpu_count": os.cpu_count(),
        "torch_version": torch.__version__,
        "opacus_version": opacus_version,
        "opacus_run": run_opacus_loop,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "benchmark_wall_seconds": bench_wall,
        "warmup_steps": warm_steps,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "sanity": san,
    }
    return result, 0


def ratio_or_none(a, b):
    return None if a is None or b is None or b == 0 else a / b


def print_table(r: dict) -> None:
    def fmt(x, spec=".2f", unit=""):
        return "n/a" if x is None else f"{x:{spec}}{unit}"

    print(
        f"One DP-SGD round: {r['clients']} clients x {r['steps']} steps, batch {r['batch_size']} "
        f"(Poisson q={r['sampling_rate']:.4g}), {r['model']} ({r['parameters']:,} params), "
        f"z={r['noise_multiplier']}, C={r['clip']}, lr={r['lr']}"
    )
    print(
        f"workload {r['workload_gflop']:.1f} GFLOP (3 x {r['forward_mflop_per_sample']:.2f} MFLOP forward per expected "
        f"record); dpfl engine path: {r['engine_path']}"
    )
    print(
        f"data: {r['data']}; torch {r['torch_version']}, opacus {r['opacus_version'] or 'not installed'}, "
        f"{r['threads']} threads; median of {r['repeats']} interleaved repeats"
    )
    if r["loadavg_before"] is not None:
        print(
            f"load average before/after: {r['loadavg_before'][0]:.2f} / {r['loadavg_after'][0]:.2f} "
            f"on {r['cpu_count']} CPUs (other load distorts the timings)"
        )
    print()
    print(f"{'method':<26}{'median s':>10}{'client-steps/s':>16}{'GFLOP/s':>9}{'dpfl speed-up':>15}   raw s")
    rows = [
        ("dpfl (vectorised DP-SGD)", "dpfl", "dpfl_client_steps_per_second", None),
        ("Opacus per-client loop", "opacus", "opacus_client_steps_per_second", "speedup_vs_opacus"),
        ("non-private PyTorch loop", "nonprivate_loop", "nonprivate_loop_client_steps_per_second",
         "speedup_vs_nonprivate_loop"),
    ]
    if r["raw_seconds"].get("dpfl_vmap") is not None:
        rows.append(("dpfl generic (vmap) path", "dpfl_vmap", None, "speedup_vs_dpfl_vmap"))
    for label, key, rate, sp in rows:
        raw = r["raw_seconds"][key]
        raw_s = "skipped" if raw is None else " ".join(f"{t:.2f}" for t in raw)
        speed = "" if sp is None else fmt(r[sp], ".2f", "x")
        steps_s = (fmt(r[rate], ".0f") if rate
                   else fmt(ratio_or_none(r["clients"] * r["steps"], r[key + "_seconds"]), ".0f"))
        gflops = fmt(r[key + "_gflop_per_second"], ".1f")
        print(f"{label:<26}{fmt(r[key + '_seconds']):>10}{steps_s:>16}{gflops:>9}{speed:>15}   {raw_s}")
    if r.get("dpfl_fraction_of_peak") is not None:
        print(f"dpfl runs at {100 * r['dpfl_fraction_of_peak']:.0f}% of the given "
              f"{r['peak_gflop_per_second']:.0f} GFLOP/s peak")
    print()
    print("speed-up = method's median time / dpfl's median time (>1: dpfl is faster)")
    s = r["sanity"]
    if s is not None:
        print(
            f"sanity: finite dpfl={s['dpfl_finite']} opacus={s['opacus_finite']} nonprivate={s['nonprivate_finite']}; "
            f"client-0 loss {s['client0_initial_loss']:.3f} -> dpfl(z={s['sanity_noise_multiplier']}) "
            f"{s['client0_loss_dpfl_small_noise']:.3f}, non-private {s['client0_loss_nonprivate']:.3f}"
            f"  [{'ok' if s['ok'] else 'FAILED'}]"
        )


if __name__ == "__main__":
    sys.exit(main())
