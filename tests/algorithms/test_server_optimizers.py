"""Server optimizers on the aggregate (issue 68 item 2; `dpfl.algorithms.server.optimizers`): each optimizer against
Reddi et al.'s Algorithm 2 on hand-computed rounds, the wrapper with a no-op optimizer bit-identical to the step it
wraps (FedAvg and central DP), its state through a stopped-and-resumed run, where it is refused, and the config key."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import dpfl.algorithms
from algorithms.test_catalog import BUILT_BY_FACTORY, _config, _network
from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.context import RunFacts
from dpfl.algorithms.client.program import sgd
from dpfl.algorithms.server.clustered.aggregator import ClusteredAggregator
from dpfl.algorithms.server.mean_regularized import MeanRegularized
from dpfl.algorithms.server.optimizers import (OptimizedServerStep, ServerOptimizer, fedadagrad, fedadam, fedavgm,
                                               fedyogi, refusal, unwrapped)
from dpfl.algorithms.stages import RoundInputs, ServerStep, ServerUpdate
from dpfl.experiment.build import build_algorithm, build_run
from dpfl.experiment.config import ConfigError, config_to_yaml, load_config, validate_config
from dpfl.experiment.config.yaml_io import parse_yaml
from dpfl.experiment.run_directory import execute
from same_state import same_state
from stopped_run import stop_in_round
from untimed import untimed

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"


# ---- the update rules on hand-computed rounds ---------------------------------------------------------------------
class FixedDeltas(ServerStep):
    """A server step whose round r moves the model by DELTAS[r] (the pseudo-gradients the optimizer sees)."""

    def update(self, state: Any, params: Any, uploads: Any, inputs: RoundInputs) -> ServerUpdate:
        return ServerUpdate({"w": params["w"] + DELTAS[inputs.round_]}, state, {"inner_metric": inputs.round_})


# two coordinates; the second makes FedYogi's sign(v - Delta^2) positive in round 2 (v > Delta^2: v shrinks)
DELTAS = [torch.tensor([0.1, 0.3], dtype=torch.float64), torch.tensor([-0.2, 0.01], dtype=torch.float64),
          torch.tensor([0.05, 0.0], dtype=torch.float64)]


def _rounds(optimizer: ServerOptimizer) -> list[torch.Tensor]:
    step = OptimizedServerStep(FixedDeltas(), optimizer)
    w = {"w": torch.ones(2, dtype=torch.float64)}
    state, out = step.init(w), []
    for r in range(len(DELTAS)):
        before = json.dumps(str(state))
        up = step.update(state, w, None, RoundInputs(None, 0, r))  # type: ignore[arg-type]
        assert json.dumps(str(state)) == before  # the state passed in is not changed
        assert up.metrics["inner_metric"] == r  # the wrapped step's metrics pass through
        assert up.metrics["server_optimizer_delta_norm"] == pytest.approx(float(DELTAS[r].norm()), rel=1e-12)
        assert up.metrics["server_optimizer_step_norm"] == pytest.approx(float((up.params["w"] - w["w"]).norm()),
                                                                         rel=1e-9)
        assert up.state["optimizer"]["count"] == r + 1
        w, state = up.params, up.state
        out.append(w["w"].clone())
    return out


def _reference(name: str, lr: float, b1: float = 0.0, b2: float = 0.0, tau: float = 0.0,
               momentum: float = 0.0) -> list[np.ndarray]:
    """Algorithm 2 of Reddi et al. written out in NumPy: m_{-1} = 0, v_{-1} = tau^2."""
    x, m, v, out = np.ones(2), np.zeros(2), np.full(2, tau * tau), []
    for delta in (d.numpy() for d in DELTAS):
        if name == "fedavgm":
            m = momentum * m + delta
            x = x + lr * m
        else:
            m = b1 * m + (1 - b1) * delta
            if name == "fedadam":
                v = b2 * v + (1 - b2) * delta**2
            elif name == "fedyogi":
                v = v - (1 - b2) * delta**2 * np.sign(v - delta**2)
            else:
                v = v + delta**2
            x = x + lr * m / (np.sqrt(v) + tau)
        out.append(x.copy())
    return out


# the first coordinate's x_1, x_2, x_3 from x_0 = 1, Delta = 0.1, -0.2, 0.05, by hand (see each line's comment)
HAND = {
    # m = 0.1 -> 1.1; m = 0.9 * 0.1 - 0.2 = -0.11 -> 0.99; m = -0.099 + 0.05 = -0.049 -> 0.941
    "fedavgm": (fedavgm(lr=1.0, momentum=0.9), [1.1, 0.99, 0.941]),
    # round 1: m = 0.01, v = 0.99e-6 + 0.01 * 0.01 = 1.0099e-4, x = 1 + 0.1 * 0.01 / (sqrt(v) + 1e-3) = 1.0905028...
    "fedadam": (fedadam(lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3), [1.090502831185222, 1.0434142633799188,
                                                                  1.0228286890955351]),
    # round 1: v = 1e-6 < Delta^2, so v = 1e-6 + 0.01 * 0.01 = 1.01e-4, x = 1 + 0.01 * 0.01 / (sqrt(v) + 1e-3)
    "fedyogi": (fedyogi(lr=0.01, beta1=0.9, beta2=0.99, tau=1e-3), [1.0090498756211208, 1.004345609178289,
                                                                    1.0022983714559355]),
    # round 1: m = Delta (b1 = 0), v = 1e-6 + 0.01, x = 1 + 0.1 * 0.1 / (0.100005 + 1e-3) = 1.0990049998...
    "fedadagrad": (fedadagrad(lr=0.1, beta1=0.0, tau=1e-3), [1.0990049998750062, 1.0099613863522956,
                                                            1.0316881451062292]),
}


@pytest.mark.parametrize("name", list(HAND))
def test_each_optimizer_follows_its_update_rule_on_hand_computed_rounds(name):
    optimizer, hand = HAND[name]
    got = _rounds(optimizer)
    assert [float(x[0]) for x in got] == pytest.approx(hand, rel=1e-13, abs=0)
    ref = _reference(name, optimizer.lr, optimizer.beta1 or 0.0, optimizer.beta2 or 0.0, optimizer.tau or 0.0,
                     optimizer.momentum or 0.0)
    for x, y in zip(got, ref, strict=True):
        np.testing.assert_allclose(x.numpy(), y, rtol=1e-13, atol=0)


def test_fedyogi_shrinks_v_where_it_exceeds_the_squared_delta_unlike_fedadam():
    """The second coordinate in round 2: v_1 = 1e-6 + 0.01 * 0.09 = 9.01e-4 > Delta^2 = 1e-4, so Yogi's v falls by
    (1 - b2) Delta^2 = 1e-6 to 9.0e-4, while Adam's moves towards Delta^2: 0.99 v_1 + 1e-6 = 8.9299e-4."""
    w = {"w": torch.ones(2, dtype=torch.float64)}
    for optimizer, v2 in ((fedyogi(), 9.0e-4), (fedadam(), 0.99 * (0.99e-6 + 0.01 * 0.09) + 0.01 * 1e-4)):
        state = optimizer.init(w)
        for r in range(2):
            w_new = {"w": w["w"] + DELTAS[r]}
            _, state, _ = optimizer.step(state, w, w_new)
        assert float(state["v"]["w"][1]) == pytest.approx(v2, rel=1e-12)


