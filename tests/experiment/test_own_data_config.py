"""The `data` section naming the user's own silo files, as a user writes it: filled in, checked, paths relative to the
config file, the split fields refused, fitted scaling refused with its reason, and config.yaml as given."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dpfl.experiment.config import ConfigError, config_to_yaml, load_config, validate_config

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "hospitals" / "hospitals.yaml"
SCHEMA = {"label": "y", "n_classes": 2, "features": {"a": "float32", "b": "int64"}}
REST = {"model": {"name": "logr"}, "algorithm": {"name": "fedavg"}, "privacy": {},
        "training": {"rounds": 1, "local_steps": 1, "batch_size": 4, "optimizer": {"lr": 0.1}}}


def config(**data) -> dict:
    return {"data": {"silos": ["a.csv", "b.csv"], "test": "t.csv", "schema": SCHEMA, **data}, **REST}


def refused(doc: dict) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(doc)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_silos_fill_in_the_dataset_and_the_clients(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    d = validate_config(config()).data
    assert d.dataset == "files" and d.clients == 2
    assert d.silos == [(tmp_path / "a.csv").as_posix(), (tmp_path / "b.csv").as_posix()]  # a mapping: the cwd
    assert d.test == (tmp_path / "t.csv").as_posix()


def test_paths_are_relative_to_the_config_files_folder(tmp_path, monkeypatch):
    folder = tmp_path / "study"
    folder.mkdir()
    doc = config(silos=["a.csv", {"path": "../shared/b.npz", "name": "clinic_b"}])
    (folder / "run.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    d = load_config(folder / "run.yaml", ["data.test=held/t.csv"]).data
    assert d.silos[0] == (folder / "a.csv").as_posix()
    assert d.silos[1].path == (tmp_path / "shared" / "b.npz").as_posix() and d.silos[1].name == "clinic_b"
    assert d.test == (folder / "held" / "t.csv").as_posix()


@pytest.mark.parametrize("field, value, expected", [
    ("partition", "dirichlet", "data.partition: the silos are the clients' own data, as given; nothing splits them"),
    ("alpha", 0.1, "data.alpha: the silos are the clients' own data"),
    ("max_train_samples", 10, "data.max_train_samples: the silos are the clients' own data"),
    ("options", {"normalize": True}, "data.options: the silos are the clients' own data"),
    ("clients", 3, "data.clients: one client per silo: data.silos lists 2"),
    ("dataset", "digits", "data.silos: only for the user's own silo files"),
    ("scaling", "fit", "data.scaling: scaling fitted on a client's own records makes every scaled record depend on "
                       "all the others"),
    ("scaling", "standardize", "its DP guarantee would not hold"),
    ("scaling", {"mean": [0], "std": [1, 1]}, "data.scaling.mean: needs one value per feature column (2)"),
    ("scaling", {"mean": {"b": 0, "a": 0}, "std": [1, 1]}, "a mapping must name every feature column, in the "
                                                           "schema's order"),
    ("scaling", {"mean": [0, 0], "std": [1, 0]}, "data.scaling.std: standard deviations must be > 0"),
    ("schema", None, "data.schema: given silos need a declared schema"),
    ("schema", {"n_classes": 2, "features": {"a": "float32"}, "shape": [1]}, "declare either features"),
    ("schema", {"features": {"a": "float32"}}, "data.schema.n_classes"),
    ("schema", {"n_classes": 2, "features": {"a": "text"}}, "data.schema.features.a"),
    ("schema", {"n_classes": 2, "label": "a", "features": {"a": "float32"}}, "label column is also a feature"),
    ("test", None, "data.test: the global model is evaluated on a shared test file or on a share held out"),
    ("silos", [], "data.silos"),
])
def test_what_does_not_apply_to_given_silos_is_refused_in_one_line(field, value, expected):
    assert expected in refused(config(**{field: value}))


def test_silo_fields_do_not_apply_to_a_loaded_dataset():
    doc = {**REST, "data": {"dataset": "digits", "clients": 2, "schema": SCHEMA}}
    assert "data.schema: only for the user's own silo files" in refused(doc)


def test_a_held_out_share_replaces_the_test_file():
    d = validate_config(config(test=None, client_test_fraction=0.25)).data
    assert d.test is None and d.client_test_fraction == 0.25


def test_config_yaml_records_the_data_as_given(tmp_path):
    cfg = validate_config(config(silos=["a.csv", {"path": "b.csv", "name": "clinic_b"}],
                                 scaling={"mean": [1, 2], "std": [3, 4]}))
    data = yaml.safe_load(config_to_yaml(cfg))["data"]
    assert list(data) == ["dataset", "clients", "silos", "test", "schema", "scaling"]  # no partition defaults
    assert data["schema"] == SCHEMA and data["silos"][1] == {"path": cfg.data.silos[1].path, "name": "clinic_b"}
    (tmp_path / "config.yaml").write_text(config_to_yaml(cfg), encoding="utf-8")
    assert load_config(tmp_path / "config.yaml") == cfg  # a run directory's copy reads back the same
    plain = yaml.safe_load(config_to_yaml(validate_config({**REST, "data": {"dataset": "digits", "clients": 2}})))
    assert "silos" not in plain["data"] and plain["data"]["partition"] == "iid"


def test_the_shipped_example_validates_with_a_budget_per_hospital():
    cfg = load_config(EXAMPLE)
    assert cfg.data.dataset == "files" and cfg.data.clients == 3 and cfg.privacy.budgets == [1, 3, 8]
    assert all(Path(p).exists() for p in cfg.data.silos) and Path(cfg.data.test).exists()


def test_array_and_image_silos_from_a_config(tmp_path):
    import numpy as np
    from PIL import Image

    from dpfl.experiment.build import build_data

    np.savez(tmp_path / "a.npz", x=np.zeros((6, 1, 2, 2), np.float32), y=np.array([0, 1, 0, 1, 0, 1]))
    for label, n in (("cat", 3), ("dog", 2)):
        (tmp_path / "b" / label).mkdir(parents=True)
        for i in range(n):
            Image.new("L", (2, 2), color=255).save(tmp_path / "b" / label / f"{i}.png")
    doc = {"data": {"silos": ["a.npz", {"path": "b", "name": "clinic_b"}], "client_test_fraction": 0.5,
                    "schema": {"n_classes": 2, "shape": [1, 2, 2], "classes": ["cat", "dog"]},
                    "scaling": {"mean": [0.5], "std": [0.5]}}, **REST}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    data = build_data(load_config(tmp_path / "c.yaml"))
    assert data.info["silos"] == ["a", "clinic_b"] and data.n_classes == 2 and data.input_shape == (1, 2, 2)
    assert [c.n_train + c.n_test for c in data.clients] == [6, 5] and len(data.y_test) == 3 + 2
    assert float(data.clients[1].x_train.min()) == 1.0 and float(data.clients[0].x_train.max()) == -1.0  # scaled


def test_one_node_loads_its_own_silo_alone_as_the_simulation_gives_it(tmp_path):
    import torch

    from dpfl.experiment.build import build_data, build_silo_client

    cfg = load_config(EXAMPLE, ["data.test=null", "data.client_test_fraction=0.2", "data.client_val_fraction=0.1"])
    everyone = build_data(cfg)
    for i in range(3):
        alone = build_silo_client(cfg, i)
        for split in ("x_train", "y_train", "x_test", "y_test", "x_val", "y_val"):
            assert torch.equal(getattr(alone, split), getattr(everyone.clients[i], split))
    with pytest.raises(ConfigError, match="no client 3"):
        build_silo_client(cfg, 3)
