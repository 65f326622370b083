"""Silos assembled into a federated dataset as a user meets it (`dpfl.federated_files`, `dpfl.federated_data`): each
silo is one client as given, the classes are declared, and every data problem is a one-line `dpfl.DataError`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dpfl
from dpfl.data import DataError, SiloSchema

SCHEMA = SiloSchema(3, {"a": "float32", "b": "float32"}, label="y")


def silo(path, rows):
    path.write_text("a,b,y\n" + "".join(f"{a},{b},{y}\n" for a, b, y in rows), encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    sizes = {"north": 30, "south": 12, "east": 7}
    paths = [silo(tmp_path / f"{name}.csv", [(*rng.normal(size=2).round(3), i % 2) for i in range(n)])
             for name, n in sizes.items()]
    return paths, silo(tmp_path / "test.csv", [(0.1, 0.2, 0), (0.3, 0.1, 1), (1, 1, 2)])


def test_each_silo_is_one_client_as_given(files):
    paths, test = files
    data = dpfl.federated_files(paths, SCHEMA, test=test)
    assert data.n_clients == 3 and data.train_sizes.tolist() == [30, 12, 7]  # never re-split
    assert data.n_classes == 3  # declared: no silo holds class 2, the model still scores it
    assert data.info["silos"] == ["north", "south", "east"] and data.info["partition"] == "provided"
    first = np.loadtxt(paths[1], delimiter=",", skiprows=1, dtype=np.float32)
    assert torch.equal(data.clients[1].x_train, torch.from_numpy(first[:, :2]))
    assert data.x_test.shape == (3, 2) and data.y_test.tolist() == [0, 1, 2]


def test_a_held_out_share_of_each_silo_is_the_test_set(files):
    paths, _ = files
    data = dpfl.federated_files(paths, SCHEMA, client_test_fraction=0.2, client_val_fraction=0.1, seed=3)
    assert [c.n_train + c.n_test + c.n_val for c in data.clients] == [30, 12, 7]
    assert [c.n_test for c in data.clients] == [6, 2, 1] and len(data.y_test) == 9
    again = dpfl.federated_files(paths, SCHEMA, client_test_fraction=0.2, client_val_fraction=0.1, seed=3)
    assert all(torch.equal(a.x_test, b.x_test) for a, b in zip(data.clients, again.clients, strict=True))


def test_what_federated_files_refuses(files, tmp_path):
    paths, test = files
    with pytest.raises(DataError, match="give a shared test file"):
        dpfl.federated_files(paths, SCHEMA)
    with pytest.raises(DataError, match="one file or folder per client"):
        dpfl.federated_files([], SCHEMA, test=test)
    tiny = silo(tmp_path / "tiny.csv", [(1, 2, 0)])
    with pytest.raises(DataError, match="tiny.csv: its 1 records leave none for training"):
        dpfl.federated_files([tiny], SCHEMA, client_test_fraction=0.6)
    broken = silo(tmp_path / "broken.csv", [(1, 2, 0), (1, "x", 1)])
    with pytest.raises(DataError, match=r"broken.csv, line 3, column 'b': 'x' is not a number"):
        dpfl.federated_files([paths[0], broken], SCHEMA, test=test)
    bad_test = silo(tmp_path / "bad_test.csv", [(1, 2, 5)])
    with pytest.raises(DataError, match=r"bad_test.csv, line 2, column 'y': label 5 is outside the 3 declared"):
        dpfl.federated_files(paths, SCHEMA, test=bad_test)


@pytest.mark.parametrize("clients, test, kwargs, message", [
    ([(np.array([["a", "b"]]), np.array([0]))], (torch.zeros(1, 2), torch.zeros(1)), {}, "client 0: x must be numbers"),
    ([(torch.zeros(2, 2), torch.tensor([0, 5]))], (torch.zeros(1, 2), torch.zeros(1)), {"n_classes": 2},
     "client 0 train: label 5 is outside the 2 classes"),
    ([(torch.zeros(2, 2), torch.zeros(2))], (torch.zeros(1, 2), torch.tensor([3])), {"n_classes": 2},
     "test: label 3 is outside the 2 classes"),
    ([(torch.zeros(2, 2), [object(), object()])], (torch.zeros(1, 2), torch.zeros(1)), {}, "labels must be numbers"),
    ([(torch.zeros(3, 2), torch.zeros(2))], (torch.zeros(1, 2), torch.zeros(1)), {}, "one label per sample"),
])
def test_federated_data_raises_dpfls_data_error(clients, test, kwargs, message):
    with pytest.raises(dpfl.DataError, match=message) as info:
        dpfl.federated_data(clients, test=test, **kwargs)
    assert "\n" not in str(info.value)


def test_a_label_the_model_has_no_score_for_is_a_label_problem(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 4, generator=g)
    data = dpfl.federated_data([(x[:20], torch.zeros(20)), (x[20:], torch.tensor([0, 1] * 9 + [2, 2]))],
                               test=(x[:5], torch.zeros(5)))
    config = {"algorithm": {"name": "fedavg"}, "privacy": {},
              "training": {"rounds": 1, "local_steps": 1, "batch_size": 8, "optimizer": {"lr": 0.1}}}
    with pytest.raises(dpfl.DataError, match=r"client 1 train has label 2, outside the model's 2 classes"):
        dpfl.run(config, data=data, model=torch.nn.Linear(4, 2), out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_silo_twice_or_as_the_test_file_and_scaling_forms(files):
    paths, test = files
    with pytest.raises(DataError, match="listed as silo 0 and 1"):
        dpfl.federated_files([paths[0], paths[0]], SCHEMA, test=test)
    with pytest.raises(DataError, match="the test file is also silo 2"):
        dpfl.federated_files(paths, SCHEMA, test=paths[2])
    with pytest.raises(DataError, match="depend on all the others"):
        dpfl.federated_files(paths, SCHEMA, test=test, scaling="standardize")
    scaled = dpfl.federated_files(paths, SCHEMA, test=test, scaling={"mean": [0.1, 0.2], "std": [2, 2]})
    plain = dpfl.federated_files(paths, SCHEMA, test=test, scaling="none")
    assert torch.allclose(scaled.x_test, (plain.x_test - torch.tensor([0.1, 0.2])) / 2)
