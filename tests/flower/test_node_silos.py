"""The user's own files on a Flower federation: each node reads only its own silo (node config `silo`) and checks it
against the declared schema; the server reads only the test file and calibrates for the record counts the nodes
report; the run equals `dpfl run` of the same config (issue 65, item 1: "each node reads only its own file")."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

import torch  # noqa: E402

from cli_runner import cli  # noqa: E402
from dpfl.data import silo_files  # noqa: E402
from dpfl.data.errors import DataError  # noqa: E402
from dpfl.engine import params as P  # noqa: E402
from dpfl.experiment.build import build_run, build_run_on_nodes  # noqa: E402
from dpfl.experiment.config import ConfigError, config_to_yaml, load_config  # noqa: E402
from dpfl.experiment.federated_run import RemoteRound  # noqa: E402
from dpfl.flower import client_app  # noqa: E402
from dpfl.flower.client_app import client_side, client_upload  # noqa: E402
from dpfl.flower.protocol import TrainPlan  # noqa: E402

from .helpers import ROOT  # noqa: E402

HOSPITALS = ROOT / "configs" / "hospitals"
SETS = ["training.rounds=3", "evaluation.every=1"]


@pytest.fixture
def sites(tmp_path: Path) -> dict[str, Path]:
    """Each hospital's CSV in a folder of its own (its machine), the test CSV and the config on the server's: the
    config's silo paths name files that are not on the server."""
    out = {}
    for name in ("a", "b", "c"):
        (tmp_path / f"node_{name}").mkdir()
        out[name] = shutil.copy(HOSPITALS / f"hospital_{name}.csv", tmp_path / f"node_{name}" / f"hospital_{name}.csv")
    server = tmp_path / "server"
    server.mkdir()
    shutil.copy(HOSPITALS / "test.csv", server / "test.csv")
    text = (HOSPITALS / "hospitals.yaml").read_text().replace("    - hospital_", "    - elsewhere/hospital_")
    (server / "hospitals.yaml").write_text(text)
    out["server_config"] = server / "hospitals.yaml"
    return out


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The files `read_records` opens, in order."""
    seen: list[str] = []
    real = silo_files.read_records

    def spy(source, *args, **kwargs):
        seen.append(Path(source).name)
        return real(source, *args, **kwargs)

    for module in ("dpfl.data.silo_files", "dpfl.data.silos", "dpfl.experiment.build"):
        monkeypatch.setattr(f"{module}.read_records", spy)
    client_app._BUILT.clear()
    return seen


def test_the_server_reads_only_the_test_file_and_calibrates_for_the_reported_counts(sites, reads):
    cfg = load_config(sites["server_config"], SETS)
    simulated = build_run(load_config(HOSPITALS / "hospitals.yaml", SETS))
    counts = [int(n) for n in simulated.n_records]
    reads.clear()
    run = build_run_on_nodes(cfg, counts)
    assert reads == ["test.csv"]
    assert run.n_records.tolist() == counts
    np.testing.assert_array_equal(run.noise, simulated.noise)  # the same calibration as the simulation's
    with pytest.raises(RuntimeError, match="on the clients' nodes"):
        run.pooled  # noqa: B018 -- the server never trains a client itself
    with pytest.raises(ConfigError, match="data.test: in a federation the server evaluates"):
        build_run_on_nodes(load_config(sites["server_config"], [*SETS, "data.test=null",
                                                                "data.client_test_fraction=0.2"]), counts)


def test_a_node_reads_only_its_own_silo(sites, reads):
    yaml_text = config_to_yaml(load_config(sites["server_config"], SETS))
    side = client_side(yaml_text, 1, str(sites["b"]))
    assert reads == ["hospital_b.csv"]
    reference = build_run(load_config(HOSPITALS / "hospitals.yaml", SETS)).data.clients[1]
    assert torch.equal(side.x, reference.x_train) and torch.equal(side.y, reference.y_train)


def test_a_node_without_its_silo_or_with_a_bad_one_cannot_take_part(sites, tmp_path: Path):
    yaml_text = config_to_yaml(load_config(sites["server_config"], SETS))
    with pytest.raises(ValueError, match=r"start the SuperNode with --node-config 'partition-id=0 silo=\"PATH\"'"):
        client_side(yaml_text, 0, None)
    bad = tmp_path / "bad.csv"
    bad.write_text(Path(sites["a"]).read_text().replace("smoker", "smokes"))
    with pytest.raises(DataError, match="bad.csv"):
        client_side(yaml_text, 0, str(bad))
    with pytest.raises(ValueError, match="partition-id 3 is not a client of this config"):
        client_side(yaml_text, 3, str(sites["a"]))
    demo = config_to_yaml(load_config(ROOT / "examples" / "flower" / "dpfl_config.yaml"))
    with pytest.raises(ValueError, match="split by dpfl"):
        client_side(demo, 0, str(sites["a"]))


class NodesInProcess:
    """`FederatedRun.remote_clients` answered by each node's own ClientSide (what the ClientApp runs), with the run
    seed shared: the messages left out, the computation of a Flower federation."""

    def __init__(self, yaml_text: str, silos: list[str]) -> None:
        self.yaml_text, self.silos = yaml_text, silos

    def round(self, run, r: int, w: P.Params, ids: list[int]) -> RemoteRound:
        rows, steps, noise = [], [], []
        for i in ids:
            side = client_side(self.yaml_text, i, self.silos[i])
            plan = TrainPlan(r, i, len(side.x), int(run.batch_sizes[i]), float(run.noise[i]), -1.0, run.seed,
                             int(run.max_elements), self.yaml_text)
            upload, s, n = client_upload(side, plan, w, run.seed)
            rows.append(upload)
            steps.append(s)
            noise.append(n)
        return RemoteRound({k: torch.cat([row[k] for row in rows]) for k in w}, steps, noise)


def test_a_federation_on_the_nodes_silos_equals_dpfl_run(sites):
    """Node counts, node uploads, server aggregation: the accuracies, the ledger and the model of `dpfl run` (float
    tolerance: a lone client's reductions may round differently from a cohort's, tests/flower/test_client.py)."""
    cfg = load_config(sites["server_config"], SETS)
    silos = [str(sites[k]) for k in ("a", "b", "c")]
    yaml_text = config_to_yaml(cfg)
    counts = [len(client_side(yaml_text, i, silos[i]).x) for i in range(3)]
    run = build_run_on_nodes(cfg, counts)
    run.remote_clients = NodesInProcess(yaml_text, silos)
    got = run.run()
    want = build_run(load_config(HOSPITALS / "hospitals.yaml", SETS)).run()
    assert [row["test_accuracy"] for row in got.history] == pytest.approx(
        [row["test_accuracy"] for row in want.history], abs=1e-6)
    assert got.spent() == pytest.approx(want.spent(), abs=1e-9)
    for name in want.params:
        torch.testing.assert_close(got.params[name], want.params[name], atol=1e-5, rtol=1e-5)


def test_the_guide_gives_each_node_its_silo(sites, monkeypatch, tmp_path: Path):
    real = HOSPITALS / "hospitals.yaml"
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("flower", "guide", "--config", str(real), "--port", "19000")
    assert code == 0, err
    for i, name in enumerate("abc"):
        path = (HOSPITALS / f"hospital_{name}.csv").resolve()
        assert f"--node-config 'partition-id={i} silo=\"{path}\"'" in out
    assert f'nodes=3 out=\\"$OUT\\" config=\\"{real.resolve()}\\"' in out
    code, _, err = cli("flower", "guide", "--config", str(real), "--nodes", "2")
    assert code == 2 and "--nodes 2, but hospitals.yaml lists 3 silos" in err