def test_the_optimizer_state_is_plain_tensors_that_a_safe_load_reads(tmp_path):
    step = OptimizedServerStep(FixedDeltas(), fedadam())
    w = {"w": torch.ones(2, dtype=torch.float64)}
    state = step.update(step.init(w), w, None, RoundInputs(None, 0, 0)).state  # type: ignore[arg-type]
    torch.save(state, tmp_path / "s.pt")
    assert same_state(torch.load(tmp_path / "s.pt", weights_only=True), state)
    assert set(state["optimizer"]) == {"m", "v", "count"}


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "fedadam", "lr": 0.0, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}, "lr must be > 0"),
    ({"name": "fedadam", "lr": 0.1, "beta1": 1.0, "beta2": 0.99, "tau": 1e-3}, r"beta1 must be in \[0, 1\)"),
    ({"name": "fedyogi", "lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 0.0}, "tau must be > 0"),
    ({"name": "fedavgm", "lr": 1.0, "momentum": 0.9, "tau": 1e-3}, "does not use tau"),
    ({"name": "fedadagrad", "lr": 1.0, "beta1": 0.0}, "tau is required"),
    ({"name": "sgd", "lr": 1.0}, "must be one of fedavgm"),
])
def test_bad_optimizer_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ServerOptimizer(**kwargs)


