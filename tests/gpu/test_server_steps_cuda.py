"""The server steps on CUDA against their CPU results (issue 67, item 3): same inputs, the step run on the CPU
and on the device, outputs compared. Marked `gpu`: skipped where CUDA is absent.

`DPFL_GPU_TEST_DEVICE=cpu` runs the same comparisons CPU against CPU (to check the tests themselves on a machine
without a GPU; every comparison is then exact).

Tolerances. Every step here computes in float64 (PCP, PFA's means and subspace, PFA+'s codes, T-tSVD at its
default prox dtype) except where a case says float32. cuBLAS/cuSOLVER sum in other orders than the CPU's LAPACK,
so each kernel differs by a few ulps (~1e-16 relative); a one-shot step (PFA, PFA+, T-tSVD, MR-MTL) then differs
by at most ~1e-13 relative, and 1e-10 leaves room while a real error (a wrong device, a dropped term, a mis-indexed
row) shows at 1e-3 or above. PCP iterates ~30 (growing mu) to ~1,000 times on a contractive map, so the rounding
does not grow beyond ~1e-12 (measured CPU torch against NumPy: 3e-15 to 1.3e-12, tests/algorithms/test_rpca_torch.py):
1e-8 for L and S, iteration count and rank equal (instances away from a rank or stopping boundary). Outputs cast to
float32 (a float32 model's update) may differ by one float32 ulp: 1e-6 relative.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from dpfl.algorithms.server import rpca, subspace, t_tsvd
from dpfl.algorithms.server.clustered.aggregator import ClusteredAggregator
from dpfl.algorithms.server.fedceo import FedCEO
from dpfl.algorithms.server.mean_regularized import MeanRegularized
from dpfl.algorithms.server.pfa import PFA
from dpfl.algorithms.server.pfa_plus import PFAPlus
from dpfl.algorithms.server.robust_hdp import RobustHDP, last_weights
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs

DEVICE = os.environ.get("DPFL_GPU_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE != "cpu" and not torch.cuda.is_available(), reason="needs CUDA")]

F64 = 1e-10  # one-shot float64 steps
PCP = 1e-8  # the iterated PCP
F32 = 1e-6  # outputs in float32


def _dev(tree):
    """`tree` (a tensor, or a dict of them) on the device under test."""
    if isinstance(tree, dict):
        return {k: _dev(v) for k, v in tree.items()}
    return tree.to(DEVICE)


def _close(got, want, rel):
    """max |got - want| <= rel max |want| for tensors or dicts of them; `got` must be on the device under test."""
    if isinstance(want, dict):
        assert set(got) == set(want)
        for k in want:
            _close(got[k], want[k], rel)
        return
    assert got.device.type == torch.device(DEVICE).type, got.device
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.detach().cpu().double(), want.detach().double()
    scale = max(float(w.abs().max()), 1e-300) if w.numel() else 1.0
    err = float((g - w).abs().max()) if w.numel() else 0.0
    assert err <= rel * scale, (err / scale, rel)


def _low_rank_plus_sparse(seed, m, n):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, 3)))
    v, _ = np.linalg.qr(rng.standard_normal((n, 3)))
    low = (u * np.array([5.0, 3.0, 2.0])) @ v.T
    return torch.from_numpy(low + np.where(rng.random((m, n)) < 0.05, rng.normal(0, 3, (m, n)), 0.0))


# ---- PCP / Robust-HDP ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2_000, 20), (20, 2_000), (150, 120)])  # tall (fused sweep), wide, dense
@pytest.mark.parametrize("mu_growth", [rpca.MU_GROWTH, 1.0])
def test_pcp_on_cuda_equals_cpu(shape, mu_growth):
    M = _low_rank_plus_sparse(1, *shape)
    L, S, info = rpca.pcp(M, mu_growth=mu_growth, max_iter=3_000)
    Ld, Sd, info_d = rpca.pcp(_dev(M), mu_growth=mu_growth, max_iter=3_000)
    assert (info_d.iterations, info_d.converged, info_d.rank) == (info.iterations, info.converged, info.rank)
    _close(Ld, L, PCP)
    _close(Sd, S, PCP)


def test_pcp_float32_on_cuda_runs_in_float32():
    M = _low_rank_plus_sparse(2, 1_000, 10)
    L, S, info = rpca.pcp(_dev(M), dtype=torch.float32, max_iter=200)
    assert L.dtype == S.dtype == torch.float32 and L.device.type == torch.device(DEVICE).type


def test_robust_hdp_on_cuda_equals_cpu():
    rng = np.random.default_rng(0)
    k, p = 12, 30_000
    s2 = np.r_[np.full(4, 1.0), np.full(8, 0.01)] * rng.uniform(1.0, 2.0, k)
    u = 0.1 * rng.standard_normal(p) + rng.standard_normal((k, p)) * np.sqrt(s2)[:, None]
    uploads = {"a": torch.from_numpy(u[:, :20_000]).float().reshape(k, 100, 200),
               "b": torch.from_numpy(u[:, 20_000:]).float()}
    glob = {"a": torch.zeros(100, 200), "b": torch.zeros(10_000)}
    view = ServerView.simple([100] * k)
    agg = RobustHDP(p_prime=20_000)  # two row blocks
    cpu = agg.update(agg.init(glob), glob, uploads, RoundInputs(view, seed=0, round_=0))
    dev = agg.update(agg.init(_dev(glob)), _dev(glob), _dev(uploads), RoundInputs(view, seed=0, round_=0))
    w, wd = last_weights(cpu.state), last_weights(dev.state)
    assert wd.device.type == "cpu"  # the state is host-side
    torch.testing.assert_close(wd, w, rtol=PCP, atol=0)
    _close(dev.params, cpu.params, F32)
    assert dev.metrics["pcp_iterations"] == cpu.metrics["pcp_iterations"]


# ---- PFA / PFA+ -------------------------------------------------------------------------------------------------
def _pfa_view(k=8):
    eps = torch.tensor([4.0, 3.5, 3.0, 1.0, 0.8, 0.6, 0.5, 0.4][:k], dtype=torch.float64)
    return ServerView(torch.arange(k), torch.full((k,), 100), torch.full((k,), 8), eps,
                      torch.full((k,), 1e-5, dtype=torch.float64), float(k))


def _uploads(k, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(k, 30, 40, generator=g, dtype=dtype), "b": torch.randn(k, 40, generator=g, dtype=dtype)}


@pytest.mark.parametrize("kw", [
    {}, {"k": 2}, {"svd_solver": "lanczos", "k": 2}, {"subspace": "random", "k": 3}, {"subspace": "second-moment"},
    {"subspace": "mean-outer"}, {"scope": "model", "k": 2}])
def test_pfa_on_cuda_equals_cpu(kw):
    pfa, view = PFA(split="explicit", public_clients=(0, 1, 2), **kw), _pfa_view()
    ups = _uploads(8, 1)
    want = pfa.mean_update(ups, view, seed=3, round_=2)
    _close(pfa.mean_update(_dev(ups), view, seed=3, round_=2), want, F64)
    ups32 = {n: u.float() for n, u in ups.items()}  # float32 uploads: float64 inside, float32 out
    _close(pfa.mean_update(_dev(ups32), view, seed=3, round_=2), pfa.mean_update(ups32, view, seed=3, round_=2), F32)


def test_pfa_noise_passthrough_on_cuda_equals_cpu():
    pfa, view = PFA(split="explicit", public_clients=(0, 1, 2), k=2), _pfa_view()
    ups, noise = _uploads(8, 1), _uploads(8, 2)
    want = pfa.noise_passthrough(ups, noise, view, seed=0, round_=0)
    _close(pfa.noise_passthrough(_dev(ups), _dev(noise), view, seed=0, round_=0), want, F64)


def test_subspace_lanczos_on_cuda_equals_cpu():
    g = torch.Generator().manual_seed(5)
    A = torch.randn(6, 5_000, generator=g, dtype=torch.float64)
    V = subspace.top_right_singular_lanczos(A, 3, 64, torch.Generator().manual_seed(9))
    Vd = subspace.top_right_singular_lanczos(_dev(A), 3, 64, torch.Generator().manual_seed(9))
    _close(Vd, V, F64)


def test_pfa_plus_two_rounds_on_cuda_equal_cpu():
    """Round 1 (warm-up: full uploads), round 2 (private clients send codes on the round-1 subspace)."""
    plus, view = PFAPlus(PFA(split="explicit", public_clients=(0, 1, 2), k=2)), _pfa_view()

    def rounds(to):
        state = plus.init({})
        outs = []
        for r in range(2):
            ups = to(_uploads(8, 10 + r))
            payload = plus.client_payload(state, ups, view, seed=0)
            mean, state = plus.mean_update(state, payload, view, seed=0, round_=r)
            outs.append((mean, payload.codes))
        return outs, state

    (want, state), (got, state_d) = rounds(lambda t: t), rounds(_dev)
    for (m, c), (md, cd) in zip(want, got, strict=True):
        _close(md, m, F64)
        _close(cd, c, F32)  # the codes are float32 (what a client sends)
    _close({n: d["V"] for n, d in state_d["previous"].items()}, {n: d["V"] for n, d in state["previous"].items()}, F64)


# ---- T-tSVD / FedCEO --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prox_dtype, rel", [("float64", F64), ("float32", 1e-4)])
def test_fedceo_smoothing_on_cuda_equals_cpu(prox_dtype, rel):
    """float32 SVT: the device's and the host's float32 kernels each carry ~1e-6 relative error, amplified near a
    threshold; 1e-4 is the float32 tolerance of tests/algorithms/test_t_tsvd.py's float32-against-float64 check."""
    step = FedCEO(lam=0.5, prox_dtype=prox_dtype)
    ups = _uploads(10, 4, torch.float32)
    glob = {n: torch.zeros(u.shape[1:]) for n, u in ups.items()}
    view = ServerView.simple([100] * 10)
    cpu = step.update(step.init(glob), glob, ups, RoundInputs(view, seed=0, round_=0))
    dev = step.update(step.init(_dev(glob)), _dev(glob), _dev(ups), RoundInputs(view, seed=0, round_=0))
    _close(dev.params, cpu.params, rel)
    for c, p in cpu.state["personal"].items():
        _close(dev.state["personal"][c], p, rel)


