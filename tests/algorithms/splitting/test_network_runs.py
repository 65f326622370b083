"""fedsplit / fedpi / fedrp in the federated round loop (networks trained by the engine)."""

import dp_accounting as dpa
import pytest
import torch

from dpfl.algorithms.server.splitting import AndersonII, presets
from dpfl.algorithms.server.splitting.aggregator import EngineOperator, SplittingAggregator
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs
from dpfl.experiment.build import build_algorithm, build_run
from dpfl.experiment.config import ConfigError, validate_config


def config(algorithm="fedpi", rounds=4, clients=4, privacy=None, selection=None, **params):
    params = params if algorithm in ("fedavg", "fedprox") else {"eta": 0.5, **params}
    return validate_config({
        "name": "split", "seed": 3, "data": {"dataset": "digits", "clients": clients, "partition": "iid"},
        "model": {"name": "logr"}, "algorithm": {"name": algorithm, "params": params},
        "training": {"rounds": rounds, "local_steps": 3, "batch_size": 16, "optimizer": {"lr": 0.05},
                     "selection": selection or {"kind": "all"}},
        **({"privacy": privacy} if privacy else {}),
    })


def final_params(cfg):
    return build_run(cfg).run().params


def test_the_server_step_on_given_uploads_follows_the_scheme():
    w = {"a": torch.tensor([1.0, -2.0]), "b": torch.tensor([[0.5]])}
    agg = SplittingAggregator(presets.fedpi(0.1, local=EngineOperator("prox")), n_clients=3)
    g = torch.Generator().manual_seed(0)
    ups = {"a": torch.randn(3, 2, generator=g), "b": torch.randn(3, 1, 1, generator=g)}
    view = ServerView.simple([10, 10, 10])
    starts, state = agg.start_points(agg.init(w), w, [0, 1, 2], 0)
    assert all(torch.equal(starts[n], w[n].expand_as(starts[n])) for n in w)  # u^0 = the initial model
    step = agg.update(state, w, ups, RoundInputs(view, 0, 0, starts=starts))
    new = step.params
    u0 = torch.cat([w["a"], w["b"].flatten()]).double()
    L = u0 + torch.cat([ups["a"], ups["b"].flatten(1)], 1).double()  # L_i(u_i) = u_i + upload_i
    z = 2 * L - u0  # alpha = 2
    xbar = z.mean(0)
    assert torch.allclose(torch.cat([new["a"], new["b"].flatten()]).double(), xbar, atol=1e-6)
    u1 = 0.5 * u0 + 0.5 * (2 * xbar - z)  # gamma = 1/2, beta = 2
    nxt, _ = agg.start_points(step.state, new, [0, 2], 1)
    assert torch.allclose(torch.cat([nxt["a"], nxt["b"].flatten(1)], 1).double(), u1[[0, 2]], atol=1e-6)
    assert torch.allclose(step.state["u"], u1) and torch.allclose(step.state["xbar"], xbar)  # the scheme's state
    assert step.metrics == {"eta": 0.1, "residual": step.metrics["residual"], "anderson": "plain",
                            "anderson_fallbacks": 0}


def _states_equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_states_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("preset", ["fedpi", "fedpi_admm"])
def test_the_server_step_is_a_function_of_the_state_passed_in(preset):
    """Replaying a round from its state after later rounds ran gives that round again, `update` leaves the state it
    is given unchanged, and a checkpoint read back (weights_only) or written before round 1 (None) continues the
    same: the Anderson window and its running fallback count (forced here: pi_max < 1) live in the state."""
    import copy
    import io

    anderson = {} if preset == "fedpi_admm" else {"anderson": AndersonII(1, safeguard=True, pi_max=0.5)}
    agg = SplittingAggregator(presets.make(preset, 0.3, EngineOperator("prox"), ergodic=True, **anderson),
                              n_clients=3, noisy=True)
    w = {"a": torch.tensor([1.0, -2.0]), "b": torch.tensor([[0.5]])}
    g = torch.Generator().manual_seed(0)
    uploads = [{"a": torch.randn(3, 2, generator=g), "b": torch.randn(3, 1, 1, generator=g)} for _ in range(4)]
    view = ServerView.simple([10, 10, 10])

    def round_(state, params, r):
        starts, state = agg.start_points(state, params, [0, 1, 2], r)
        before = copy.deepcopy(state)
        step = agg.update(state, params, uploads[r], RoundInputs(view, 0, r, starts=starts))
        assert _states_equal(state, before)  # the state passed in is unchanged
        return step

    states, params, steps = [agg.init(w)], [w], []
    for r in range(4):
        steps.append(round_(states[-1], params[-1], r))
        states.append(steps[-1].state)
        params.append(steps[-1].params)
    if preset == "fedpi":
        assert [s.metrics["anderson_fallbacks"] for s in steps] == [0, 1, 2, 3]
    again = round_(states[2], params[2], 2)  # round 3 again, after round 4 ran
    assert _states_equal(again.params, steps[2].params) and _states_equal(again.state, steps[2].state)
    assert again.metrics == steps[2].metrics

    buffer = io.BytesIO()
    torch.save(states[2], buffer)
    buffer.seek(0)
    resumed = round_(torch.load(buffer, weights_only=True), params[2], 2)
    assert _states_equal(resumed.params, steps[2].params) and resumed.metrics == steps[2].metrics
    first = round_(None, w, 0)  # a checkpoint written before round 1 holds None: the state of the initial model
    assert _states_equal(first.state, steps[0].state) and first.metrics == steps[0].metrics