# ---- the wrapper keeps the wrapped step ---------------------------------------------------------------------------
def test_the_wrapper_overrides_every_ability_of_a_server_step():
    """Every optional ability and class flag of `ServerStep` is the wrapped step's: none falls back to the base
    class's neutral default (a new ability added to ServerStep must be delegated too)."""
    names = {n for n in vars(ServerStep) if not n.startswith("_")} - {"aggregate"}
    assert names - set(vars(OptimizedServerStep)) == set()


DIGITS_CENTRAL: dict[str, Any] = {
    "name": "opt-central", "seed": 0,
    "data": {"dataset": "digits", "clients": 10, "partition": "iid"},
    "model": {"name": "logr"},
    "algorithm": {"name": "dp_fedavg_central"},
    "training": {"rounds": 3, "local_epochs": 1, "batch_size": 32, "optimizer": {"lr": 1.0},
                 "selection": {"kind": "fixed", "k": 5}},
    "privacy": {"mechanism": "central", "clip": 1.0, "budgets": 5.0},
}
NO_OP = {"name": "fedavgm", "lr": 1.0, "momentum": 0.0}


def _without_optimizer_metrics(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return untimed([{k: v for k, v in row.items() if not k.startswith("server_optimizer_")} for row in rows])


@pytest.mark.parametrize("base", ["demo", "central"])
def test_a_no_op_optimizer_gives_the_wrapped_steps_rounds_bit_for_bit(base, tmp_path):
    """FedAvgM with momentum 0 and lr 1 moves by Delta_t itself: the same models, rows and privacy report as the
    step alone (DP-FedAvg with DP-SGD clients; central DP, whose noise is calibrated through the wrapper)."""
    def cfg(optimizer: dict[str, Any] | None):
        if base == "demo":
            sets = ["training.rounds=3", "evaluation.every=1"]
            if optimizer is not None:
                sets.append(f"algorithm.server_optimizer={json.dumps(optimizer)}")
            return load_config(DEMO, sets)
        return validate_config({**DIGITS_CENTRAL, "algorithm": {"name": "dp_fedavg_central",
                                                                "server_optimizer": optimizer}})

    plain, wrapped = build_run(cfg(None)), build_run(cfg(NO_OP))
    assert isinstance(wrapped.algorithm.aggregator, OptimizedServerStep)
    for what in ("unit", "observer", "mechanism", "central", "accounted"):
        assert getattr(wrapped.algorithm, what) == getattr(plain.algorithm, what), what
    a, b = plain.run(), wrapped.run()
    assert a.params.keys() == b.params.keys()
    assert all(torch.equal(a.params[n], b.params[n]) for n in a.params)
    assert _without_optimizer_metrics(b.history) == untimed(a.history)
    assert all(row["server_optimizer_step_norm"] == row["server_optimizer_delta_norm"] for row in b.history)
    assert untimed(b.privacy.to_dict()) == untimed(a.privacy.to_dict())


def test_central_dp_stays_central_dp_under_an_optimizer():
    """The optimizer post-processes the noised aggregate: the run is charged as central DP, its noise calibrated."""
    run = build_run(validate_config({**DIGITS_CENTRAL, "algorithm": {"name": "dp_fedavg_central",
                                                                     "server_optimizer": {"name": "fedadam"}}}))
    alg = run.algorithm
    assert alg.central and alg.unit == "client" and unwrapped(alg.aggregator).noise_multiplier > 0
    assert alg.aggregator.noise_multiplier == unwrapped(alg.aggregator).noise_multiplier  # read through
    assert "server-side Gaussian" in alg.mechanism


# ---- kill and resume -------------------------------------------------------------------------------------------
FEDADAM_SETS = ["training.rounds=4", "evaluation.every=1", "checkpoint.every=1",
                "algorithm.server_optimizer={name: fedadam, lr: 0.01}"]


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_stopped_fedadam_run_resumes_to_the_uninterrupted_result(tmp_path):
    execute(load_config(DEMO, FEDADAM_SETS), tmp_path / "whole")
    stop_in_round(load_config(DEMO, FEDADAM_SETS), tmp_path / "stopped", 3)
    state = torch.load(tmp_path / "stopped" / "checkpoint.pt", weights_only=True)  # what resume reads
    assert state["round"] == 2
    opt = state["aggregator_state"]["optimizer"]
    assert opt["count"] == 2 and set(opt) == {"m", "v", "count"}
    assert all(float(t.abs().sum()) > 0 for t in opt["m"].values())  # moved: a resume from m = 0 would differ
    execute(load_config(DEMO, FEDADAM_SETS), tmp_path / "stopped", resume=True)
    assert untimed(_rows(tmp_path / "stopped")) == untimed(_rows(tmp_path / "whole"))
    for name in ("summary.json", "privacy.json"):
        assert untimed(json.loads((tmp_path / "stopped" / name).read_text())) == untimed(
            json.loads((tmp_path / "whole" / name).read_text()))
    final = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)
    assert torch.equal(next(iter(final["params"].values())),
                       next(iter(torch.load(tmp_path / "stopped" / "checkpoint.pt",
                                            weights_only=True)["params"].values())))
    assert final["aggregator_state"]["optimizer"]["count"] == 4


