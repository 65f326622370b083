"""The run config: example files, `--set` overrides, one-line errors naming the field, YAML round trips."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpfl.experiment.config import (
    ChoiceBudgets,
    ConfigError,
    RunConfig,
    apply_overrides,
    config_to_yaml,
    load_config,
    parse_override,
    parse_yaml,
    validate_config,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
EXAMPLES = sorted(CONFIGS.glob("*.yaml"))
DEMO = CONFIGS / "demo.yaml"


def one_line(err: BaseException) -> str:
    msg = str(err)
    assert msg and len(msg.splitlines()) == 1, msg
    return msg


def demo_dict() -> dict:
    return parse_yaml(DEMO.read_text())


def check(overrides: list[str], base: dict | None = None) -> RunConfig:
    return validate_config(apply_overrides(base if base is not None else demo_dict(), overrides))


def error(overrides: list[str], base: dict | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        check(overrides, base)
    return one_line(info.value)


# ---- example configs ----------------------------------------------------------------------------------


def test_the_expected_examples_exist():
    assert {p.stem for p in EXAMPLES} >= {"demo", "fmnist_dpsgd", "fmnist_central", "digits_udp"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_validates_and_round_trips(path, tmp_path):
    cfg = load_config(path)
    assert cfg.name == path.stem
    dumped = tmp_path / "config.yaml"
    dumped.write_text(config_to_yaml(cfg))
    assert load_config(dumped) == cfg
    assert config_to_yaml(load_config(dumped)) == config_to_yaml(cfg)


def test_examples_state_the_threat_model_they_get():
    got = {p.stem: load_config(p).privacy for p in EXAMPLES}
    assert (got["demo"].unit, got["demo"].observer, got["demo"].mechanism) == ("sample", "server", "dpsgd")
    assert (got["fmnist_central"].unit, got["fmnist_central"].observer) == ("client", "aggregate")
    assert (got["digits_udp"].unit, got["digits_udp"].observer, got["digits_udp"].mechanism) == (
        "client", "server", "udp")
    fm = load_config(CONFIGS / "fmnist_dpsgd.yaml")
    assert fm.data.partition == "dirichlet" and fm.training.selection.k == 10 and fm.model.name == "cnn_pfa"


def test_resolved_yaml_has_every_field_and_inferred_values():
    cfg = check(["privacy.unit=null", "privacy.observer=null", "privacy.mechanism=null", "privacy.sampling=null"])
    doc = yaml.safe_load(config_to_yaml(cfg))
    assert doc["privacy"]["unit"] == "sample" and doc["privacy"]["mechanism"] == "dpsgd"
    assert doc["privacy"]["observer"] == "server" and doc["privacy"]["sampling"] == "poisson"
    assert doc["algorithm"]["params"] == {"weighting": "uniform", "server_lr": 1.0}
    assert doc["checkpoint"] == {"every": 1} and doc["data"]["alpha"] == 0.5
    assert set(doc) == set(RunConfig.model_fields)


@pytest.mark.parametrize("overrides", [
    ["privacy.budgets=4"],
    ["privacy.budgets=[1, 2, 3, 4, 5, 6, 7, 8, 9, .inf]", "privacy.noise_multiplier=1.5"],
    ["privacy.budgets={distribution: uniform, low: 0.5, high: 2}"],
    ["privacy.budgets={distribution: choice, values: [1, 4], probs: [0.25, 0.75]}"],
    ["training.batch_size=[8, 8, 16, 16, 32, 32, 64, 64, 8, 8]"],
    ["training.batch_size={distribution: choice, values: [16, 32, 64, 128]}"],
    ["privacy.budgets={distribution: MixGauss1}", "training.batch_size=hetero"],
    ["privacy.budgets={distribution: mixgauss3-code, eps_floor: 0.05}"],
    ["privacy.budgets={distribution: Pareto, pareto_cap: 50}"],
    ["privacy.budgets={distribution: Dist5}"],
    ["data.clients=20", "privacy.budgets={distribution: rhdp20, dist: dist2}", "training.batch_size=RHDP20"],
    ["training.selection={kind: poisson, rate: 0.3}", "privacy.accountant=pld"],
    ["algorithm.name=fedprox", "algorithm.params={mu: 0.01}"],
    ["algorithm.name=fedavg", "privacy={}"],
    ["data={dataset: synthetic, clients: 4, options: {n_features: 8}}", "privacy.budgets=2"],
])
def test_variants_round_trip(overrides):
    cfg = check(overrides)
    assert validate_config(yaml.safe_load(config_to_yaml(cfg))) == cfg


# ---- overrides ----------------------------------------------------------------------------------------


def test_parse_override_reads_yaml_values():
    assert parse_override("training.rounds=5") == (("training", "rounds"), 5)
    assert parse_override("privacy.budgets=[1,2,4]") == (("privacy", "budgets"), [1, 2, 4])
    assert parse_override("privacy.delta=1e-5") == (("privacy", "delta"), 1e-5)  # YAML 1.1 would give a string
    assert parse_override("name=a=b") == (("name",), "a=b")
    assert parse_override("data.root=") == (("data", "root"), None)
    assert parse_override(" seed = 3") == (("seed",), 3)


@pytest.mark.parametrize("text", ["training.rounds", "=5", "training..rounds=5", "a.=1", "x=[1, 2"])
def test_malformed_overrides_are_one_line_errors(text):
    with pytest.raises(ConfigError, match="--set"):
        parse_override(text)


def test_overrides_set_nested_fields_lists_and_items(tmp_path):
    cfg = load_config(DEMO, ["training.rounds=5", "training.optimizer.momentum=0.5",
                             "privacy.budgets=[1,2,4,8,1,2,4,8,1,2]", "privacy.budgets.9=16",
                             "training.selection.kind=fixed", "training.selection.k=3", "seed=7"])
    assert cfg.training.rounds == 5 and cfg.training.optimizer.momentum == 0.5 and cfg.seed == 7
    assert cfg.privacy.budgets == [1.0, 2.0, 4.0, 8.0, 1.0, 2.0, 4.0, 8.0, 1.0, 16.0]
    assert (cfg.training.selection.kind, cfg.training.selection.k) == ("fixed", 3)
    assert load_config(DEMO, ["training.rounds=5", "training.rounds=6"]).training.rounds == 6  # last wins


def test_override_of_an_unknown_field_names_its_path():
    with pytest.raises(ConfigError) as info:
        load_config(DEMO, ["training.optimiser.lr=0.1"])
    msg = one_line(info.value)
    assert msg.startswith("training.optimiser: unknown field") and "did you mean 'optimizer'" in msg
    assert "allowed: rounds, local_steps, local_epochs, batch_size, optimizer, selection" in msg
    assert info.value.path == "training.optimiser"
    assert error(["privacy.epsilon=3"]).startswith("privacy.epsilon: unknown field")
    assert error(["nonsense=1"]).startswith("nonsense: unknown field")


def test_override_below_a_scalar_is_refused():
    with pytest.raises(ConfigError, match=r"^training\.rounds\.x: cannot set training\.rounds\.x: training\.rounds "
                                          r"is not a mapping"):
        load_config(DEMO, ["training.rounds.x=3"])


# ---- validation messages ------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, start, fragments", [
    (["training.selection.kind=fixed"], "training.selection.k: required when kind is 'fixed'",
     ["allowed: an integer in [1, data.clients]"]),
    (["training.selection={kind: fixed, k: 11}"], "training.selection.k: more clients than data.clients (10)",
     ["got 11", "allowed: an integer in [1, 10]"]),
    (["training.selection={kind: poisson}"], "training.selection.rate: required when kind is 'poisson'", []),
    (["training.selection={kind: all, k: 3}"], "training.selection.k: only used when kind is 'fixed'", []),
    (["training.rounds=0"], "training.rounds: out of range", ["got 0", "allowed: >= 1"]),
    (["training.rounds='5'"], "training.rounds: wrong type", ["got '5'", "allowed: an integer"]),
    (["training.local_steps=5"], "training.local_steps: give exactly one of", []),
    (["data.dataset=digitz"], "data.dataset: not an allowed value", ["got 'digitz'", "'digits'", "'fashion_mnist'"]),
    (["data.clients=0"], "data.clients: out of range", ["allowed: >= 1"]),
    (["data.options={seed: 1}"], "data.options.seed: the dataset seed is the run's top-level seed", []),
    (["data.options={normalise: [0, 1]}"], "data.options.normalise: unknown option for dataset 'digits'",
     ["allowed: normalize"]),
    (["model.name=resnet"], "model.name: not an allowed value", ["'logr'", "'cnn_pfa'"]),
    (["model.options={hidden: 3}"], "model.options.hidden: unknown option for model 'logr'", ["allowed: bias, init"]),
    (["model.options={init: xavier}"], "model.options.init: unknown init scheme", ["allowed: default, zeros"]),
    (["privacy.mechanism=udp"], "privacy.mechanism: algorithm 'dp_fedavg_local' runs with mechanism 'dpsgd'",
     ["got 'udp'", "allowed: dpsgd"]),
    (["algorithm.name=dp_fedavg_central"], "privacy.mechanism: algorithm 'dp_fedavg_central' runs with mechanism "
     "'central'", ["got 'dpsgd'"]),
    (["algorithm.name=fedavg"], "privacy.mechanism: algorithm 'fedavg' runs with mechanism 'none'", []),
    (["algorithm.name=fedavg", "privacy={clip: 1.0}"], "privacy.clip: not used by algorithm 'fedavg'",
     ["allowed: null"]),
    (["privacy.unit=client"], "privacy.unit: mechanism 'dpsgd' of algorithm 'dp_fedavg_local' protects unit 'sample'",
     []),
    (["privacy.observer=aggregate"], "privacy.observer: with algorithm 'dp_fedavg_local'", ["allowed: server"]),
    (["privacy.budgets=[1, 2, 4]"], "privacy.budgets: has 3 entries for 10 clients",
     ["allowed: one epsilon per client (10)"]),
    (["privacy.budgets=[1, 2, 0, 4, 4, 4, 4, 4, 4, 4]"], "privacy.budgets.2: not an epsilon", ["got 0"]),
    (["privacy.budgets=null"], "privacy.budgets: required by mechanism 'dpsgd'", []),
    (["privacy.budgets={distribution: zipf}"], "privacy.budgets.distribution: unknown budget distribution",
     ["got 'zipf'", "allowed: uniform, choice, fixed, Uniform, Gauss, Pareto, MixGauss1, MixGauss2, MixGauss3, "
      "MixGauss4, MixGauss3-code, Dist1, Dist2, Dist3, Dist4, Dist5, Dist6, Dist7, Dist8, Dist9, rhdp20"]),
    (["privacy.budgets={eps_floor: 0.1}"], "privacy.budgets.distribution: required field is missing",
     ["allowed: uniform, choice, fixed, Uniform,"]),
    (["privacy.budgets={distribution: UNIFORM}"], "privacy.budgets.distribution: ambiguous budget distribution",
     ["allowed: uniform or Uniform"]),
    (["privacy.budgets={distribution: uniform}"], "privacy.budgets.low: required field is missing (distribution "
     "'uniform' is U(low, high); PFA's U(1, 10) with its re-draw is distribution 'Uniform')", []),
    (["privacy.budgets={distribution: MixGauss1, eps_floor: 0}"], "privacy.budgets.eps_floor: out of range",
     ["allowed: > 0"]),
    (["privacy.budgets={distribution: MixGauss1, low: 1}"], "privacy.budgets.low: unknown field",
     ["allowed: distribution, eps_floor"]),
    (["privacy.budgets={distribution: Gauss, pareto_cap: 5}"], "privacy.budgets.pareto_cap: unknown field", []),
    (["privacy.budgets={distribution: pareto, pareto_cap: 0.001}"], "privacy.budgets.pareto_cap: must be >= eps_floor",
     ["allowed: null (uncapped) or a number >= 0.01"]),
    (["privacy.budgets={distribution: rhdp20, dist: Dist5}"], "privacy.budgets: rhdp20 lists have 20 clients; "
     "for 10 clients use distribution Dist5 (sampled)", ["allowed: {distribution: Dist5} or data.clients: 20"]),
    (["privacy.budgets={distribution: rhdp20, dist: Dist10}"], "privacy.budgets.dist: not an allowed value",
     ["got 'Dist10'", "'Dist1', 'Dist2', 'Dist3', 'Dist4', 'Dist5', 'Dist6', 'Dist7', 'Dist8' or 'Dist9'"]),
    (["privacy.budgets={distribution: rhdp20}"], "privacy.budgets.dist: required field is missing", []),
    (["privacy.budgets=MixGauss1"], "privacy.budgets: wrong type", ["{distribution: NAME, ...} with NAME one of "
     "uniform, choice, fixed, Uniform, Gauss, Pareto, MixGauss1..4, MixGauss3-code, Dist1..Dist9, rhdp20"]),
    (["privacy.budgets={distribution: uniform, low: 1, hi: 2}"],
     "privacy.budgets.hi: unknown field, did you mean 'high'",
     ["allowed: distribution, low, high", "(+1 more)"]),
    (["privacy.budgets={distribution: choice, values: [1, 2], probs: [0.5, 0.6]}"],
     "privacy.budgets.probs: probabilities must sum to 1", []),
    (["privacy.budgets=.inf"], "privacy.budgets: unlimited (.inf) budgets cannot calibrate noise", []),
    (["privacy.delta=1.5"], "privacy.delta: out of range", ["got 1.5", "allowed: (0, 1)"]),
    (["privacy.delta=0"], "privacy.delta: out of range", ["allowed: (0, 1)"]),
    (["privacy.clip=-1"], "privacy.clip: out of range", ["allowed: > 0"]),
    (["privacy.calibration=pfa-heuristic", "privacy.noise_multiplier=1.0"],
     "privacy.calibration: the PFA heuristic calibrates DP-SGD noise from the budgets", ["allowed: accountant"]),
    (["privacy.sampling=fixed", "privacy.accountant=pld"], "privacy.accountant: 'pld' cannot account fixed-size",
     ["allowed: rdp"]),
    (["algorithm.name=udp_fedavg", "privacy={clip: 1.0, budgets: .inf}"],
     "privacy.budgets: unlimited (.inf) budgets cannot calibrate noise; give privacy.noise_multiplier", []),
    (["algorithm.name=noisy_fedavg", "privacy={clip: 1.0}", "training.local_steps=2", "training.local_epochs=null"],
     "privacy.budgets: required to calibrate the noise (or give algorithm.params.std)", []),
    (["privacy.participation=worst_case", "privacy.noise_multiplier=1.0"],
     "privacy.participation: only used when the noise is calibrated from the budgets (the noise is given", []),
    (["algorithm={name: dp_fedavg_central}", "privacy={clip: 1.0, budgets: 4, participation: worst_case}"],
     "privacy.participation: central DP charges every client every round", ["allowed: expected"]),
    (["privacy.accountant=gdp"], "privacy.accountant: 'gdp' is exact only for Gaussian mechanisms without sampling",
     ["allowed: rdp or pld"]),
    (["algorithm.local={name: no_such_program}"], "algorithm.local.name: no local program of this name is registered",
     []),
    (["algorithm.aggregator={name: no_such_aggregator}"],
     "algorithm.aggregator.name: no aggregator of this name is registered", []),
    (["algorithm.params={weighting: mean}"], "algorithm.params.weighting: not an allowed value",
     ["'uniform', 'samples' or 'epsilon'"]),
    (["algorithm.name=fedprox", "algorithm.params={mu: 0}"], "algorithm.params.mu: out of range", ["> 0"]),
    (["training.batch_size=[32, 32]"], "training.batch_size: has 2 entries for 10 clients", []),
    (["training.batch_size={distribution: zipf}"], "training.batch_size.distribution: unknown batch-size", []),
    (["training.batch_size={distribution: hetero}"], "training.batch_size.distribution: unknown batch-size "
     "distribution (write training.batch_size: hetero, a plain string)",
     ["allowed: choice; or batch_size: hetero | rhdp20"]),
    (["training.batch_size=zipf"], "training.batch_size: unknown batch-size list or distribution",
     ["got 'zipf'", "hetero (each client uniform from {16, 32, 64, 128}), rhdp20 (the RHDP 20-client list)"]),
    (["training.batch_size=rhdp20"], "training.batch_size: the rhdp20 list has 20 clients, data.clients is 10",
     ["allowed: hetero, an integer, a list of 10 integers"]),
    (["ray.actors=3"], "ray: the ray section configures backend 'ray'", ["allowed: null (or set backend: ray)"]),
    (["backend=ray", "ray.actors=0"], "ray.actors: out of range", []),
    (["name='my run'"], "name: invalid format", []),
    (["evaluation.every=0"], "evaluation.every: out of range", []),
    (["checkpoint.every=0"], "checkpoint.every: out of range", []),
])
def test_each_problem_is_one_line_naming_the_field_and_what_is_allowed(overrides, start, fragments):
    msg = error(overrides)
    assert msg.startswith(start), msg
    for fragment in fragments:
        assert fragment in msg, (fragment, msg)


def test_cuda_only_where_available():
    import torch

    if torch.cuda.is_available():
        assert check(["device=cuda"]).device == "cuda"
    else:
        assert error(["device=cuda"]).startswith("device: cuda is not available on this machine")


def test_numbers_written_as_text_get_a_hint():
    base = yaml.safe_load(DEMO.read_text())  # plain PyYAML: '1e-5' stays a string
    assert base["privacy"]["delta"] == "1e-5"
    assert error([], base).startswith("privacy.delta: a number written as text")


def test_missing_required_fields():
    base = demo_dict()
    del base["training"]["optimizer"]
    assert error([], base).startswith("training.optimizer: required field is missing")


# ---- files --------------------------------------------------------------------------------------------


def test_file_problems_are_one_line_config_errors(tmp_path):
    cases = {
        "missing.yaml": None,
        "syntax.yaml": "data:\n  dataset: digits\n clients: [1,\n",
        "list.yaml": "- 1\n- 2\n",
        "scalar.yaml": "just text\n",
        "empty.yaml": "",
        "dupe.yaml": "seed: 1\nseed: 2\n",
    }
    expected = {"missing.yaml": "config file not found", "syntax.yaml": "invalid YAML",
                "list.yaml": "must be a YAML mapping", "scalar.yaml": "must be a YAML mapping",
                "empty.yaml": "is empty", "dupe.yaml": "duplicate key 'seed'"}
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_config(path)
        msg = one_line(info.value)
        assert msg.startswith(str(path)) and expected[name] in msg, msg
    assert "line 3" in str(pytest.raises(ConfigError, load_config, tmp_path / "syntax.yaml").value)


def test_named_budgets_and_batch_kinds_are_stored_by_their_canonical_names():
    cfg = check(["data.clients=20", "privacy.budgets={distribution: rhdp20, dist: DIST5}",
                 "training.batch_size=Hetero"])
    assert cfg.privacy.budgets.model_dump() == {"distribution": "rhdp20", "dist": "Dist5"}
    assert cfg.training.batch_size == "hetero"
    doc = yaml.safe_load(config_to_yaml(check(["privacy.budgets={distribution: mixgauss1}"])))
    assert doc["privacy"]["budgets"] == {"distribution": "MixGauss1", "eps_floor": 0.01}
    pareto = check(["privacy.budgets={distribution: PARETO}"]).privacy.budgets
    assert pareto.model_dump() == {"distribution": "Pareto", "eps_floor": 0.01, "pareto_cap": None}
    assert check(["privacy.budgets={distribution: Uniform}"]).privacy.budgets.distribution == "Uniform"


def test_hdp_example_uses_mixgauss1():
    cfg = load_config(CONFIGS / "hdp_fmnist_mixgauss1.yaml")
    assert cfg.privacy.budgets.model_dump() == {"distribution": "MixGauss1", "eps_floor": 0.01}
    assert (cfg.data.dataset, cfg.data.clients, cfg.model.name, cfg.algorithm.name) == (
        "fashion_mnist", 20, "logr", "dp_fedavg_local")


def test_python_objects_validate_like_their_yaml():
    cfg = check(["privacy.budgets={distribution: choice, values: [1, 2]}"])
    assert isinstance(cfg.privacy.budgets, ChoiceBudgets)
    rebuilt = RunConfig(**{name: getattr(cfg, name) for name in RunConfig.model_fields})
    assert rebuilt == cfg


# ---- property: validation never fails any other way --------------------------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(), st.text(max_size=12),
    st.sampled_from(["all", "fixed", "poisson", "uniform", "choice", "dpsgd", "udp", "central", "none", "digits",
                     "logr", "fedavg", "fedprox", "pld", "distribution", "values", "cuda", "MixGauss1", "pareto",
                     "Dist5", "rhdp20", "hetero", "dist", "eps_floor", "pareto_cap"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.text(max_size=10), st.integers(-3, 3)), inner, max_size=4)),
    max_leaves=12,
)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


_BASES = [parse_yaml(config_to_yaml(load_config(p))) for p in EXAMPLES]
_BASE_PATHS = [(b, p) for b, base in enumerate(_BASES) for p in _paths(base) if p]


def _validates_or_one_line_config_error(doc) -> None:
    try:
        cfg = validate_config(doc)
    except ConfigError as err:
        one_line(err)
        return
    assert isinstance(cfg, RunConfig)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(_BASE_PATHS), value=_values, extra=st.booleans())
def test_random_replacements_validate_or_give_one_line_config_error(where, value, extra):
    b, path = where
    doc = copy.deepcopy(_BASES[b])
    cur = doc
    for key in path[:-1]:
        cur = cur[key]
    if extra and isinstance(cur, dict):
        cur[f"{path[-1]}_x"] = value  # an unknown sibling
    else:
        cur[path[-1]] = value
    _validates_or_one_line_config_error(doc)


@settings(max_examples=100, deadline=None)
@given(doc=st.one_of(_values, st.dictionaries(st.sampled_from(sorted(RunConfig.model_fields)), _values, max_size=8)))
def test_random_documents_validate_or_give_one_line_config_error(doc):
    _validates_or_one_line_config_error(doc)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=30))
def test_random_overrides_apply_or_give_one_line_config_error(text):
    try:
        doc = apply_overrides(_BASES[0], [text])
    except ConfigError as err:
        one_line(err)
        return
    _validates_or_one_line_config_error(doc)