def test_the_local_program_is_the_prox_objective_from_the_clients_own_start():
    alg = build_algorithm(config(eta=0.25))
    assert alg.local.spec.prox_mu == pytest.approx(4.0)  # f_i + ||x - u_i||^2 / (2 eta)
    assert isinstance(alg.aggregator, SplittingAggregator) and alg.aggregator.n_clients == 4


def test_modes_give_the_same_model_and_memory_0_is_plain():
    base = final_params(config())
    decentral = final_params(config(mode="decentralized"))
    tau0 = final_params(config(anderson={"memory": 0}))
    for n in base:
        assert torch.allclose(base[n], decentral[n], atol=1e-6)
        assert torch.equal(base[n], tau0[n])
    accelerated = final_params(config(anderson={"memory": 2}))
    assert any(not torch.allclose(base[n], accelerated[n]) for n in base)


def test_a_resumed_run_equals_an_uninterrupted_one():
    cfg = config(rounds=4, anderson={"memory": 2}, selection={"kind": "fixed", "k": 3})
    whole = build_run(cfg).run()
    states = []
    first = build_run(cfg)
    first.run(on_checkpoint=states.append, checkpoint_every=2)
    after_two = next(s for s in states if s.round == 2)
    resumed = build_run(cfg).run(state=after_two)
    for n in whole.params:
        assert torch.equal(whole.params[n], resumed.params[n])
    assert [r["residual"] for r in whole.history] == [r["residual"] for r in resumed.history]


def test_udp_uploads_carry_one_unsplit_gaussian_each():
    cfg = config(privacy={"mechanism": "udp", "clip": 1.0, "noise_multiplier": 2.0,
                          "budgets": 50.0, "delta": 1e-5}, rounds=2)
    result = build_run(cfg).run()
    entries = result.ledger.entries(0)
    assert [e.event for e in entries] == [dpa.GaussianDpEvent(2.0)] * 2  # not sigma / sqrt(K)
    assert all(row["label"] == "no guarantee of convergence under noise" for row in result.history)


@pytest.mark.parametrize("change, match", [
    (dict(eta=0), "algorithm.params.eta"),
    (dict(anderson={"memory": -1}), "algorithm.params.anderson.memory"),
    (dict(mode="decentralized", selection={"kind": "fixed", "k": 2}), "decentralized mode with partial participation"),
    (dict(anderson={"memory": 2, "scope": "global"}), "scope 'global'"),
])
def test_bad_splitting_configs_are_one_line(change, match):
    with pytest.raises(ConfigError, match=match) as err:
        build_algorithm(config(**change))
    assert "\n" not in str(err.value)


def test_udp_noise_is_calibrated_from_the_budgets_when_not_given():
    cfg = config(privacy={"mechanism": "udp", "clip": 1.0, "budgets": 8.0, "delta": 1e-5}, rounds=3)
    run = build_run(cfg)
    result = run.run()
    z = run.algorithm.upload.noise_multiplier
    assert z is not None and z > 0 and run.algorithm.upload.cohort == 1
    spent = result.ledger.spent_all()
    assert max(spent.values()) <= 8.0 + 1e-6 and max(spent.values()) > 7.0  # every client takes part every round


