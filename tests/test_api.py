"""dpfl's Python API: dpfl.run with configs and objects, the registries, and their refusals."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import dpfl
from cli_runner import cli

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("clean_registries")
CONFIG = {
    "name": "api",
    "algorithm": {"name": "dp_fedavg_local"},
    "training": {"rounds": 3, "local_steps": 2, "batch_size": 8, "optimizer": {"lr": 0.5}},
    "privacy": {"clip": 1.0, "budgets": 4.0},
}


def toy_data(n_clients: int = 3, seed: int = 0) -> dpfl.FederatedDataset:
    g = torch.Generator().manual_seed(seed)

    def part(n):
        x = torch.randn(n, 4, generator=g)
        return x, (x[:, 0] > 0).long()

    return dpfl.federated_data([part(40) for _ in range(n_clients)], test=part(60))


def test_every_exported_name_resolves_and_import_is_lazy():
    for name in dpfl.__all__:
        assert getattr(dpfl, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dpfl.nope  # noqa: B018
    # `import dpfl` alone must not import torch (the CLI's startup stays fast)
    code = "import sys, dpfl; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_outcome_is_what_the_run_directory_says(tmp_path):
    outcome = dpfl.run(ROOT / "configs" / "demo.yaml", overrides=["training.rounds=2"], out=tmp_path / "run")
    assert outcome.summary == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert outcome.privacy.clients[0].epsilon_guarantee == outcome.epsilon[0]
    assert [r["round"] for r in outcome.metrics] == [1, 2]
    assert outcome.summary["epsilon_max"] == max(outcome.epsilon)
    # resuming a finished run trains nothing and gives the same outcome
    again = dpfl.run(ROOT / "configs" / "demo.yaml", overrides=["training.rounds=2"], out=tmp_path / "run",
                     resume=True)
    assert again.summary == outcome.summary
    for name, tensor in outcome.params.items():
        assert torch.equal(again.params[name], tensor)
        assert torch.equal(dict(again.model.named_parameters())[name].detach(), tensor)


def test_own_data_and_model_objects_are_used_and_not_modified(tmp_path):
    data = toy_data()
    model = nn.Sequential(nn.Linear(4, 2))
    before = copy.deepcopy(model.state_dict())
    outcome = dpfl.run(CONFIG, data=data, model=model, out=tmp_path / "run")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # the user's module is untouched
    assert not torch.equal(outcome.params["0.weight"], before["0.weight"])  # the run trained a copy
    with torch.no_grad():
        acc = (outcome.model(data.x_test).argmax(1) == data.y_test).float().mean().item()
    assert acc == pytest.approx(outcome.final_accuracy)
    assert outcome.privacy.meets_budgets and len(outcome.epsilon) == 3


def test_torch_datasets_and_per_client_test_splits():
    g = torch.Generator().manual_seed(1)
    parts = [TensorDataset(torch.randn(20, 1, 3, 3, generator=g), torch.randint(0, 3, (20,), generator=g))
             for _ in range(4)]
    data = dpfl.federated_data([{"train": parts[0], "test": parts[1]}, {"train": parts[2], "test": parts[3]}])
    assert data.n_clients == 2 and data.input_shape == (1, 3, 3) and len(data.x_test) == 40
    assert data.n_classes == max(int(t[1].max()) for t in (p.tensors for p in parts)) + 1
    assert data.clients[0].n_test == 20


@pytest.mark.parametrize("clients, test, message", [
    ([], None, "non-empty list"),
    ([(torch.zeros(3, 2), torch.zeros(3))], None, "give a global test set"),
    ([(torch.zeros(3, 2), torch.zeros(2))], (torch.zeros(1, 2), torch.zeros(1)), "one label per sample"),
    ([(torch.zeros(3, 2), torch.tensor([0.5, 1.0, 0.0]))], (torch.zeros(1, 2), torch.zeros(1)), "class indices"),
    ([(torch.zeros(3, 2), torch.zeros(3)), (torch.zeros(3, 5), torch.zeros(3))], (torch.zeros(1, 2), torch.zeros(1)),
     "client 1 train: samples have shape"),
    ([(torch.full((3, 2), float("nan")), torch.zeros(3))], (torch.zeros(1, 2), torch.zeros(1)), "NaN"),
    ([{"training": (torch.zeros(3, 2), torch.zeros(3))}], None, "needs 'train'"),
])
def test_federated_data_refuses_what_it_cannot_use(clients, test, message):
    with pytest.raises(ValueError, match=message):
        dpfl.federated_data(clients, test=test)


@pytest.mark.parametrize("model, message", [
    (nn.Sequential(nn.Linear(4, 2), nn.BatchNorm1d(2)), "has buffers"),
    (nn.Sequential(nn.Linear(4, 3)), r"scores \[B, 2\]"),
    (nn.Sequential(nn.Linear(5, 2)), "forward pass fails"),
])
def test_a_model_breaking_the_engines_contract_is_refused_before_anything_is_written(tmp_path, model, message):
    with pytest.raises(dpfl.ConfigError, match=message):
        dpfl.run(CONFIG, data=toy_data(), model=model, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_objects_and_config_sections_must_not_both_say_what_the_data_is(tmp_path):
    with pytest.raises(dpfl.ConfigError, match="the config's data section must be left out"):
        dpfl.run({**CONFIG, "data": {"dataset": "digits", "clients": 3}, "model": {"name": "logr"}},
                 data=toy_data(), out=tmp_path / "a")
    with pytest.raises(dpfl.ConfigError, match="data.clients: the config says 5 clients, the data object has 3"):
        dpfl.run({**CONFIG, "data": {"dataset": "provided", "clients": 5}}, data=toy_data(),
                 model=nn.Linear(4, 2), out=tmp_path / "b")
    with pytest.raises(dpfl.ConfigError, match="data: dataset 'provided' means the data is passed as an object"):
        dpfl.run({**CONFIG, "data": {"dataset": "provided", "clients": 3}, "model": {"name": "logr"}},
                 out=tmp_path / "c")
    with pytest.raises(dpfl.ConfigError, match="data.partition: dataset 'provided' is passed as an object"):
        dpfl.run({**CONFIG, "data": {"dataset": "provided", "clients": 3, "partition": "shards"}},
                 data=toy_data(), model=nn.Linear(4, 2), out=tmp_path / "d")


def test_the_cli_refuses_a_config_whose_data_was_an_object(tmp_path):
    dpfl.run(CONFIG, data=toy_data(), model=nn.Linear(4, 2), out=tmp_path / "run")
    code, _, err = cli("run", tmp_path / "run" / "config.yaml", "--out", tmp_path / "again")
    assert code == 2 and err.count("\n") == 1 and "passed as an object" in err


def test_a_registered_model_is_seeded_by_the_run_seed_and_leaves_the_global_rng_alone():
    dpfl.register_model("two_layer", lambda shape, k, width=8: nn.Sequential(nn.Linear(shape[0], width), nn.ReLU(),
                                                                            nn.Linear(width, k)), options={"width": 8})
    state = torch.random.get_rng_state()
    a, b = (dpfl.build_model("two_layer", (4,), 2, seed=3) for _ in range(2))
    c = dpfl.build_model("two_layer", (4,), 2, seed=4, width=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a[0].weight, b[0].weight) and c[0].weight.shape == (5, 4)
    assert a.loss_kind == "cross_entropy"
    with pytest.raises(ValueError, match="already registered"):
        dpfl.register_model("two_layer", lambda shape, k: nn.Linear(4, k))
    with pytest.raises(ValueError, match="built-in model name"):
        dpfl.register_model("logr", lambda shape, k: nn.Linear(4, k))
    with pytest.raises(ValueError, match="unknown option"):
        dpfl.build_model("two_layer", (4,), 2, depth=3)


def registered_config(**algorithm):
    return {**CONFIG, "data": {"dataset": "digits", "clients": 4, "max_train_samples": 200},
            "model": {"name": "logr"}, "algorithm": {"name": "dp_fedavg_local", **algorithm}}


def test_a_registered_aggregator_is_the_one_that_aggregates(tmp_path):
    calls = []

    class Recording:
        def aggregate(self, global_params, uploads, view, seed, round_):
            calls.append((round_, len(view)))
            return {n: w + uploads[n].mean(0) for n, w in global_params.items()}

    dpfl.register_aggregator("recording", lambda: Recording())
    dpfl.run(registered_config(aggregator={"name": "recording"}), out=tmp_path / "run")
    assert calls == [(0, 4), (1, 4), (2, 4)]
    central = {**registered_config(aggregator={"name": "recording"}), "privacy": {"clip": 1.0, "budgets": 4.0}}
    central["algorithm"]["name"] = "dp_fedavg_central"
    with pytest.raises(dpfl.ConfigError, match="the aggregation is part of the mechanism"):
        dpfl.validate_config(central)
    dpfl.register_aggregator("not_a_step", lambda: object())
    with pytest.raises(dpfl.ConfigError, match="algorithm.aggregator: 'not_a_step' returned no server step: a server "
                                               "step must subclass dpfl.ServerStep"):
        dpfl.run(registered_config(aggregator={"name": "not_a_step"}), out=tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize("factory, message", [
    (lambda **kw: dpfl.sgd(kw["lr"], steps=kw["steps"]), "needs a DP-SGD"),
    (lambda **kw: dpfl.dpsgd(kw["lr"], 2.0 * kw["clip"], steps=kw["steps"]), "clips at 2.0"),
    (lambda **kw: dpfl.dpsgd(kw["lr"], kw["clip"], steps=kw["steps"], sampling="fixed"), "fixed sampling"),
    (lambda **kw: "not a program", "must return a LocalProgram"),
    (lambda *, lr: None, "could not be built"),
])
def test_a_registered_local_program_cannot_change_how_the_run_is_accounted(tmp_path, factory, message):
    dpfl.register_local_program("custom", factory)
    with pytest.raises(dpfl.ConfigError, match=message):
        dpfl.run(registered_config(local={"name": "custom"}), out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_cli_imports_registration_modules(tmp_path, monkeypatch):
    (tmp_path / "my_plugins.py").write_text(textwrap.dedent('''
        import torch
        import dpfl

        def blobs(*, n: int = 300, seed: int = 0):
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(n, 3, generator=g)
            y = (x.sum(1) > 0).long()
            return dpfl.ArrayDataset("blobs", x[:240], y[:240], x[240:], y[240:], n_classes=2)

        dpfl.register_dataset("blobs", blobs)
    '''))
    config = {**registered_config(), "data": {"dataset": "blobs", "clients": 3}}
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("run", path, "--import", "my_plugins", "--out", tmp_path / "run")
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["rounds_done"] == 3
    code, _, err = cli("run", path, "--import", "no_such_module", "--out", tmp_path / "other")
    assert code == 2 and err.startswith("error: --import no_such_module: ModuleNotFoundError") and err.count("\n") == 1
