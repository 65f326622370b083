"""benchmarks/engine.py's vectorised non-private baseline (issue 67, item 4) is the right one: on dpfl's own batches
(Poisson with clients of different batch sizes and empty batches, or fixed-size) it gives every client the
parameters of a plain per-client SGD loop on those batches, and the parameters of dpfl's engine run without privacy;
a loop on other batches differs, so the comparison can fail. The JSON carries `dp_overhead_vs_vectorised_nonprivate`
as dpfl's time over the baseline's. Nothing is timed: the sizes are tiny and only the arithmetic is checked."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from dpfl.engine.pooled import PooledData
from dpfl.models import build_model

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    if str(BENCH) not in sys.path:  # engine.py imports bench_common from its own folder
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_engine", BENCH / "engine.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_engine"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _setup(bench, n_clients=3, samples=40):
    xs, ys, source, _ = bench.load_client_data(n_clients, samples, seed=0, shape=(1, 28, 28), source="synthetic")
    assert source == "synthetic"
    model = build_model("cnn_pfa", (1, 28, 28), 10, seed=0).train()
    return model, PooledData.from_clients(xs, ys)


def _plain_loop(bench, model, data, client, batches):
    """Client `client` alone: its own model copy, torch.optim.SGD on the mean loss of each non-empty batch."""
    local = copy.deepcopy(model)
    opt = torch.optim.SGD(local.parameters(), lr=bench.LR)
    x, y = data.client(client)
    for idx in batches:
        if len(idx):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(local(x[idx]), y[idx]).backward()
            opt.step()
    return dict(local.named_parameters())


# batch 1 of 40 records under Poisson: empty batches (p = 0.36 per step); batch 6: clients of different sizes padded
@pytest.mark.parametrize("sampling, batch", [("poisson", 1), ("poisson", 6), ("fixed", 5)])
def test_baseline_is_a_plain_loop_on_dpfl_batches(bench, sampling, batch):
    model, data = _setup(bench)
    steps, clients = 4, [0, 1, 2]
    info: dict = {}
    _, got = bench.run_vectorised_nonprivate(model, data, len(clients), steps, batch, sampling=sampling, info=info)
    batches = bench.draw_batches(data, clients, steps, batch, sampling)
    sizes = [[len(i) for i in step] for step in batches]
    if sampling == "poisson":  # the cases this test is for do occur with these seeds
        assert any(len(set(s)) > 1 for s in sizes) and info["padded_slots"] > info["records"]
        if batch == 1:
            assert any(0 in s for s in sizes)
    else:
        assert info["padded_slots"] == info["records"] == steps * batch * len(clients)
    assert info["records"] == sum(map(sum, sizes))
    # float32, a handful of steps: the batched (grouped) convolution sums in another order than one client's
    # (measured ~3e-8 relative); a wrong batch, client or mean would be off by orders of magnitude more
    for c in clients:
        want = _plain_loop(bench, model, data, c, [step[c] for step in batches])
        for name, w in want.items():
            torch.testing.assert_close(got[name][c], w.detach(), rtol=1e-5, atol=1e-6)
    # the same as dpfl's engine without privacy, which draws its batches itself
    _, dpfl_np = bench.run_dpfl(model, data, len(clients), steps, batch, noise=0.0, clip=None, sampling=sampling)
    for name, t in dpfl_np.items():
        torch.testing.assert_close(got[name], t, rtol=1e-5, atol=1e-6)
    # the control: client 0 on the batches of another seed is far from the baseline's client 0
    other = bench.draw_batches(data, [0], steps, batch, sampling, seed=1)
    moved = _plain_loop(bench, model, data, 0, [step[0] for step in other])
    assert max(float((moved[n].detach() - got[n][0]).abs().max()) for n in moved) > 1e-3


def test_reference_loop_is_the_plain_loop(bench):
    model, data = _setup(bench, n_clients=1)
    batches = [b[0] for b in bench.draw_batches(data, [0], 3, 6)]
    got = bench.reference_loop_on_batches(model, data, 0, batches)
    for name, w in _plain_loop(bench, model, data, 0, batches).items():
        torch.testing.assert_close(got[name], w.detach(), rtol=0, atol=0)


def test_json_reports_the_overhead_against_the_baseline(bench, capsys):
    threads = torch.get_num_threads()
    try:
        code = bench.main(["--json", "--clients", "3", "--steps", "3", "--samples", "30", "--batch", "4",
                           "--repeats", "1", "--data", "synthetic", "--skip-opacus", "--loop-clients", "2"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    r = json.loads(capsys.readouterr().out)
    assert r["dp_overhead_vs_vectorised_nonprivate"] == pytest.approx(
        r["dpfl_seconds"] / r["vectorised_nonprivate_seconds"])
    assert r["dp_overhead_vs_dpfl_nonprivate"] == pytest.approx(r["dpfl_seconds"] / r["dpfl_nonprivate_seconds"])
    assert r["speedup_vs_nonprivate_loop"] == pytest.approx(r["nonprivate_loop_seconds"] / r["dpfl_seconds"])
    assert r["opacus_seconds"] is None and r["speedup_vs_opacus"] is None and r["errors"] is None
    assert (r["data"], r["device"], r["loop_clients"], r["loops_extrapolated"]) == ("synthetic", "cpu", 2, True)
    assert 0 <= r["vectorised_nonprivate_padding_fraction"] < 1
    assert r["sanity"]["ok"]
    assert r["sanity"]["vectorised_nonprivate_vs_loop_on_same_batches_max_rel_diff"] <= bench.SAME_BATCHES_RTOL


@pytest.mark.parametrize("argv", [["--device", "tpu"], ["--device", "nonsense"],
                                  ["--clients", "3", "--loop-clients", "5"],
                                  ["--sampling", "fixed", "--batch", "2000"]])
def test_bad_options_are_refused(bench, argv):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
