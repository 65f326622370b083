"""The algorithm factories (`dpfl.algorithms.<name>`) and the one registry the config's algorithm names resolve
through: each factory builds what the YAML path builds, a registered algorithm is usable by name from a config."""

from __future__ import annotations

import inspect
import re
from dataclasses import replace
from typing import Any

import pytest
from pydantic import BaseModel, Field

import dpfl
import dpfl.algorithms
from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.context import AlgorithmError, RunFacts
from dpfl.algorithms.registry import algorithm_names, algorithm_spec, register_algorithm
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.experiment.algorithm_bundle import model_facts
from dpfl.experiment.build import build_algorithm
from dpfl.experiment.config import ALGORITHMS, ConfigError, validate_config
from dpfl.models import build_model

BASE: dict[str, Any] = {
    "name": "factories", "seed": 0,
    "data": {"dataset": "digits", "clients": 10, "partition": "iid"},
    "model": {"name": "mlp2"},
    "training": {"rounds": 3, "local_epochs": 1, "batch_size": 32, "optimizer": {"lr": 0.5}},
}
DPSGD = {"clip": 1.0, "budgets": 4.0}
# name -> (its config's privacy section and training changes, its required params, the RunFacts a user would write)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "fedavg": ({}, {}, {}, {}),
    "dp_fedavg_local": (DPSGD, {}, {}, {"clip": 1.0}),
    "dp_fedavg_central": (DPSGD, {}, {}, {"clip": 1.0}),
    "udp_fedavg": (DPSGD, {}, {}, {"clip": 1.0}),
    "noisy_fedavg": ({"clip": 1.0}, {"local_steps": 3, "local_epochs": None}, {"std": 0.5},
                     {"clip": 1.0, "local_steps": 3, "local_epochs": None}),
    "noisy_fedprox": ({"clip": 1.0}, {"local_steps": 3, "local_epochs": None}, {"std": 0.5, "alpha": 0.1},
                      {"clip": 1.0, "local_steps": 3, "local_epochs": None}),
    "fedprox": ({}, {}, {"mu": 0.1}, {}),
    "weiavg": (DPSGD, {}, {}, {"clip": 1.0}),
    "min_eps": (DPSGD, {}, {}, {"clip": 1.0}),
    "max_eps": ({**DPSGD, "allow_budget_violation": True}, {}, {}, {"clip": 1.0}),
    "oracle": (DPSGD, {}, {}, {"clip": 1.0}),
    "pfa": (DPSGD, {}, {}, {"clip": 1.0}),
    "pfa_plus": (DPSGD, {}, {}, {"clip": 1.0}),
    "robust_hdp": (DPSGD, {}, {}, {"clip": 1.0}),
    "fedceo": (DPSGD, {}, {"lam": 0.1}, {"clip": 1.0}),
    "ppsgd": (DPSGD, {}, {}, {"clip": 1.0}),
    "centaur": (DPSGD, {}, {}, {"clip": 1.0}),
    "fedsplit": ({}, {}, {"eta": 0.5}, {}),
    "fedpi": ({}, {}, {"eta": 0.5}, {}),
    "fedrp": ({}, {}, {"eta": 0.5}, {}),
}
# MP-DP's family: FedSGD (one step a round, every client) of the float64 network it perturbs, which the factory reads
# with one record's shape; TP-SMC with a small key (its keys are drawn afresh by every build: compared apart)
MPDP_FAMILY = ("mpdp", "mpdp_naive", "mp_cdp", "tp_smc", "fedsgd")
MPDP_DATA = {"dataset": "digits", "clients": 10, "partition": "iid_equal"}
MPDP_MODEL = {"name": "mpdp_mlp", "options": {"hidden": [16]}}
MPDP_TRAINING = {"local_steps": 1, "local_epochs": None, "selection": {"kind": "all"}}
MPDP_RUN = {"local_steps": 1, "local_epochs": None, "selection": Selection("all"), "input_shape": (1, 8, 8),
            "run_name": "factories", "seed": 0, "model_name": "mpdp_mlp"}
CASES.update({name: ({"clip": 1.0} if name != "fedsgd" else {}, MPDP_TRAINING,
                     {"tpsmc_key_bits": 64} if name == "tp_smc" else {},
                     {**MPDP_RUN, **({"clip": 1.0} if name != "fedsgd" else {})}) for name in MPDP_FAMILY})
BUILT_BY_FACTORY = [n for n in ALGORITHMS if not algorithm_spec(n).with_data]


def _config(name: str) -> Any:
    privacy, training, params, _ = CASES[name]
    family = {"data": MPDP_DATA, "model": MPDP_MODEL} if name in MPDP_FAMILY else {}
    return validate_config({**BASE, **family, "training": {**BASE["training"], **training}, "privacy": privacy,
                            "algorithm": {"name": name, "params": params}})