@pytest.mark.parametrize("rfft", [True, False])
def test_t_tsvd_on_cuda_equals_cpu(rfft):
    x = _uploads(9, 6)["w"]
    _close(t_tsvd.smooth_stack(_dev(x), 2.0, rfft=rfft), t_tsvd.smooth_stack(x, 2.0, rfft=rfft), F64)


# ---- MR-MTL and clustered ---------------------------------------------------------------------------------------
def test_mean_regularized_on_cuda_equals_cpu():
    step = MeanRegularized(6)
    glob = {"w": torch.randn(4, 3, generator=torch.Generator().manual_seed(0))}
    clients = [4, 1, 2]
    view = ServerView(torch.tensor(clients), torch.full((3,), 10), torch.ones(3, dtype=torch.int64),
                      torch.full((3,), 1.0, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), 3.0)
    ups = {"w": torch.randn(3, 4, 3, generator=torch.Generator().manual_seed(1))}

    def run(to):
        starts, state = step.start_points(step.init(to(glob)), to(glob), clients, 0)
        return step.update(state, to(glob), to(ups), RoundInputs(view, seed=0, round_=0, starts=starts))

    cpu, dev = run(lambda t: t), run(_dev)
    _close(dev.params, cpu.params, F32)
    _close(dev.state["personal"], cpu.state["personal"], F32)


