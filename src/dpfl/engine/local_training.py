"""Vectorised local training: every client of a cohort takes its local steps together.

Clients share one architecture, so their parameters are stacked `[K, ...]` and one
`torch.func.vmap` runs them all; for DP-SGD a second `vmap` over samples gives per-sample gradients.
For DP-SGD the sampled records of all clients are packed back to back, each sample carrying its
client's parameters, so per-sample work is proportional to the records drawn (no padding); plain SGD
pads batches and masks. On CUDA (`layout` "padded") every client instead fills as many slots as the step's largest
batch, padding slots weighted 0: fixed-shape batched work with no host sync per step (the batch sizes of a block
of steps are read at once), the same records and sums to float rounding (dropout masks are drawn in the layout's
shape, so with dropout the layouts differ in the masks). Different step counts are handled by ordering clients by
step count, so the clients still training at step t are always a prefix of the stack.

A spec may train only some tensors (`trainable`, e.g. CENTAUR's head or representation phase). The
others are frozen: they are used in the forward pass but never differentiated, clipped, noised,
prox-pulled or momentum-tracked, so DP-SGD is the mechanism on the trainable coordinates alone.
Gradients are taken w.r.t. the trainable dict only; the frozen dict rides along as a separate argument.

The result is a pure function of (start parameters, client data, plans, seed, round): each client's
batches and noise come from its own generators keyed by (seed, round, client), so K clients run
together give the same parameters as the same clients run one by one.

Device: the engine trains where the pooled records are (`data.device`): the start (and anchor) parameters are
moved there, every index, mask, noise and generator is made there, and the result stays there. CPU and CUDA
draw different (equally distributed) random streams from the same keys, so their runs agree in distribution,
not bitwise; on one device and torch version a run repeats exactly.

Noisy-FedAvg / Noisy-FedProx (spec fdp_accounting §1.1) need per-step learning rates eta_{k,t} (a
plan may carry its own `step_lrs`; without them every step uses `spec.lr`, bit-for-bit the old path)
and two clipping modes: "per_example" (clip each sample's gradient, then average) and "batch" (clip
each client's mean mini-batch gradient; no per-sample gradients, so it cannot carry DP-SGD noise).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpfl.engine import params as P
from dpfl.engine.losses import per_sample_loss
from dpfl.engine.per_sample import FastModel, Unsupported, compile_model, segment_sum
from dpfl.engine.pooled import PooledData
from dpfl.engine.sampling import SAMPLINGS, BatchStream, NoiseStream, SlotBatches, SlotBlock
from dpfl.privacy.adaptive_clipping import AdaptiveClipping, update_noise_multiplier
from dpfl.seeding import Purpose, derive_seed, torch_generator

# Bound on per-sample-gradient elements held at once (floats); larger cohorts are run in chunks.
DEFAULT_MAX_ELEMENTS = 1 << 26

CLIP_MODES: tuple[str, ...] = ("per_example", "batch")
PRECISIONS: tuple[str, ...] = ("float32", "bfloat16")
_CPU = torch.device("cpu")
ENGINES: tuple[str, ...] = ("auto", "fast", "vmap")
LAYOUTS: tuple[str, ...] = ("auto", "packed", "padded")
# Forces run_local's layout "auto" to "packed" or "padded" on any device (tests, benchmarks: padded on the CPU).
LAYOUT_ENV = "DPFL_ENGINE_LAYOUT"


@dataclass(frozen=True)
class LocalSpec:
    """Hyperparameters of a local program shared by the cohort.

    clip is the clipping norm C (None: no clipping, the cheap batched-gradient path: the mean loss
    gradient over the actual batch).
    clip_mode "per_example" (default) clips every sample's gradient to C: the step is DP-SGD, (sum of
    clipped per-sample gradients + N(0, z^2 C^2)) divided by the *nominal* batch size under Poisson
    sampling (the random actual size would leak), and by the actual number of records drawn under
    "fixed"/"shuffle" sampling (data-independent sizes; "clip each, then average", so a short last
    shuffle batch is not shrunk; fixed batches have actual = nominal). clip_mode "batch" clips each
    client's mean loss gradient over its actual batch to C (Noisy-FedAvg's clip_V of the mini-batch
    gradient); it has no per-sample sensitivity, so plans with noise are refused.
    prox_mu adds the FedProx term mu/2 ||w - w_start||^2; its gradient is added after clipping and
    noise, since it does not touch data.
    trainable names the parameter tensors that train (None: all). The rest are frozen and take no
    part in the gradient, the clipping norm, the noise (its dimension is the trainable scalar count),
    momentum or prox. Names are checked against the parameters in `run_local`.
    precision "bfloat16" runs the gradients' matrix products (forward, backward, per-sample weight gradients) with
    bfloat16 operands and float32 results, for GPUs with bf16 tensor cores; per-sample norms, clip factors, the
    clipped sums, noise, averaging and the update stay float32 (float32 master weights), so clipping still bounds
    every record's contribution to C. "float32" (default) runs everything in float32.
    adaptive_clipping (sample-level adaptive clipping, Andrew et al. 2021, in each client's DP-SGD): each client
    clips to its own C_k (its plan's `clip`; `clip` here is the initial one, adaptive_clipping.initial_clip). Each
    step releases, besides the sum of the clipped gradients noised with z_Delta,k C_k (Theorem 1: z_Delta =
    (z^-2 - (2 sigma_b)^-2)^(-1/2), z the client's planned multiplier, so its accountant still charges z), the count
    of its records whose gradient norm is at most C_k, centred (sum of 1[norm <= C_k] - 1/2: sensitivity 1/2 when
    the batch size is not public), noised with N(0, sigma_b^2) from its own stream (Purpose.CLIP_COUNT), divided by
    the expected batch m_k (q n_k under Poisson sampling, never the realised size; the batch size under fixed-size
    sampling) and shifted back by 1/2; then C_k <- C_k exp(-eta (b~ - gamma)). sigma_b:
    adaptive_clipping.sigma_b(m_k). A client without noise (z = 0) releases its count without noise. None: one
    fixed clip, bit for bit the path without it.
    """

    lr: float
    loss: str = "cross_entropy"
    clip: float | None = None
    sampling: str = "shuffle"
    momentum: float = 0.0
    prox_mu: float = 0.0
    trainable: tuple[str, ...] | None = None
    clip_mode: str = "per_example"
    prox_to: str = "start"  # the prox term's anchor: the client's start, or the `anchor` run_local is given
    micro_batch: int | None = None  # per-sample gradients of at most this many records at once (DP-SGD)
    precision: str = "float32"  # "bfloat16": the gradients' GEMMs in bf16, all else float32
    adaptive_clipping: AdaptiveClipping | None = None  # each client's clip follows a quantile of its norms

    @property
    def bf16(self) -> bool:
        """Whether the gradients' matrix products run on bfloat16 operands (`precision`)."""
        return self.precision == "bfloat16"

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"clip must be > 0 or None, got {self.clip}")
        if self.clip_mode not in CLIP_MODES:
            raise ValueError(f"clip_mode must be one of {CLIP_MODES}, got {self.clip_mode!r}")
        if self.clip_mode == "batch" and self.clip is None:
            raise ValueError("clip_mode 'batch' needs a clipping norm: set clip")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.prox_mu < 0:
            raise ValueError(f"prox_mu must be >= 0, got {self.prox_mu}")
        if self.prox_to not in ("start", "anchor"):
            raise ValueError(f"prox_to must be 'start' or 'anchor', got {self.prox_to!r}")
        if self.micro_batch is not None and (isinstance(self.micro_batch, bool) or not isinstance(self.micro_batch, int)
                                             or self.micro_batch < 1):
            raise ValueError(f"micro_batch must be an integer >= 1 or None, got {self.micro_batch!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        per_sample_loss(self.loss)
        if self.adaptive_clipping is not None:
            if self.clip_mode != "per_example" or self.clip != self.adaptive_clipping.initial_clip:
                raise ValueError(f"adaptive clipping adapts the per-example clip: it needs clip_mode 'per_example' "
                                 f"and clip = its initial_clip {self.adaptive_clipping.initial_clip} (got "
                                 f"clip_mode {self.clip_mode!r}, clip {self.clip})")
        if self.trainable is not None:
            if isinstance(self.trainable, str):
                raise ValueError(f"trainable must be a sequence of parameter names, got the string {self.trainable!r}")
            object.__setattr__(self, "trainable", tuple(self.trainable))
            if not self.trainable:
                raise ValueError("trainable is empty: nothing would train (use None to train all parameters)")
            dup = sorted({n for n in self.trainable if self.trainable.count(n) > 1})
            if dup:
                raise ValueError(f"trainable names repeated: {dup}")


@dataclass(frozen=True)
class ClientPlan:
    """What one client does this round: its id, batch size, steps and noise.

    step_lrs, if given, are the learning rates of its `steps` local steps (a schedule eta_{k,t} such
    as Noisy-FedAvg's cyclic or stage-wise rates); None uses the spec's constant lr.
    key, if given, keys the client's batch and noise generators instead of `client` (which then only
    indexes `data`): a process holding one client's records (a Flower node) trains it as client 0 of its
    own data with the run-wide id as key, and draws exactly the batches and noise the simulation draws.
    clip: the client's own clip C_k at the start of the round, under adaptive clipping (the local program's state;
    None: the spec's clip).
    """

    client: int
    batch_size: int
    steps: int
    noise_multiplier: float = 0.0
    step_lrs: tuple[float, ...] | None = None
    key: int | None = None
    clip: float | None = None

    @property
    def stream(self) -> int:
        """The id the client's generators are keyed by (seeding.py: (seed, round, client, purpose))."""
        return self.client if self.key is None else self.key

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"client {self.client}: steps must be >= 0, got {self.steps}")
        if self.step_lrs is not None:
            if isinstance(self.step_lrs, (str, bytes)):
                raise ValueError(f"client {self.client}: step_lrs must be a sequence of rates, got {self.step_lrs!r}")
            object.__setattr__(self, "step_lrs", tuple(float(v) for v in self.step_lrs))
            if len(self.step_lrs) != self.steps:
                raise ValueError(
                    f"client {self.client}: step_lrs has {len(self.step_lrs)} entries for {self.steps} steps")
            bad = [v for v in self.step_lrs if not (math.isfinite(v) and v > 0)]
            if bad:
                raise ValueError(f"client {self.client}: step_lrs must be finite and > 0, got {bad}")
        if self.batch_size < 1:
            raise ValueError(f"client {self.client}: batch size must be >= 1, got {self.batch_size}")
        if self.noise_multiplier < 0:
            raise ValueError(f"client {self.client}: noise multiplier must be >= 0, got {self.noise_multiplier}")
        if self.clip is not None and not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"client {self.client}: clip must be finite and > 0, got {self.clip}")


@dataclass
class LocalResult:
    """Stacked end parameters `[K, ...]` in the order of the plans, plus what each client did."""

    params: P.Params
    steps: list[int]
    records_used: list[int]  # total records across the client's batches
    empty_batches: list[int]
    noise_sq_norm: list[float] = field(default_factory=list)  # ||sum_t xi_t||^2 * (zC)^2, diagnostics only
    clips: list[float] | None = None  # adaptive clipping: each client's clip C_k after its steps (None: fixed clip)


def run_local(
    model: nn.Module,
    spec: LocalSpec,
    plans: Sequence[ClientPlan],
    data: PooledData,
    start: Mapping[str, torch.Tensor],
    *,
    seed: int,
    round_: int,
    stacked_start: bool = False,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    engine: str = "auto",
    anchor: Mapping[str, torch.Tensor] | None = None,
    layout: str = "auto",
) -> LocalResult:
    """Run every plan's local program from `start` (one model, or `[K, ...]` if stacked_start).

    `anchor` (one model) is the point the prox term pulls towards when spec.prox_to is "anchor" (MR-MTL: the
    server's mean while each client starts from its own model); it is data-independent, so its gradient is added
    after clipping and noise like FedProx's.

    engine "auto" takes the fast exact path (`engine/per_sample.py`) when the model and input are supported
    and the generic vmap path otherwise; "fast" requires the fast path (ValueError if unsupported); "vmap"
    forces the generic path. Both compute the same update to float tolerance.

    layout "packed" packs the records each client drew at a step back to back (no padding; reading the Poisson
    batch sizes costs host syncs every step); "padded" gives every client the same number of slots per step, the
    step's largest batch (the batch sizes of a block of steps read at once), padding slots weighted 0: the same
    records, the same sums to float rounding, fixed-shape batched work for a GPU. "auto": padded on CUDA, packed
    elsewhere, unless the environment variable DPFL_ENGINE_LAYOUT says "packed" or "padded".
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if (spec.prox_to == "anchor") != (anchor is not None):
        raise ValueError("spec.prox_to 'anchor' and an anchor model go together")
    for plan in plans:
        if plan.noise_multiplier > 0 and spec.clip is None:
            raise ValueError(f"client {plan.client}: noise without clipping has no sensitivity bound; set clip")
        if plan.noise_multiplier > 0 and spec.clip_mode == "batch":
            raise ValueError(f"client {plan.client}: noise needs per-example clipping (DP-SGD); clip_mode is 'batch'")
        if not 0 <= plan.client < data.n_clients:
            raise ValueError(f"client id {plan.client} is outside 0..{data.n_clients - 1}")
        if plan.clip is not None and spec.adaptive_clipping is None:
            raise ValueError(f"client {plan.client}: a clip of its own is adaptive clipping's state; the spec has none")
    if spec.adaptive_clipping is not None:
        _adaptive_noise(spec.adaptive_clipping, plans, data)  # refuses a client the count's noise leaves no budget
    k = len(plans)
    if k == 0:
        raise ValueError("no clients to train")
    device = data.device
    padded = _padded(layout, device)
    start = P.to_device(start, device)
    anchor = P.to_device(anchor, device) if anchor is not None else None
    start_stack = {n: t.clone() for n, t in start.items()} if stacked_start else P.broadcast(start, k)
    names = trainable_names(spec, start_stack)
    dim = P.num_parameters(start_stack, leading=1)
    dim_t = sum(start_stack[n][0].numel() for n in names)
    # Longest-running clients first, so the active clients at any step are a prefix.
    order = sorted(range(k), key=lambda i: -plans[i].steps)
    width = held_width(plans, spec.sampling, padded)
    per_sample = spec.clip is not None and spec.clip_mode == "per_example"
    fast, per_record = _fast_model(model, engine, data, start_stack)
    # Memory per record of a step: on the fast path its activations, im2col matrices and per-sample conv weight
    # gradients; on the generic path (DP-SGD only) per-sample copies of all tensors and per-sample gradients of
    # the trainable ones
    record_cost = per_record if fast is not None else (dim + dim_t if per_sample else 0)
    workers = _workers(fast, k, device)
    budget = max_elements // workers
    if per_sample and spec.micro_batch is None and record_cost * width > budget:
        # one client's step alone would exceed the budget (e.g. a full-batch round): accumulate it over physical
        # micro-batches, as `micro_batch` does. The sum is the same up to float rounding, the memory bounded, and
        # it runs faster (measured 1.8x on R-DPCFL's 8,000-record full-batch round 1, cnn_mnist_dp: 139 s, not 248 s)
        spec = replace(spec, micro_batch=max(1, budget // record_cost))
    if per_sample and spec.micro_batch is not None:  # gradient accumulation bounds the per-sample records held
        width = min(width, spec.micro_batch)
    per_client = record_cost * max(1, width) + (4 * dim if fast is not None else dim)
    chunk = max(1, min(k, budget // max(1, per_client)))
    if workers > 1:  # deal the clients round-robin so every worker gets a like share of the steps
        n_groups = max(workers, -(-k // chunk))
        groups = [order[g::n_groups] for g in range(n_groups)]
    else:
        groups = [order[lo : lo + chunk] for lo in range(0, k, chunk)]

    def run(rows: list[int]) -> LocalResult:
        index = torch.tensor(rows, device=device)
        return _run_chunk(model, spec, [plans[i] for i in rows], data, P.select(start_stack, index), names, seed,
                          round_, fast, anchor, padded)

    # dropout masks come from torch's global RNG (CUDA's, on a GPU): seeded per round, restored after
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), _fixed_kernels(device):
        torch.manual_seed(derive_seed(seed, int(Purpose.DROPOUT), round_))
        if workers > 1:
            results = _in_threads(run, groups, workers)
        else:
            results = (run(rows) for rows in groups)
        return merge_groups(k, groups, results)


def held_width(plans: Sequence[ClientPlan], sampling: str, padded: bool, miss: float = 1e-3) -> int:
    """Records one client holds at a step, as the memory budget counts them: the largest batch size; in the padded
    layout under Poisson sampling every client holds the step's largest drawn batch, so the (1 - miss / K) quantile
    of a Poisson with the largest expected batch (all K clients stay under it at a step with probability about
    1 - miss). A step over it holds more memory than planned; no record is ever dropped."""
    width = max(p.batch_size for p in plans)
    if not padded or sampling != "poisson":
        return width
    target = 1.0 - miss / len(plans)
    j, log_pmf = 0, -float(width)  # log P(X = 0) for X ~ Poisson(width)
    cdf = math.exp(log_pmf)
    while cdf < target:
        j += 1
        log_pmf += math.log(width / j)
        cdf += math.exp(log_pmf)
    return max(width, j)


def _padded(layout: str, device: torch.device) -> bool:
    """Whether `run_local`'s `layout` means the padded layout on `device`."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "auto":
        layout = os.environ.get(LAYOUT_ENV) or "auto"
        if layout not in LAYOUTS:
            raise ValueError(f"{LAYOUT_ENV} must be one of {LAYOUTS[1:]}, got {layout!r}")
    return layout == "padded" or (layout == "auto" and device.type == "cuda")


def replay_noise(plans: Sequence[ClientPlan], dim: int, seed: int, round_: int,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """[K, dim]: each plan's summed standard-normal DP-SGD noise sum_t xi_t of round `round_`, redrawn from the
    generators `run_local` drew it from, in the same blocks and the same order of additions, so it equals the sum the
    client's steps added (times z_i C); zeros for a plan without noise. `dim` is the trainable coordinates' count.

    Engine-only diagnostics of what the noise became after aggregation (PFA's `pfa_noise_passthrough`): in a real
    deployment each client's noise stays on the client. `device`: where the clients trained (their generators'
    device decides the stream), and where the result is.
    """
    out = torch.zeros(len(plans), dim, device=device)
    for i, plan in enumerate(plans):
        if plan.noise_multiplier > 0:
            stream = NoiseStream(dim, plan.steps, torch_generator(seed, Purpose.NOISE, round_, plan.stream, device))
            for _ in range(plan.steps):
                out[i] += stream.next()
    return out


def merge_groups(k: int, groups: Sequence[Sequence[int]], results: Iterable[LocalResult]) -> LocalResult:
    """The results of groups of plans (group g holds plan indices `groups[g]`, its result in that order) as one
    LocalResult in plan order (the engine's thread groups, a Ray backend's shards)."""
    out: P.Params = {}
    steps, used, empties, noise_sq = [0] * k, [0] * k, [0] * k, [0.0] * k
    clips: list[float] | None = None
    for rows, res in zip(groups, results, strict=True):
        if res.clips is not None:
            clips = clips if clips is not None else [0.0] * k
            for j, i in enumerate(rows):
                clips[i] = res.clips[j]
        for n, t in res.params.items():
            if n not in out:
                out[n] = t.new_empty((k, *t.shape[1:]))
            out[n][torch.tensor(list(rows), dtype=torch.int64, device=t.device)] = t
        for j, i in enumerate(rows):
            steps[i], used[i], empties[i] = res.steps[j], res.records_used[j], res.empty_batches[j]
            noise_sq[i] = res.noise_sq_norm[j]
    return LocalResult(out, steps, used, empties, noise_sq, clips)


def _adaptive_noise(adaptive: AdaptiveClipping, plans: Sequence[ClientPlan], data: PooledData
                    ) -> tuple[list[float], list[float], list[float]]:
    """Each plan's expected batch m_k (q n_k = min(b_k, n_k) under Poisson sampling; b_k under fixed-size sampling,
    where b_k <= n_k), its count's noise sigma_b (0 for a client without noise) and its update's noise multiplier
    z_Delta,k (Theorem 1); a client whose sigma_b leaves its update no budget is refused, naming it."""
    expected, sigma_b, z_delta = [], [], []
    for p in plans:
        m = float(min(p.batch_size, data.size(p.client)))
        sb = adaptive.sigma_b(m)
        try:
            zd = update_noise_multiplier(p.noise_multiplier, sb)
        except ValueError as err:
            raise ValueError(f"client {p.stream}: {err}") from None
        expected.append(m)
        sigma_b.append(sb if p.noise_multiplier > 0 else 0.0)
        z_delta.append(zd)
    return expected, sigma_b, z_delta


def _workers(fast: FastModel | None, k: int, device: torch.device = _CPU) -> int:
    """How many groups of clients to run at once, one thread each (torch's thread budget, at most k).

    Only on the CPU (a GPU runs one group's kernels at a time anyway), and only for the fast path without
    active dropout: its masks come from torch's global RNG in a fixed order, which concurrent groups would
    interleave. Everything else a client draws has its own generator,
    so the grouping changes the result only by float rounding (the cost model may pick another GEMM layout
    for a group's batch sizes); a given thread count always gives the same grouping, so runs repeat exactly.
    """
    if fast is None or fast.stochastic() or device.type != "cpu":
        return 1
    return max(1, min(k, torch.get_num_threads()))


_THREAD_COUNT_LOCK = threading.Lock()


@contextmanager
def _fixed_kernels(device: torch.device) -> Iterator[None]:
    """While a CUDA cohort trains, cuDNN uses deterministic convolution algorithms, chosen without benchmarking, so
    a run repeats bit for bit on the same GPU and torch version (restored after; nothing changes on the CPU)."""
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    saved = cudnn.deterministic, cudnn.benchmark
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.benchmark = saved


def _in_threads(run, groups: list[list[int]], workers: int) -> list[LocalResult]:
    """`run` on every group, `workers` groups at a time in threads with one torch thread each (small
    per-client operations scale better over groups than inside each operation)."""
    from concurrent.futures import ThreadPoolExecutor

    # torch's thread count is process-wide: concurrent calls take turns, so each restores what it found
    with _THREAD_COUNT_LOCK:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dpfl-engine") as pool:
                return list(pool.map(run, groups))
        finally:
            torch.set_num_threads(threads)


def _fast_model(model: nn.Module, engine: str, data: PooledData, params: Mapping[str, torch.Tensor]
                ) -> tuple[FastModel | None, int]:
    """The fast exact path for this model and input shape (None: use vmap), and the floats it holds per record."""
    if engine == "vmap":
        return None, 0
    fast = compile_model(model)
    try:
        if fast is None:
            raise Unsupported(f"{type(model).__name__} is not a supported nn.Sequential")
        return fast, fast.check(tuple(data.x.shape[1:]), list(params))
    except Unsupported as err:
        if engine == "fast":
            raise ValueError(f"engine 'fast' cannot run this model: {err}") from None
        return None, 0


def trainable_names(spec: LocalSpec, params: Mapping[str, torch.Tensor]) -> list[str]:
    """The trainable tensor names in the parameters' own order (so the noise layout does not depend on
    how `trainable` was spelled)."""
    if spec.trainable is None:
        return list(params)
    unknown = [n for n in spec.trainable if n not in params]
    if unknown:
        raise ValueError(f"trainable names not among the model's parameters: {unknown}; known: {list(params)}")
    wanted = set(spec.trainable)
    return [n for n in params if n in wanted]


def _run_chunk(
    model: nn.Module,
    spec: LocalSpec,
    plans: Sequence[ClientPlan],
    data: PooledData,
    w0: P.Params,
    names: Sequence[str],
    seed: int,
    round_: int,
    fast: FastModel | None = None,
    anchor: Mapping[str, torch.Tensor] | None = None,
    padded: bool = False,
) -> LocalResult:
    """Plans sorted by decreasing steps; w0 stacked in the same order; only `names` train; `padded`: the padded
    layout (`run_local`'s `layout`)."""
    k = len(plans)
    device = data.device
    loss_fn = per_sample_loss(spec.loss)
    keep = set(names)
    # The trainable tensors live side by side in one [K, D] matrix (`w[n]` are views of it), so the step's
    # element-wise work (noise, averaging, prox, momentum, the update) is a few passes over one matrix.
    trainable0 = {n: w0[n] for n in names}
    flat0 = P.flatten(trainable0)
    flat = flat0.clone()
    pull = flat0 if anchor is None else P.flatten({n: anchor[n] for n in names}, leading=0).to(flat0.dtype)
    frozen = {n: t.clone() for n, t in w0.items() if n not in keep}  # never written to
    trained = P.unflatten(flat, trainable0)  # views of `flat` (column blocks of a row-major matrix)
    w = {n: trained[n] if n in keep else frozen[n] for n in w0}  # the parameters' own order
    buf = torch.zeros_like(flat) if spec.momentum else None
    clients = torch.tensor([p.client for p in plans], device=device)
    batches = [
        BatchStream(spec.sampling, data.size(p.client), p.batch_size,
                    torch_generator(seed, Purpose.BATCH, round_, p.stream, device), p.steps)
        for p in plans
    ]
    dim = sum(w[n][0].numel() for n in names)  # noise lives on trainable coordinates only
    noisy = [p.noise_multiplier > 0 for p in plans]
    noises = [
        NoiseStream(dim, p.steps, torch_generator(seed, Purpose.NOISE, round_, p.stream, device)) if noisy[i] else None
        for i, p in enumerate(plans)
    ]
    noise_sums = torch.zeros(k, dim, device=device) if any(noisy) else None
    nominal = torch.tensor([float(p.batch_size) for p in plans], device=device)
    noise_scale = torch.tensor([p.noise_multiplier * (spec.clip or 0.0) for p in plans], device=device)
    used, empties = [0] * k, [0] * k
    per_sample = spec.clip is not None and spec.clip_mode == "per_example"
    adaptive = _AdaptiveClips(spec, plans, data, seed, round_, flat.dtype) if spec.adaptive_clipping else None
    slots = _Slots(batches, plans, data, clients, flat.dtype) if padded else None
    if fast is not None:
        grads_of = None
    else:
        bf16 = spec.bf16
        grads_of = _per_sample_grad_fn(model, loss_fn, bf16) if per_sample else _batch_grad_fn(model, loss_fn, bf16)
    max_steps = plans[0].steps if plans else 0
    # Per-step rates [K, max_steps] only if some plan has a schedule (else the scalar fast path);
    # entries past a client's last step are never read.
    lrs = None
    if any(p.step_lrs is not None for p in plans):
        lrs = torch.full((k, max_steps), float(spec.lr), dtype=torch.float64, device=device)
        for i, p in enumerate(plans):
            if p.step_lrs is not None and p.steps:
                lrs[i, : p.steps] = torch.tensor(p.step_lrs, dtype=torch.float64, device=device)
    active = k
    for t in range(max_steps):
        while active and plans[active - 1].steps <= t:
            active -= 1
        wa = {n: w[n][:active] for n in names}
        fa = {n: v[:active] for n, v in frozen.items()}
        clip = counts = None
        if adaptive is not None:  # this step's clips C_k, and where the counts of norms <= C_k go
            clip, counts = adaptive.clips[:active], torch.zeros(active, dtype=flat.dtype, device=device)
        if slots is not None:
            sums, drawn = _padded_step(slots, t, active, spec, fast, grads_of, loss_fn, wa, fa, per_sample, clip,
                                       counts)
        else:
            idx = [batches[i].next().to(device) for i in range(active)]  # no-op where the generators are
            for i, ix in enumerate(idx):
                used[i] += len(ix)
                empties[i] += int(len(ix) == 0)
            sums = _packed_step(idx, spec, fast, grads_of, loss_fn, wa, fa, data, clients[:active], per_sample, clip,
                                counts)
            drawn = _drawn(idx, nominal.dtype, device) if not per_sample or spec.sampling != "poisson" else None
        g = P.flatten({n: sums[n] for n in names})
        if not per_sample:
            g.div_(drawn.unsqueeze(1))  # the mean loss gradient over the records drawn
            if spec.clip is not None:  # clip_mode "batch": the client's mean gradient, clipped to C
                factor = torch.clamp(spec.clip / (torch.linalg.vector_norm(g, dim=1) + 1e-12), max=1.0)
                g.mul_(factor.unsqueeze(1))
        else:
            if noise_sums is not None:
                xi = torch.stack([noises[i].next().to(device) if noisy[i] else torch.zeros(dim, device=device)
                                  for i in range(active)])
                if adaptive is None:
                    noise_sums[:active] += xi
                    g.add_(xi * noise_scale[:active, None])
                else:  # z_Delta,k C_k at this step's clip: the scaled noise is summed for the diagnostics
                    xi = xi * adaptive.noise_scale(active)[:, None]
                    noise_sums[:active] += xi
                    g.add_(xi)
            # Poisson: the nominal size (the random actual size would leak). Fixed / shuffle sizes are
            # data-independent: average the clipped gradients over the records actually drawn.
            g.div_((nominal[:active] if spec.sampling == "poisson" else drawn).unsqueeze(1))
            if adaptive is not None:
                adaptive.step(t, active, counts)
        if spec.prox_mu:
            g.add_(spec.prox_mu * (flat[:active] - (pull if anchor is not None else pull[:active])))
        if buf is not None:
            g = buf[:active].mul_(spec.momentum).add_(g)
        if lrs is None:
            flat[:active].sub_(spec.lr * g)
        else:
            flat[:active].sub_(lrs[:active, t].to(g.dtype).unsqueeze(1) * g)
    if slots is not None:
        used, empties = slots.used.tolist(), slots.empties.tolist()
    noise_sq: list[float] = [0.0] * k
    if noise_sums is not None:
        scale_sq = noise_scale.pow(2) if adaptive is None else 1.0  # adaptive: the sums are scaled already
        noise_sq = (noise_sums.pow(2).sum(1) * scale_sq).tolist()
    clips = adaptive.clips.tolist() if adaptive is not None else None
    return LocalResult(w, [p.steps for p in plans], used, empties, noise_sq, clips)


class _AdaptiveClips:
    """Sample-level adaptive clipping of one chunk of plans (sorted by decreasing steps): each client's clip C_k
    (`clips`, `[K]`), its update noise z_Delta,k, and each step's clip move from the noised count of norms <= C_k.

    The count's standard-normal noise of client k's t-th step is entry t of `randn(steps_k)` from its generator
    keyed (seed, CLIP_COUNT, round, client): drawn once per round, so the stream does not depend on the cohort, the
    layout or the chunking."""

    def __init__(self, spec: LocalSpec, plans: Sequence[ClientPlan], data: PooledData, seed: int, round_: int,
                 dtype: torch.dtype) -> None:
        adaptive = spec.adaptive_clipping
        assert adaptive is not None and spec.clip is not None
        device = data.device
        expected, sigma_b, z_delta = _adaptive_noise(adaptive, plans, data)
        self.gamma, self.eta = adaptive.target_quantile, adaptive.learning_rate
        self.clips = torch.tensor([p.clip if p.clip is not None else spec.clip for p in plans], dtype=dtype,
                                  device=device)
        self.expected = torch.tensor(expected, dtype=dtype, device=device)
        self.sigma_b = torch.tensor(sigma_b, dtype=dtype, device=device)
        self.z_delta = torch.tensor(z_delta, dtype=dtype, device=device)
        steps = max((p.steps for p in plans), default=0)
        self.count_noise = torch.zeros(len(plans), steps, dtype=dtype, device=device)
        for i, p in enumerate(plans):
            if sigma_b[i] > 0 and p.steps:
                g = torch_generator(seed, Purpose.CLIP_COUNT, round_, p.stream, device)
                self.count_noise[i, : p.steps] = torch.randn(p.steps, generator=g, device=device, dtype=dtype)

    def noise_scale(self, active: int) -> torch.Tensor:
        """`[active]`: the update noise's std z_Delta,k C_k at the current clips."""
        return self.z_delta[:active] * self.clips[:active]

    def step(self, t: int, active: int, counts: torch.Tensor) -> None:
        """Step t's clip move of the first `active` clients: C_k <- C_k exp(-eta (b~_k - gamma)), b~_k = (count_k +
        sigma_b,k xi_k,t) / m_k + 1/2, count_k the centred count sum (1[norm <= C_k] - 1/2): under Poisson sampling
        the batch size is not public, and the plain count's sensitivity (1) is twice what Theorem 1 charges."""
        noised = (counts + self.count_noise[:active, t] * self.sigma_b[:active]) / self.expected[:active] + 0.5
        self.clips[:active].mul_(torch.exp(-self.eta * (noised - self.gamma)))


def _packed_step(idx: Sequence[torch.Tensor], spec: LocalSpec, fast: FastModel | None, grads_of, loss_fn, wa: P.Params,
                 fa: P.Params, data: PooledData, clients: torch.Tensor, per_sample: bool,
                 clip: torch.Tensor | None = None, counts: torch.Tensor | None = None) -> P.Params:
    """The packed layout's per-client gradient sums of one step: clipped per sample (DP-SGD) or not. `clip`: one clip
    per client (adaptive clipping; None: spec.clip), `counts`: where the counts of norms <= clip are added."""
    if not per_sample:
        if fast is not None:
            x, y, owner = data.gather_packed(clients, idx)
            return fast.grad_sum(wa, fa, x, y, owner, loss_fn, bf16=spec.bf16)
        x, y, mask = data.gather(clients, idx)
        return _batch_gradient(grads_of, wa, x, y, mask, fa)
    x, y, owner = data.gather_packed(clients, idx)
    bound = spec.clip if clip is None else clip

    def clipped(xs: torch.Tensor, ys: torch.Tensor, os: torch.Tensor) -> P.Params:
        if fast is not None:
            return fast.clipped_sum(wa, fa, xs, ys, os, bound, loss_fn, bf16=spec.bf16, counts=counts)
        return _clipped_sum(grads_of, wa, xs, ys, os, bound, fa, counts=counts)

    return _accumulated(clipped, x, y, owner, spec.micro_batch)


class _Slots:
    """The padded layout's batches for one chunk of plans (sorted by decreasing steps): blocks of `SlotBatches`,
    with the records drawn and the empty batches counted on the device (read once, after the round)."""

    def __init__(self, batches: Sequence[BatchStream], plans: Sequence[ClientPlan], data: PooledData,
                 clients: torch.Tensor, dtype: torch.dtype) -> None:
        device = data.device
        self.data, self.clients, self.dtype = data, clients, dtype
        self.steps = torch.tensor([p.steps for p in plans], device=device)
        self.blocks = iter(SlotBatches(batches, [p.steps for p in plans], device))
        self.block: SlotBlock | None = None
        self.used = torch.zeros(len(plans), dtype=torch.int64, device=device)
        self.empties = torch.zeros(len(plans), dtype=torch.int64, device=device)
        self._owners: dict[tuple[int, int], torch.Tensor] = {}

    def at(self, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Step t's slots `[K_t, cap_t]` (local indices, weights; cap_t the step's largest batch) and records drawn
        `[K_t]` (at least 1), for the clients of the block; the engine takes the prefix still training."""
        blk = self.block
        if blk is None or t >= blk.start + blk.counts.shape[0]:
            blk = self.block = next(self.blocks)
            k = blk.counts.shape[1]
            live = (blk.start + torch.arange(blk.counts.shape[0], device=blk.counts.device)).unsqueeze(1) \
                < self.steps[:k].unsqueeze(0)  # steps a client takes (a finished client's slots are all empty)
            self.used[:k] += blk.counts.sum(0)
            self.empties[:k] += ((blk.counts == 0) & live).sum(0)
            self._weight = blk.mask.to(self.dtype)
            self._drawn = blk.counts.clamp(min=1).to(self.dtype)
        j, cap = t - blk.start, blk.caps[t - blk.start]  # the step's largest batch: the slots past it are all padding
        return blk.index[j, :, :cap], self._weight[j, :, :cap], self._drawn[j]

    def owner(self, k: int, c: int) -> torch.Tensor:
        """[k * c]: each slot's client, k clients of c slots."""
        o = self._owners.get((k, c))
        if o is None:
            o = self._owners[(k, c)] = torch.arange(k, device=self.clients.device).repeat_interleave(c)
        return o


def _padded_step(slots: _Slots, t: int, active: int, spec: LocalSpec, fast: FastModel | None, grads_of, loss_fn,
                 wa: P.Params, fa: P.Params, per_sample: bool, clip: torch.Tensor | None = None,
                 counts: torch.Tensor | None = None) -> tuple[P.Params, torch.Tensor]:
    """The padded layout's per-client gradient sums of step t, and the records each client drew (at least 1);
    `clip` and `counts` as in `_packed_step` (padding slots, weighted 0, are never counted)."""
    index, weight, drawn = slots.at(t)
    index, weight, drawn, clients = index[:active], weight[:active], drawn[:active], slots.clients[:active]
    cap = index.shape[1]
    if not per_sample:
        x, y = slots.data.gather_slots(clients, index)
        if fast is not None:
            return fast.grad_sum(wa, fa, x, y, slots.owner(active, cap), loss_fn, weight.reshape(-1), cap,
                                 spec.bf16), drawn
        x, y = x.view(active, cap, *x.shape[1:]), y.view(active, cap, *y.shape[1:])
        return _batch_gradient(grads_of, wa, x, y, weight, fa), drawn
    # physical micro-batches: columns of slots, every client the same number of them (at most `micro` records at once,
    # or one slot of every client)
    width = max(1, cap if spec.micro_batch is None else spec.micro_batch // max(1, active))
    total: P.Params | None = None
    for lo in range(0, max(cap, 1), width):
        part_index, part_weight = index[:, lo: lo + width], weight[:, lo: lo + width]
        c = part_index.shape[1]
        x, y = slots.data.gather_slots(clients, part_index)
        bound = spec.clip if clip is None else clip
        if fast is not None:
            part = fast.clipped_sum(wa, fa, x, y, slots.owner(active, c), bound, loss_fn, part_weight.reshape(-1),
                                    c, spec.bf16, counts)
        else:
            part = _clipped_sum(grads_of, wa, x, y, slots.owner(active, c), bound, fa, part_weight.reshape(-1), c,
                                counts)
        total = part if total is None else {n: total[n].add_(part[n]) for n in total}
    assert total is not None
    return total, drawn


def _drawn(idx: Sequence[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Records each client drew at this step (at least 1, so an empty batch divides a zero sum by 1)."""
    return torch.tensor([float(len(ix)) for ix in idx], dtype=dtype, device=device).clamp(min=1)


def _batch_gradient(grads_of, w: P.Params, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
                    frozen: P.Params | None = None) -> P.Params:
    """Sum over each client's (padded, masked) batch of per-sample loss gradients w.r.t. `w`: `[K, ...]`."""
    if x.shape[1] == 0:
        return {n: torch.zeros_like(v) for n, v in w.items()}
    return grads_of(w, x, y, mask.to(torch.float32), frozen=frozen)


def _accumulated(clipped, x: torch.Tensor, y: torch.Tensor, owner: torch.Tensor, micro: int | None) -> P.Params:
    """The step's per-client sums of clipped per-sample gradients, over physical micro-batches of at most `micro`
    records (clipping is per sample, so the sum equals the one-shot sum; the noise is drawn once per step after it)."""
    if micro is None or len(owner) <= micro:
        return clipped(x, y, owner)
    total: P.Params | None = None
    for lo in range(0, len(owner), micro):
        part = clipped(x[lo: lo + micro], y[lo: lo + micro], owner[lo: lo + micro])
        total = part if total is None else {n: total[n].add_(part[n]) for n in total}
    assert total is not None
    return total


def _clipped_sum(grads_of, w: P.Params, x: torch.Tensor, y: torch.Tensor, owner: torch.Tensor,
                 clip: float | torch.Tensor, frozen: P.Params | None = None, weight: torch.Tensor | None = None,
                 slots: int | None = None, counts: torch.Tensor | None = None) -> P.Params:
    """Sum over each client's batch of per-sample gradients w.r.t. `w`, clipped to one global L2 norm `clip`.

    Samples are packed back to back; each takes its client's parameters (`owner`), so the work is
    proportional to the records drawn, with no padding. An empty batch sums to zero (noise-only step).
    Frozen tensors enter the forward pass only, so the norm is over the trainable coordinates.
    `weight` [S] (0 / 1) multiplies each sample's clip factor (padding slots: 0); `slots`: every client holds that
    many consecutive samples (the padded layout), so the per-client sums are plain sums over a `[k, slots]` view.
    `clip` may be one norm per client (`[k]`) and `counts` (`[k]`) adds each client's count of samples whose norm is
    at most its clip, as in `FastModel.clipped_sum`.
    """
    out = {n: torch.zeros_like(v) for n, v in w.items()}
    if len(owner) == 0:
        return out
    fs = {n: v.index_select(0, owner) for n, v in (frozen or {}).items()}
    per_sample = grads_of({n: v.index_select(0, owner) for n, v in w.items()}, x, y, frozen=fs)
    norms = P.global_norms(per_sample)
    bound = clip.index_select(0, owner) if isinstance(clip, torch.Tensor) else clip
    factor = torch.clamp(bound / (norms + 1e-12), max=1.0)
    if weight is not None:
        factor = factor * weight.to(factor.dtype)
    if counts is not None:
        below = (norms <= bound).to(counts.dtype) - 0.5  # centred: sensitivity 1/2 (adaptive_clipping)
        below = below if weight is None else below * weight.to(counts.dtype)
        k = counts.shape[0]
        counts.add_(below.view(k, slots).sum(1) if slots is not None else segment_sum(below, owner, k))
    for n, g in per_sample.items():  # scale in place: per-sample gradients are the largest tensors here
        g = g.mul_(factor.reshape(-1, *([1] * (g.dim() - 1))))
        k = out[n].shape[0]
        out[n] = g.view(k, slots, *g.shape[1:]).sum(1) if slots is not None else segment_sum(g, owner, k)
    return out


def _forward(model: nn.Module, params: P.Params, x: torch.Tensor, bf16: bool) -> torch.Tensor:
    """The model's output at `params`; `bf16`: under bfloat16 autocast, the output in float32 for the loss."""
    if not bf16:
        return functional_call(model, params, (x,))
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        out = functional_call(model, params, (x,))
    return out.float()


def _float32(grads: P.Params, bf16: bool) -> P.Params:
    """The gradients in float32 before norms and clipping (autocast leaves float32 parameters' gradients float32)."""
    return {n: g.float() for n, g in grads.items()} if bf16 else grads


def _per_sample_grad_fn(model: nn.Module, loss_fn, bf16: bool = False):
    """Gradient of each sample's loss at its own parameters: vmap over (parameters, x, y) triples.

    Differentiates w.r.t. `p` only; the optional `frozen` tensors (stacked like `p`) join the forward
    pass without being differentiated. `bf16`: the forward / backward under bfloat16 autocast.
    """

    def loss_one(p, frozen, xi, yi):
        out = _forward(model, {**p, **frozen}, xi.unsqueeze(0), bf16)
        return loss_fn(out, yi.unsqueeze(0)).sum()

    vg = vmap(grad(loss_one), in_dims=(0, 0, 0, 0), randomness="different")

    def grads_of(p, x, y, frozen=None):
        return _float32(vg(p, frozen or {}, x, y), bf16)

    return grads_of


def _batch_grad_fn(model: nn.Module, loss_fn, bf16: bool = False):
    """Per-client gradient of the masked loss sum w.r.t. `p` (frozen tensors and `bf16` as in `_per_sample_grad_fn`)."""

    def masked_sum(p, frozen, x, y, m):
        out = _forward(model, {**p, **frozen}, x, bf16)
        return (loss_fn(out, y) * m).sum()

    vg = vmap(grad(masked_sum), in_dims=(0, 0, 0, 0, 0), randomness="different")

    def grads_of(p, x, y, m, frozen=None):
        return _float32(vg(p, frozen or {}, x, y, m), bf16)

    return grads_of