def _network(name: str) -> Any:
    """The built network the MP-DP family's factories read (None for the others: they read the registry's facts)."""
    return build_model("mpdp_mlp", (1, 8, 8), 10, seed=0, hidden=[16]) if name in MPDP_FAMILY else None


def _without_keys(algorithm: Algorithm) -> Algorithm:
    """TP-SMC's bundle less its Paillier keys (a build draws fresh ones), after checking that the clients encrypt
    under the keys the server decrypts with: 64-bit n, one share per client, the config's threshold."""
    keys = algorithm.upload.keys
    assert algorithm.aggregator.keys is keys
    assert keys.public.n.bit_length() in (63, 64) and len(keys.shares) == 10 and keys.threshold == 6
    return replace(algorithm, upload=replace(algorithm.upload, keys=None),
                   aggregator=replace(algorithm.aggregator, keys=None))


def test_every_config_name_is_registered_in_the_config_order():
    assert algorithm_names()[:len(ALGORITHMS)] == ALGORITHMS
    assert set(CASES) == set(BUILT_BY_FACTORY)


@pytest.mark.parametrize("name", BUILT_BY_FACTORY)
def test_a_factory_builds_what_the_config_builds(name):
    """The factory, called with the RunFacts a Python user writes and its default params, gives the YAML's bundle."""
    cfg = _config(name)
    net = _network(name)
    loss, names, head = model_facts(cfg, net)
    facts = {"model_name": "mlp2", **CASES[name][3]}
    run = RunFacts(lr=0.5, clients=10, rounds=3, loss=loss, param_names=tuple(names), head_module=head, model=net,
                   **facts)
    built = getattr(dpfl.algorithms, name)(run, **CASES[name][2])
    from_config = build_algorithm(cfg, net, (1, 8, 8) if net is not None else None)
    assert isinstance(built, Algorithm)
    if name == "tp_smc":
        built, from_config = _without_keys(built), _without_keys(from_config)
    assert repr(built) == repr(from_config)  # every stage's parameters (arrays included)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_factory_takes_its_params_as_keywords_with_the_schema_defaults(name):
    spec = algorithm_spec(name)
    keywords = {p.name: p for p in inspect.signature(spec.factory).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(keywords) == set(spec.params.model_fields)
    for key, field in spec.params.model_fields.items():
        default = keywords[key].default
        default = list(default) if isinstance(default, tuple) else default  # a list's default, immutable
        if field.is_required():
            assert default is inspect.Parameter.empty, key
        else:
            assert default == field.get_default(call_default_factory=True), key


def test_the_paper_name_of_central_dp_fedavg():
    assert dpfl.algorithms.central_dp_fedavg is dpfl.algorithms.dp_fedavg_central
    assert {"pfa", "fedceo", "robust_hdp", "weiavg", "central_dp_fedavg"} <= set(dir(dpfl.algorithms))
    with pytest.raises(AttributeError):
        dpfl.algorithms.no_such_algorithm  # noqa: B018


def test_bad_keyword_arguments_are_refused_with_their_name():
    run = RunFacts(lr=0.5, clients=10, clip=1.0)
    with pytest.raises(ValueError, match=r"^pfa: k: .*greater than or equal to 1 \(got 0\)"):
        dpfl.algorithms.pfa(run, k=0)
    with pytest.raises(ValueError, match=r"^pfa: split: "):
        dpfl.algorithms.pfa(run, split="median")
    with pytest.raises(TypeError, match="unexpected keyword argument 'kk'"):
        dpfl.algorithms.pfa(run, kk=1)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'lam'"):
        dpfl.algorithms.fedceo(run)
    with pytest.raises(AlgorithmError, match="^privacy.mechanism: algorithm 'pfa' runs with mechanism 'dpsgd'") as err:
        dpfl.algorithms.pfa(RunFacts(lr=0.5, clients=10, clip=1.0, mechanism="udp"))
    assert err.value.key == "privacy.mechanism"
    with pytest.raises(AlgorithmError, match="^model: CENTAUR needs a model with a head"):
        dpfl.algorithms.centaur(run)


CLUSTERED = ("rdpcfl", "ifca_dp", "clustered_oracle", "clustered_local", "mr_mtl")


def test_the_clustered_algorithms_are_built_with_their_data():
    assert [n for n in ALGORITHMS if algorithm_spec(n).with_data] == list(CLUSTERED)
    with pytest.raises(AlgorithmError, match="^algorithm: rdpcfl is built with its data"):
        dpfl.algorithms.rdpcfl(RunFacts(lr=0.5, clients=10, clip=1.0))


@pytest.mark.parametrize("name", CLUSTERED)
def test_a_clustered_factory_builds_what_the_run_builds(name):
    """With the run's data, budgets and batch sizes, the factory gives build_run's bundle and noise."""
    params = {"ifca_dp": {"clusters": 2}}.get(name, {})
    cfg = validate_config({
        "name": "clustered", "seed": 3,
        "data": {"dataset": "digits", "clients": 7, "partition": "clustered",
                 "clustered": {"clusters": 2, "shift": "rotation", "train_per_client": 40}},
        "model": {"name": "logr"}, "algorithm": {"name": name, "params": params},
        "training": {"rounds": 4, "local_epochs": 1, "batch_size": 8, "optimizer": {"lr": 0.1}},
        "privacy": {"clip": 1.0, "budgets": 4.0}})
    run = dpfl.build_run(cfg)
    loss, names, _ = model_facts(cfg, None)
    facts = RunFacts(lr=0.1, clients=7, rounds=4, clip=1.0, seed=3, loss=loss, param_names=tuple(names),
                     data=run.data, budgets=tuple(dpfl.ClientBudget(4.0, 1e-5) for _ in range(7)),
                     batch_sizes=(8,) * 7)
    built = getattr(dpfl.algorithms, name)(facts, **params)
    assert repr(built.algorithm) == repr(run.algorithm)
    assert len(built.noise_multipliers) == 7 and all(z > 0 for z in built.noise_multipliers)


class HalfParams(BaseModel):
    model_config = {"extra": "forbid", "strict": True}
    server_lr: float = Field(0.5, gt=0)


def half_fedavg(run: RunFacts, *, server_lr: float = 0.5) -> Algorithm:
    """DP-FedAvg with a damped server step: the test's own algorithm."""
    return Algorithm("half_fedavg", run.local_program(private=True), run.selection, aggregator=FedAvg("uniform",
                                                                                                        server_lr))


def test_a_registered_algorithm_runs_from_a_config_by_name(clean_registries):
    register_algorithm("half_fedavg", half_fedavg, params=HalfParams, mechanisms=("dpsgd",))
    assert dpfl.algorithms.half_fedavg is half_fedavg
    raw = {**BASE, "model": {"name": "logr"}, "training": {**BASE["training"], "rounds": 1}, "privacy": DPSGD,
           "algorithm": {"name": "half_fedavg", "params": {"server_lr": 0.25}}}
    cfg = validate_config(raw)
    assert cfg.privacy.mechanism == "dpsgd" and cfg.privacy.unit == "sample"
    algorithm = build_algorithm(cfg)
    assert algorithm.name == "half_fedavg" and algorithm.aggregator == FedAvg("uniform", 0.25)
    with pytest.raises(ConfigError, match=r"^algorithm.params.server_lr: out of range \(got 0.0; allowed: > 0\)$"):
        validate_config({**raw, "algorithm": {"name": "half_fedavg", "params": {"server_lr": 0.0}}})
    with pytest.raises(ConfigError, match=r"^privacy.mechanism: algorithm 'half_fedavg' runs with mechanism 'dpsgd'"):
        validate_config({**raw, "privacy": {**DPSGD, "mechanism": "udp"}})
    result = dpfl.build_run(cfg).run()
    assert result.stop_reason == "rounds"


def test_an_algorithm_is_registered_once(clean_registries):
    register_algorithm("half_fedavg", half_fedavg, params=HalfParams)
    with pytest.raises(ValueError, match="'half_fedavg' is already registered; pass replace=True"):
        register_algorithm("half_fedavg", half_fedavg, params=HalfParams)
    register_algorithm("half_fedavg", half_fedavg, params=HalfParams, replace=True)
    with pytest.raises(ValueError, match="'pfa' is already registered; it is one of dpfl's own"):
        register_algorithm("pfa", half_fedavg, params=HalfParams, replace=True)
    with pytest.raises(ValueError, match="params must be a pydantic model"):
        register_algorithm("other", half_fedavg, params=dict)
    with pytest.raises(ValueError, match="mechanisms must be one or more of"):
        register_algorithm("other", half_fedavg, params=HalfParams, mechanisms=("laplace",))
    with pytest.raises(ValueError, match="must be an identifier"):
        register_algorithm("my-algo", half_fedavg, params=HalfParams)


def test_an_unregistered_name_lists_the_registered_ones(clean_registries):
    """Every registered name, dpfl's own in the config's order and then the user's."""
    register_algorithm("half_fedavg", half_fedavg, params=HalfParams)
    allowed = ", ".join(map(repr, ALGORITHMS)) + " or 'half_fedavg'"
    with pytest.raises(ConfigError, match="^" + re.escape(f"algorithm.name: not an allowed value (got 'bogus'; "
                                                          f"allowed: {allowed})") + "$"):
        validate_config({**BASE, "algorithm": {"name": "bogus"}})