def test_clustered_round_1_and_cluster_means_on_cuda_equal_cpu():
    """R-DPCFL: round 1 clusters the uploads (GMM on the host), round 2 moves each cluster model by its mean."""
    gen = torch.Generator().manual_seed(2)
    centres = torch.tensor([[3.0] * 20, [-3.0] * 20])
    ups1 = {"w": centres[torch.arange(8) % 2] + 0.1 * torch.randn(8, 20, generator=gen)}
    ups2 = {"w": torch.randn(8, 20, generator=gen)}
    glob = {"w": torch.zeros(20)}
    view = ServerView.simple([50] * 8)
    agg = ClusteredAggregator("rdpcfl", 8, 20, seed=1, eps_sel=0.5, n_clusters=2)

    def run(to):
        starts, state = agg.start_points(agg.init(to(glob)), to(glob), list(range(8)), 0)
        first = agg.update(state, to(glob), to(ups1), RoundInputs(view, seed=0, round_=0, starts=starts))
        starts, state = agg.start_points(first.state, first.params, list(range(8)), 1)
        return first, agg.update(state, first.params, to(ups2), RoundInputs(view, seed=0, round_=1, starts=starts))

    (c1, c2), (d1, d2) = run(lambda t: t), run(_dev)
    assert torch.equal(d1.state["posteriors"].cpu(), c1.state["posteriors"])
    assert d2.metrics["clusters"] == c2.metrics["clusters"]
    _close(d2.state["models"], c2.state["models"], F32)
    _close(d2.params, c2.params, F32)