# ---- where it is allowed ---------------------------------------------------------------------------------------
# post-processing of one released global model
ALLOWED = {"fedavg", "dp_fedavg_local", "dp_fedavg_central", "udp_fedavg", "noisy_fedavg", "noisy_fedprox",
           "fedprox", "weiavg", "min_eps", "max_eps", "oracle", "pfa", "pfa_plus", "robust_hdp", "mp_cdp", "tp_smc",
           "fedsgd"}
# personal or cluster models, the splitting scheme's iterates, MP-DP's perturbed broadcast
REFUSED = {"fedceo": "personal or cluster models", "ppsgd": "personal part", "centaur": "personal part",
           "fedsplit": "its own iterates", "fedpi": "its own iterates", "fedrp": "its own iterates",
           "mpdp": "perturbed model", "mpdp_naive": "perturbed model"}


def test_the_tables_cover_every_algorithm_built_without_data():
    assert ALLOWED | set(REFUSED) == set(BUILT_BY_FACTORY) and not ALLOWED & set(REFUSED)


def _with_optimizer(name: str, optimizer: dict[str, Any], params: dict[str, Any] | None = None):
    cfg = _config(name)
    alg = cfg.algorithm.model_dump()
    alg["params"].update(params or {})
    return cfg.model_copy(update={"algorithm": type(cfg.algorithm).model_validate(
        {**alg, "server_optimizer": optimizer})})


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_an_allowed_algorithm_builds_with_the_optimizer_around_its_own_step(name):
    net = _network(name)
    shape = (1, 8, 8) if net is not None else None
    plain = build_algorithm(_config(name), net, shape)
    built = build_algorithm(_with_optimizer(name, {"name": "fedyogi"}), net, shape)
    step = built.aggregator
    assert isinstance(step, OptimizedServerStep) and step.optimizer == fedyogi()
    assert type(step.inner) is type(plain.aggregator)
    assert (built.unit, built.observer, built.central) == (plain.unit, plain.observer, plain.central)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_algorithm_is_refused_in_one_line_naming_the_key(name):
    net = _network(name)
    with pytest.raises(ConfigError, match=rf"^algorithm\.server_optimizer: server optimizer fedadam: .*"
                                          rf"{REFUSED[name]}") as err:
        build_algorithm(_with_optimizer(name, {"name": "fedadam"}), net, (1, 8, 8) if net is not None else None)
    assert err.value.path == "algorithm.server_optimizer" and "\n" not in str(err.value)


@pytest.mark.parametrize("name, params, match", [
    ("fedavg", {"server_lr": 0.5}, "server_lr 0.5: the server optimizer's lr replaces it"),
    ("dp_fedavg_central", {"server_lr": 2.0}, "server_lr 2"),
    ("pfa_plus", {"server_lr": 0.5}, "server_lr 0.5"),
    ("fedavg", {"anderson": {"memory": 2}}, "its own iterates"),  # the splitting preset
])
def test_a_server_lr_or_the_splitting_preset_is_refused(name, params, match):
    with pytest.raises(ConfigError, match=rf"^algorithm\.server_optimizer: .*{match}"):
        build_algorithm(_with_optimizer(name, {"name": "fedavgm"}, params))


