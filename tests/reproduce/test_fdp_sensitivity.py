"""The empirical sensitivity experiment (spec fdp_accounting.md §7, T13 second half)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch

from dpfl.data import federated_dataset
from dpfl.data.federated import ClientData, FederatedDataset
from dpfl.experiment.config import load_config, validate_config
from dpfl.reproduce import fdp_sensitivity as fs
from dpfl.reproduce.fdp_sensitivity import (
    COLUMNS,
    ControlPairError,
    DatasetChoice,
    logr_smoothness,
    make_neighbour,
    measure_pair,
    run_sensitivity,
    sensitivity_settings,
    setting_config,
)

TOY_ROUNDS = 6


def _unit_rows(rng: np.random.Generator, n: int, d: int) -> torch.Tensor:
    x = rng.normal(size=(n, d))
    return torch.tensor(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=torch.float32)


@pytest.fixture(scope="module")
def toy() -> FederatedDataset:
    """3 clients, 4 features of norm 1, 3 classes. Client 0 holds one record, so with batch size 1 the changed record
    is in every one of its steps, and with a small clip every gradient is clipped: round 1's distance comes close to
    the worst case γ_0 (so the check below has teeth)."""
    rng = np.random.default_rng(0)
    d, classes = 4, 3
    clients = [ClientData(_unit_rows(rng, n, d), torch.tensor(rng.integers(classes, size=n)), torch.zeros(0, d),
                          torch.zeros(0, dtype=torch.int64)) for n in (1, 4, 4)]
    return FederatedDataset(clients, _unit_rows(rng, 12, d), torch.arange(12) % classes, classes, (d,),
                            {"dataset": "toy"})


def _toy_config(algorithm: dict) -> object:
    return validate_config({
        "name": "toy", "seed": 0, "data": {"dataset": "digits", "clients": 3}, "model": {"name": "logr"},
        "algorithm": algorithm,
        "training": {"rounds": TOY_ROUNDS, "local_steps": 3, "batch_size": 1, "optimizer": {"lr": 0.1},
                     "selection": {"kind": "all"}},
        "privacy": {"clip": 0.1}, "evaluation": {"every": 10}})


@pytest.mark.parametrize("algorithm", [{"name": "noisy_fedavg", "params": {"std": 0.1}},
                                       {"name": "noisy_fedprox", "params": {"std": 0.1, "alpha": 1.0}}],
                         ids=["fedavg", "fedprox"])
def test_convex_toy_control_is_zero_and_coupled_distance_within_recursion(toy, algorithm):
    cfg = _toy_config(algorithm)
    pair = measure_pair(cfg, data=toy, smoothness="logr")
    # L = max (||x||^2 + 1)/2 with ||x|| = 1, over both datasets (the replacement is a unit test record too)
    assert pair.L == pytest.approx(1.0, rel=1e-6)
    assert pair.m == 3
    assert pair.control.shape == (TOY_ROUNDS,) and np.all(pair.control == 0.0)
    coupled, bound = pair.distance["coupled"], pair.bound
    assert bound is not None and np.all(coupled > 0)
    # the recursion d_{t+1} = rho_t d_t + gamma_t from the accountant's sensitivities, d_1 = gamma_0 = 2 V K eta / m
    eta, K, V, m = 0.1, 3, 0.1, 3
    if algorithm["name"] == "noisy_fedavg":
        assert pair.gamma[0] == pytest.approx(2 * V * K * eta / m)
        assert pair.rho[0] == pytest.approx((1 + eta * pair.L) ** K)
    assert bound[0] == pytest.approx(pair.gamma[0])
    np.testing.assert_allclose(bound[1:], pair.rho[1:] * bound[:-1] + pair.gamma[1:])
    assert np.all(coupled <= bound)
    # not vacuous: round 1 reaches most of the worst case, so a bound for twice the cohort (or no coupling) would fail
    assert 0.7 < coupled[0] / bound[0] <= 1.0
    assert np.any(coupled > fs.recursion_bound(pair.gamma / 2, pair.rho))
    assert np.any(pair.distance["independent"] > bound)


def test_control_pair_apart_raises(toy, monkeypatch):
    make_run = fs._make_run

    def broken(cfg, data, *, eval_every, noise_offset=0):
        if eval_every == cfg.training.rounds:  # the control run: other noise, as a non-deterministic engine would give
            noise_offset = 7
        return make_run(cfg, data, eval_every=eval_every, noise_offset=noise_offset)

    monkeypatch.setattr(fs, "_make_run", broken)
    with pytest.raises(ControlPairError, match="control pair"):
        measure_pair(_toy_config({"name": "noisy_fedavg", "params": {"std": 0.1}}), data=toy, couplings=("coupled",))


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sensitivity")
    messages: list[str] = []
    result = run_sensitivity("ci", out, rounds=10, progress=messages.append)
    return out, result, messages


def test_ci_coupled_distance_positive_and_independent_much_larger(ci_run):
    _, result, messages = ci_run
    assert messages and any("fedprox-a0.1 seed 0" in m for m in messages)
    assert len(result.pairs) == 4
    for pair in result.pairs:
        coupled, independent = pair["final_distance"]["coupled"], pair["final_distance"]["independent"]
        assert coupled > 0
        assert independent > 20 * coupled
        assert pair["control_max"] == 0.0
        assert pair["max_distance_over_bound"] <= 1.0
        # the exact L of logr on digits (pixels in [0, 1], 64 features), recorded
        assert 1.0 < pair["L"] <= (64 + 1) / 2
        assert pair["m"] == 5 and sum(pair["samples_per_client"]) > 1000


def test_output_files_have_the_documented_columns(ci_run):
    out, result, _ = ci_run
    assert set(result.paths) == {"csv", "json", "md", "png"}
    for path in result.paths.values():
        assert path.parent == out and path.is_file() and path.stat().st_size > 0
    assert result.paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with result.paths["csv"].open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == COLUMNS
        rows = list(reader)
    assert len(rows) == 4 * 1 * 2 * 10  # settings x seeds x couplings x rounds
    assert {r["setting"] for r in rows} == {"fedavg", "fedprox-a0.01", "fedprox-a0.1", "fedprox-a1"}
    assert all(float(r["control_distance"]) == 0.0 for r in rows)
    coupled = [r for r in rows if r["coupling"] == "coupled"]
    assert all(r["bound"] != "" and float(r["distance"]) <= float(r["bound"]) for r in coupled)
    assert all(r["bound"] == "" for r in rows if r["coupling"] == "independent")
    assert {r["alpha"] for r in rows if r["algo"] == "fedavg"} == {""}
    evaluated = {int(r["round"]) for r in rows if r["test_accuracy"] != ""}
    assert evaluated == {10}  # every 10 rounds and the last one
    assert all(r["test_accuracy_neighbour"] != "" for r in rows if int(r["round"]) == 10)
    doc = json.loads(result.paths["json"].read_text())
    assert doc["complete"] is True and doc["columns"] == list(COLUMNS) and len(doc["rows"]) == len(rows)
    assert doc["dataset"]["name"] == "digits" and doc["dataset"]["model"] == "logr"
    assert [s["name"] for s in doc["settings"]] == [r["setting"] for r in doc["pairs"]]
    assert all(p["samples_per_client"] and p["L"] is not None for p in doc["pairs"])
    md = result.paths["md"].read_text()
    assert "| fedprox-a1 | fedprox | 1 | 5 | 5 | 1 |" in md and "REDUCED" in md
    assert doc["environment"]["dpfl"] and "- Pairs computed by: dpfl " in md and "(4 pairs). Written by: dpfl" in md
    assert all(p["environment"]["dpfl"] for p in doc["pairs"])


def test_neighbour_differs_in_exactly_one_training_record():
    data = federated_dataset("digits", 5, seed=0)
    before = [(c.x_train.clone(), c.y_train.clone()) for c in data.clients]
    for replacement in fs.REPLACEMENTS:
        nb, change = make_neighbour(data, client=1, record=3, replacement=replacement, seed=0)
        assert change["client"] == 1 and change["record"] == 3 and change["replacement"] == replacement
        differing = []
        for i, (c, c2) in enumerate(zip(data.clients, nb.clients, strict=True)):
            assert c2.x_train.shape == c.x_train.shape and c2.y_train.shape == c.y_train.shape
            rows = (c.x_train != c2.x_train).flatten(1).any(1) | (c.y_train != c2.y_train)
            differing += [(i, int(j)) for j in torch.nonzero(rows).flatten()]
        assert differing == [(1, 3)], replacement
        assert torch.equal(nb.x_test, data.x_test) and torch.equal(nb.y_test, data.y_test)
        old_x, old_y = data.clients[1].x_train[3], int(data.clients[1].y_train[3])
        new_x, new_y = nb.clients[1].x_train[3], int(nb.clients[1].y_train[3])
        if replacement == "test_other_class":
            assert new_y != old_y and torch.equal(new_x, data.x_test[change["test_index"]])
            assert int(data.y_test[change["test_index"]]) == new_y
        elif replacement == "label_flip":
            assert new_y != old_y and torch.equal(new_x, old_x)
        else:
            assert new_y == old_y and not torch.equal(new_x, old_x)
    for (x, y), c in zip(before, data.clients, strict=True):  # the base dataset is untouched
        assert torch.equal(x, c.x_train) and torch.equal(y, c.y_train)
    with pytest.raises(ValueError, match="replacement"):
        make_neighbour(data, replacement="swap")


def test_logr_smoothness_is_the_largest_record():
    x = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    data = FederatedDataset([ClientData(x, torch.tensor([0, 1]), x[:0], torch.tensor([], dtype=torch.int64))],
                            x, torch.tensor([0, 1]), 2, (2,))
    assert logr_smoothness(data) == pytest.approx((25 + 1) / 2)
    assert logr_smoothness(data, bias=False) == pytest.approx(25 / 2)


def test_full_scale_settings_have_the_spec_values():
    assert fs.SPEC["full"]["rounds"] == 600 and fs.SPEC["full"]["seeds"] == 3 and fs.SPEC["full"]["smoothness"] is None
    settings = sensitivity_settings("full")
    by_name = {s.name: s for s in settings}
    assert len(by_name) == len(settings)
    assert {s.alpha for s in settings if s.algo == "fedprox"} == {0.01, 0.1, 1.0}
    assert all((s.m, s.K, s.V) == (20, 5, 10.0) for s in settings if s.factor is None)
    fedavg = {(s.m, s.K, s.V) for s in settings if s.algo == "fedavg"}
    assert fedavg == ({(m, 5, 10.0) for m in (10, 20, 50)} | {(20, k, 10.0) for k in (1, 5, 10)}
                      | {(20, 5, v) for v in (1.0, 5.0, 10.0)})
    base = load_config(fs.base_config("full"))
    assert base.data.dataset == "cifar10" and base.model.name == "resnet18_gn"
    choice = DatasetChoice("digits", "mlp2", 1438, "test")
    for s in settings:
        cfg = setting_config("full", s, seed=2, choice=choice)
        assert cfg.seed == 2 and cfg.training.rounds == 600 and cfg.training.batch_size == 25
        assert cfg.training.optimizer.lr == 0.1 and cfg.training.selection.kind == "all"
        assert cfg.algorithm.params["std"] == 0.01 and cfg.algorithm.params["schedule"] == "constant"
        assert cfg.algorithm.params["clip_mode"] == "per_example"
        assert cfg.data.partition == "dirichlet_quota" and cfg.data.alpha == 0.1
        assert (cfg.data.clients, cfg.training.local_steps, cfg.privacy.clip) == (s.m, s.K, s.V)
        assert cfg.algorithm.name == f"noisy_{s.algo}" and cfg.algorithm.params.get("alpha") == s.alpha
        assert cfg.data.dataset == "digits" and cfg.model.name == "mlp2"
        assert cfg.data.samples_per_client == min(500, 1438 // s.m)
    assert DatasetChoice("fashion_mnist", "lenet5", 60000, "").samples_per_client(50) == 500


def test_full_scale_dataset_fallback(monkeypatch):
    monkeypatch.setattr(fs, "_present", lambda name: name == "digits")
    choice = fs.choose_dataset("full")
    assert (choice.dataset, choice.model) == ("digits", "mlp2") and choice.n_train > 1000
    assert "cifar10 and fashion_mnist not on this machine" in choice.reason
    monkeypatch.setattr(fs, "_present", lambda name: name in ("fashion_mnist", "digits"))
    monkeypatch.setattr(fs, "load_dataset", lambda name, **kw: type("D", (), {"n_train": 60000})())
    choice = fs.choose_dataset("full")
    assert (choice.dataset, choice.model, choice.n_train) == ("fashion_mnist", "lenet5", 60000)


def test_ci_settings_and_bad_arguments(tmp_path):
    assert [s.name for s in sensitivity_settings("ci")] == ["fedavg", "fedprox-a0.01", "fedprox-a0.1", "fedprox-a1"]
    cfg = setting_config("ci", sensitivity_settings("ci")[0])
    assert (cfg.data.dataset, cfg.model.name, cfg.data.clients, cfg.training.local_steps) == ("digits", "logr", 5, 5)
    assert (cfg.training.rounds, cfg.privacy.clip, cfg.algorithm.params["std"],
            cfg.training.batch_size) == (30, 1.0, 0.01, 16)
    assert fs.choose_dataset("ci").dataset == "digits"
    with pytest.raises(ValueError, match="--scale"):
        run_sensitivity("huge", tmp_path)
    with pytest.raises(ValueError, match="--seeds"):
        run_sensitivity("ci", tmp_path, seeds=0)
    with pytest.raises(ValueError, match="--rounds"):
        run_sensitivity("ci", tmp_path, rounds=0)
    with pytest.raises(ValueError, match="couplings"):
        run_sensitivity("ci", tmp_path, couplings=("coupled", "shared"))
    with pytest.raises(ValueError, match="replacement"):
        run_sensitivity("ci", tmp_path, replacement="swap")
    assert not any(tmp_path.iterdir())  # nothing written


def test_cli_runs_the_ci_scale_and_reports_its_files(tmp_path):
    from cli_runner import cli

    code, out, err = cli("reproduce", "fdp-sensitivity", "--scale", "ci", "--out", tmp_path, "--rounds", "3",
                         "--coupled-only", "--settings", "fedavg,fedprox-a1")
    assert code == 0, err
    assert "sensitivity:" in out and (tmp_path / "sensitivity.md").is_file()
    rows = list(csv.DictReader(io.StringIO((tmp_path / "sensitivity.csv").read_text())))
    assert {r["coupling"] for r in rows} == {"coupled"} and {r["round"] for r in rows} == {"1", "2", "3"}
    assert {r["setting"] for r in rows} == {"fedavg", "fedprox-a1"}
    code, _, err = cli("reproduce", "fdp-sensitivity", "--scale", "ci", "--out", tmp_path / "y", "--settings", "nope*")
    assert code == 2 and "matches no setting" in err and not (tmp_path / "y").exists()
    code, _, err = cli("reproduce", "fdp-sensitivity", "--scale", "huge", "--out", tmp_path / "x")
    assert code == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


def test_a_second_call_reads_finished_pairs_back_and_refuses_another_experiment(tmp_path, monkeypatch):
    from cli_runner import cli

    options = dict(rounds=2, couplings=("coupled",), settings_pattern="fedavg,fedprox-a1")
    first = run_sensitivity("ci", tmp_path, **options)
    assert sorted(p.name for p in (tmp_path / "pairs").iterdir()) == ["fedavg-seed0.json", "fedprox-a1-seed0.json"]
    csv_text = first.paths["csv"].read_text()

    def no_training(*args, **kwargs):
        raise AssertionError("a finished pair was computed again")

    monkeypatch.setattr(fs, "measure_pair", no_training)
    messages: list[str] = []
    again = run_sensitivity("ci", tmp_path, progress=messages.append, **options)
    assert again.paths["csv"].read_text() == csv_text and again.pairs == first.pairs
    assert sum("finished before" in m for m in messages) == 2
    with pytest.raises(ValueError, match="holds another experiment .*rounds"):  # other --rounds: not mixed in
        run_sensitivity("ci", tmp_path, **{**options, "rounds": 3})
    with pytest.raises(ValueError, match="holds another experiment .*couplings"):
        run_sensitivity("ci", tmp_path, **{**options, "couplings": ("coupled", "independent")})

    (tmp_path / "pairs" / "fedprox-a1-seed0.json").unlink()  # a study stopped after its first pair
    code, _, err = cli("reproduce", "fdp-sensitivity", "--scale", "ci", "--out", tmp_path, "--rounds", "2",
                       "--coupled-only", "--settings", "fedavg,fedprox-a1", "--tables-only")
    assert code == 0, err
    doc = json.loads((tmp_path / "sensitivity.json").read_text())
    assert doc["complete"] is False and [p["setting"] for p in doc["pairs"]] == ["fedavg"]
    assert "INCOMPLETE" in (tmp_path / "sensitivity.md").read_text()
    code, _, err = cli("reproduce", "fdp-sensitivity", "--scale", "ci", "--out", tmp_path / "empty", "--tables-only")
    assert code == 2 and "no finished pair" in err and len(err.strip().splitlines()) == 1