@pytest.mark.parametrize("params, match", [
    ("{eta: 0}", "algorithm.params.eta"),
    ("{eta: 0.5, anderson: {memory: -2}}", "algorithm.params.anderson.memory"),
    ("{eta: 0.5, preset: x}", "algorithm.params.preset"),
])
def test_dpfl_run_refuses_bad_splitting_params_in_one_line(tmp_path, params, match):
    from cli_runner import cli

    path = tmp_path / "c.yaml"
    path.write_text("name: s\ndata: {dataset: digits, clients: 3}\nmodel: {name: logr}\n"
                    f"algorithm: {{name: fedpi, params: {params}}}\n"
                    "training: {rounds: 1, local_steps: 1, batch_size: 8, optimizer: {lr: 0.1}}\n")
    code, _, err = cli("run", path, "--out", tmp_path / "out")
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("algorithm, params", [("fedavg", {}), ("fedprox", {"mu": 2.0})])
def test_fedavg_and_fedprox_with_anderson_0_are_dpfls_own_algorithms(algorithm, params):
    """The splitting presets fedavg / fedprox (beta = gamma = 1) on the engine are the plain mean of the uploads,
    also under partial participation (xbar = the participants' mean), so tau = 0 must give dpfl's model."""
    for selection in ({"kind": "all"}, {"kind": "fixed", "k": 2}):
        plain = final_params(config(algorithm, selection=selection, **params))
        split_cfg = config(algorithm, selection=selection, **params, anderson={"memory": 0})
        assert isinstance(build_algorithm(split_cfg).aggregator, SplittingAggregator)
        split = final_params(split_cfg)
        for n in plain:
            assert torch.allclose(plain[n], split[n], atol=1e-6), (algorithm, selection, n)


def test_fedprox_with_anderson_runs_the_prox_preset_and_changes_the_iterates():
    alg = build_algorithm(config("fedprox", mu=2.0, anderson={"memory": 2, "scope": "global"}))
    scheme = alg.aggregator.scheme
    assert (scheme.name, scheme.schedule.eta0, alg.local.spec.prox_mu) == ("fedprox", 0.5, 2.0)
    plain = final_params(config("fedprox", mu=2.0))
    accelerated = final_params(config("fedprox", mu=2.0, anderson={"memory": 2, "scope": "global"}))
    assert any(not torch.allclose(plain[n], accelerated[n]) for n in plain)


@pytest.mark.parametrize("params, match", [
    ({"anderson": {"memory": 2}, "weighting": "samples"}, "averages uniformly"),
    ({"anderson": {"memory": 2}, "server_lr": 0.5}, "averages uniformly"),
])
def test_anderson_on_fedavg_needs_the_plain_uniform_average(params, match):
    with pytest.raises(ConfigError, match=match) as err:
        build_algorithm(config("fedavg", **params))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("algorithm, params, field, values", [
    ("fedpi", {"eta": 0.5, "schedule": "exp_halving", "period": 2}, "prox_mu", [2.0, 2.0, 4.0, 4.0]),
    ("fedprox", {"mu": 2.0, "schedule": "inv_t"}, "prox_mu", [2.0, 4.0, 6.0, 8.0]),
    ("fedavg", {"schedule": "inv_t"}, "lr", [0.05, 0.025, 0.05 / 3, 0.0125]),
])
def test_a_schedule_drives_the_local_program_and_the_server_step(algorithm, params, field, values):
    """eta_t is the prox step (mu_t = 1/eta_t) of prox presets and the local learning rate of fedavg (§6); the
    engine runs round t with that spec and the server logs the same eta_t."""
    run = build_run(config(algorithm, **params))
    local = run.algorithm.local
    assert [getattr(local.spec_at(t), field) for t in range(4)] == pytest.approx(values)
    with pytest.raises(ValueError, match="round 4 has no local spec"):
        local.spec_at(4)
    result = run.run()
    etas = [row["eta"] for row in result.history]
    expected = values if field == "lr" else [1.0 / v for v in values]
    assert etas == pytest.approx(expected)
    constant = final_params(config(algorithm, **{k: v for k, v in params.items() if k not in ("schedule", "period")},
                                   **({"anderson": {"memory": 0}} if algorithm != "fedpi" else {})))
    assert any(not torch.allclose(constant[n], result.params[n]) for n in constant)