def test_noisy_fedavg_is_refused_only_under_the_shifted_interpolation_bound():
    base = {"lr": 0.5, "clients": 10, "rounds": 3, "clip": 1.0, "local_steps": 3, "local_epochs": None,
            "mechanism": "param_noise"}
    transcript = dpfl.algorithms.noisy_fedavg(RunFacts(**base), std=0.5)
    assert refusal(transcript) is None
    final = dpfl.algorithms.noisy_fedavg(RunFacts(**base, observer="aggregate", release="final", smoothness_L=1.0),
                                         std=0.5)
    assert "shifted-interpolation bound" in refusal(final)


def test_the_clustered_steps_and_mr_mtl_are_refused():
    """The algorithms built with their data: their server steps hold cluster or personal models."""
    local = sgd(0.1, steps=1)
    clusters = ClusteredAggregator(strategy="fixed", n_clients=3, rounds=2, assignment=(0, 1, 0))
    for step in (clusters, MeanRegularized(3)):
        assert "personal or cluster models" in refusal(Algorithm("x", local, aggregator=step))


def test_the_python_api_composes_like_the_config():
    facts = RunFacts(lr=0.5, clients=3, local_steps=4, clip=1.0)
    algorithm = dpfl.algorithms.pfa(facts, public_fraction=0.34)
    wrapped = dpfl.algorithms.with_server_optimizer(algorithm, dpfl.algorithms.fedadam(lr=0.01))
    assert wrapped.aggregator == OptimizedServerStep(algorithm.aggregator, fedadam(lr=0.01))
    assert dataclasses.replace(wrapped, aggregator=algorithm.aggregator) == algorithm
    with pytest.raises(ValueError, match="already has a server optimizer"):
        dpfl.algorithms.with_server_optimizer(wrapped, dpfl.algorithms.fedavgm())
    with pytest.raises(TypeError, match="fedavgm, fedadam, fedyogi or fedadagrad"):
        dpfl.algorithms.with_server_optimizer(algorithm, "fedadam")  # type: ignore[arg-type]
    fitted = wrapped.aggregator.fit_split(np.arange(3), np.array([1.0, 2.0, 8.0]), 0)  # PFA's split, inside
    assert isinstance(fitted, OptimizedServerStep) and fitted.public_clients == fitted.inner.public_clients


# ---- the config key ------------------------------------------------------------------------------------------
def test_the_config_fills_the_optimizers_defaults_and_round_trips():
    cfg = load_config(DEMO, ["algorithm.server_optimizer={name: fedyogi, lr: 0.02}"])
    opt = cfg.algorithm.server_optimizer
    assert (opt.name, opt.lr, opt.beta1, opt.beta2, opt.tau, opt.momentum) == ("fedyogi", 0.02, 0.9, 0.99, 1e-3, None)
    text = config_to_yaml(cfg)
    assert validate_config(parse_yaml(text)) == cfg
    plain = load_config(DEMO)
    assert plain.algorithm.server_optimizer is None and "server_optimizer: null" in config_to_yaml(plain)
    assert load_config(DEMO, ["algorithm.server_optimizer={name: fedavgm}"]).algorithm.server_optimizer.momentum == 0.9


@pytest.mark.parametrize("value, match", [
    ("{name: fedadam, momentum: 0.5}", r"^algorithm\.server_optimizer\.momentum: fedadam does not use it"),
    ("{name: fedavgm, beta2: 0.9}", r"^algorithm\.server_optimizer\.beta2: fedavgm does not use it"),
    ("{name: fedadagrad, beta2: 0.9}", r"^algorithm\.server_optimizer\.beta2: fedadagrad does not use it"),
    ("{name: adam}", r"^algorithm\.server_optimizer\.name: not an allowed value"),
    ("{name: fedadam, lr: 0}", r"^algorithm\.server_optimizer\.lr: out of range"),
    ("{name: fedadam, beta1: 1.0}", r"^algorithm\.server_optimizer\.beta1: out of range"),
    ("{name: fedadam, eta: 0.1}", r"^algorithm\.server_optimizer\.eta: unknown field"),
])
def test_a_bad_config_key_is_one_line_naming_it(value, match):
    with pytest.raises(ConfigError, match=match) as err:
        load_config(DEMO, [f"algorithm.server_optimizer={value}"])
    assert "\n" not in str(err.value)


def test_fedadam_lr_default_and_momentum_are_the_documented_ones():
    assert math.isclose(fedadam().lr, 0.1) and fedadam().tau == 1e-3 and fedadagrad().beta1 == 0.0
    assert fedavgm() == ServerOptimizer("fedavgm", 1.0, momentum=0.9)
