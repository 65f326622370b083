"""`dpfl reproduce fedceo`: the grid against spec fedceo.md §4/§9, shared settings, and a tiny real comparison.

Grid tests only build and validate configs. The end-to-end test runs one σ_g setting of the ci grid with all
five methods for 5 rounds (one FedCEO smoothing at I = 5), 1 local epoch and 2,000 images (~30 s); it needs
Fashion-MNIST on this machine (the `fmnist` fixture skips it otherwise, as the other reproduce tests do).
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict

import pytest

from dpfl.experiment.build import build_run, resolve_budgets
from dpfl.experiment.config import config_to_dict, config_to_yaml, load_config
from dpfl.reproduce import fedceo
from dpfl.reproduce.jobs import GridError
from dpfl.reproduce.runner import OK, Outcome, run_jobs
from dpfl.reproduce.tables import COLUMNS, columns, job_row, write_results
from dpfl.results.run_files import read_metrics
from cli_runner import cli

SETTINGS = ["fmnist-mlp-sg1.0", "fmnist-mlp-sg1.5", "fmnist-mlp-sg2.0"]
METHODS = ["udp_fedavg", "ppsgd", "centaur", "fedceo_theta1", "fedceo"]
TABLE2 = {"1.0": (70.0, 1.08, 30), "1.5": (0.5, 1.04, 20), "2.0": (0.03, 1.06, 20)}  # spec §4, EMNIST/MLP rows
PERSONAL = {"ppsgd", "centaur", "fedceo_theta1", "fedceo"}


def _by(jobs, *keys):
    groups = defaultdict(list)
    for j in jobs:
        groups[tuple(getattr(j, k) for k in keys)].append(j)
    return groups




@pytest.mark.parametrize("scale", ["ci", "full"])
def test_grid_is_three_sigmas_by_five_methods(scale):
    grid = fedceo.grid(scale)
    assert grid.label == scale and grid.seeds == [0] and grid.paper == "fedceo"
    assert [s.name for s in grid.settings] == SETTINGS
    assert len(grid.jobs) == 15 and grid.all_jobs == grid.jobs
    for (setting,), jobs in _by(grid.jobs, "setting").items():
        assert [j.method for j in jobs] == METHODS
        sigma = setting.removeprefix("fmnist-mlp-sg")
        assert {j.config.privacy.noise_multiplier for j in jobs} == {float(sigma)}
        algs = {j.method: j.config.algorithm for j in jobs}
        assert algs["udp_fedavg"].name == "dp_fedavg_local" and algs["udp_fedavg"].params["weighting"] == "uniform"
        assert (algs["ppsgd"].name, algs["ppsgd"].params["alpha"]) == ("ppsgd", 1.0)
        assert (algs["centaur"].name, algs["centaur"].params["head_epochs"]) == ("centaur", 1.0)
    labels = {j.method: j.label for j in grid.jobs}
    assert labels["udp_fedavg"] == "DP-SGD clients + FedAvg (the paper's UDP-FedAvg in its dpsgd mode)"
    assert labels["fedceo_theta1"] == "ablation: constant threshold"
    # ci: the paper's EMNIST rows; full: every sigma_g searched on Fashion-MNIST's validation splits
    expected = ("NOT tuned for Fashion-MNIST" if scale == "ci" else
                "σ_g 1.0, 1.5, 2.0: chosen on the validation splits by `--scale full --search`")
    assert any(expected in n for n in grid.selection), grid.selection


@pytest.mark.parametrize("scale", ["ci", "full"])
def test_fedceo_parameters_are_the_papers_table_2_rows_unless_searched(scale):
    grid = fedceo.grid(scale)
    for job in grid.jobs:
        if job.config.algorithm.name != "fedceo":
            continue
        sigma = job.setting.removeprefix("fmnist-mlp-sg")
        searched = fedceo.SEARCHED.get(scale, {}).get(sigma)  # a sigma_g searched at this scale uses its choice
        lam, theta, interval = searched or TABLE2[sigma]
        p = job.config.algorithm.params
        assert (p["lam"], p["interval"]) == (lam, interval if scale == "full" else 5)
        assert p["theta"] == (1.0 if job.method == "fedceo_theta1" else theta)
        assert (p["layers"], p["personalize"], p["personal_staleness"]) == ("all", True, "any")


def test_full_base_is_the_papers_protocol_and_evaluates_every_smoothing_round():
    for job in fedceo.grid("full").jobs:
        c = job.config
        assert (c.data.dataset, c.data.clients, c.data.partition) == ("fashion_mnist", 100, "iid")
        assert (c.data.max_train_samples, c.data.client_test_fraction, c.data.client_val_fraction) == (60000, 0.1, 0.1)
        assert c.data.options["normalize"] == [0.2860, 0.3530]
        assert c.model.name == "mlp2"
        t = c.training
        assert (t.rounds, t.local_epochs, t.batch_size, t.optimizer.lr, t.optimizer.momentum) == (300, 30, 64, 0.1, 0.5)
        assert (t.selection.kind, t.selection.k) == ("fixed", 10)
        p = c.privacy
        assert (p.mechanism, p.unit, p.observer, p.sampling, p.clip) == ("dpsgd", "sample", "server", "poisson", 1.0)
        assert (p.budgets, p.delta, p.accountant) == (float("inf"), 1e-5, "rdp")
        every = c.evaluation.every
        assert every == 5 and t.rounds % every == 0  # the last round is evaluated
        if c.algorithm.name == "fedceo":
            interval = c.algorithm.params["interval"]
            assert all(r % every == 0 for r in range(interval, t.rounds + 1, interval))


def test_reduced_scale_is_full_but_for_rounds_and_epochs_and_uses_the_searched_values():
    full = {(j.setting, j.method): j.config for j in fedceo.grid("full").jobs}
    grid = fedceo.grid("reduced")
    assert grid.seeds == [0, 1, 2] and grid.label == "reduced"
    for job in grid.jobs:
        c = job.config
        assert (c.training.rounds, c.training.local_epochs) == (50, 1)
        f = full[(job.setting, job.method)]
        # everything else is the full setting (the FedCEO parameters come from the search)
        assert c.data == f.data and c.model == f.model and c.privacy == f.privacy
        assert c.training.model_copy(update={"rounds": 300, "local_epochs": 30}) == f.training
        if c.algorithm.name == "fedceo":
            lam, theta, interval = fedceo.SEARCHED["reduced"][job.setting.removeprefix("fmnist-mlp-sg")]
            p = c.algorithm.params
            assert (p["lam"], p["interval"], p["theta"]) == (lam, interval,
                                                             1.0 if job.method == "fedceo_theta1" else theta)
            assert 50 % interval == 0 and interval % c.evaluation.every == 0
    assert any("chosen on the validation splits" in n for n in grid.selection)


def test_the_papers_own_datasets_at_full_scale_use_their_table_2_rows():
    grid = fedceo.grid("full", datasets=["emnist", "cifar10"])
    assert [s.name for s in grid.settings] == [*(f"emnist-mlp-sg{s}" for s in fedceo.SIGMAS),
                                               *(f"cifar10-lenet-sg{s}" for s in fedceo.SIGMAS)]
    lenet = {"1.0": (85.0, 1.03, 15), "1.5": (10.0, 1.07, 10), "2.0": (0.6, 1.04, 10)}  # spec §4 Table 2
    for job in grid.jobs:
        c = job.config
        assert (c.data.clients, c.training.rounds, c.training.local_epochs,
                c.training.selection.k) == (100, 300, 30, 10)
        sigma = job.setting.rsplit("-sg", 1)[1]
        if job.setting.startswith("cifar10"):
            assert (c.data.dataset, c.model.name) == ("cifar10", "lenet5")
            rows = lenet
        else:
            assert (c.data.dataset, c.model.name, c.data.options["normalize"]) == ("emnist", "mlp2", [0.1307, 0.3081])
            rows = TABLE2
        if job.method == "fedceo":
            p = c.algorithm.params
            assert (p["lam"], p["theta"], p["interval"]) == rows[sigma]
    assert any("Table 2 row for this dataset" in n for n in grid.selection)


def test_ci_base_is_the_spec_ci_scale():
    for job in fedceo.grid("ci").jobs:
        c = job.config
        assert (c.data.clients, c.data.max_train_samples, c.data.client_test_fraction) == (20, 6000, 0.1)
        assert (c.training.selection.k, c.training.rounds, c.training.local_epochs) == (5, 20, 2)
        assert (c.training.batch_size, c.training.optimizer.lr, c.training.optimizer.momentum) == (64, 0.1, 0.5)
        assert (c.privacy.mechanism, c.privacy.budgets, c.evaluation.every) == ("dpsgd", float("inf"), 1)


@pytest.mark.parametrize("scale", ["ci", "full"])
def test_methods_of_a_setting_share_data_privacy_and_seed(scale):
    """Only the algorithm differs: same data split, DP-SGD clients, noise, budgets, model, seed."""
    grid = fedceo.grid(scale, seeds=2)
    for (setting, seed), jobs in _by(grid.jobs, "setting", "seed").items():
        assert len(jobs) == 5
        shared = []
        for j in jobs:
            d = config_to_dict(j.config)
            d.pop("name"), d.pop("algorithm")
            shared.append(d)
        assert all(s == shared[0] for s in shared), (setting, seed)
        assert {j.config.seed for j in jobs} == {seed}
        assert len({str(resolve_budgets(j.config)) for j in jobs}) == 1


def test_every_job_validates_and_is_the_base_config_with_its_overrides():
    """Each job re-runs by hand as `dpfl run BASE --set ...`; the standalone base configs are valid too."""
    for scale in ("ci", "full"):
        base = fedceo.base_config(scale)
        assert load_config(base).algorithm.name == "fedceo"
        grid = fedceo.grid(scale)
        for s in grid.settings:
            for m in s.methods:
                job = next(j for j in grid.jobs if (j.setting, j.method) == (s.name, m.name))
                again = load_config(base, [*s.overrides, *m.overrides, "seed=0", f"name={s.name}.{m.name}.seed0"])
                assert config_to_yaml(again) == config_to_yaml(job.config)


def test_reductions_selections_and_usage_errors():
    grid = fedceo.grid("full", rounds=50, methods=["fedceo", "udp_fedavg"], settings_pattern="*sg2.0")
    assert grid.label == "full (reduced: 50 rounds instead of 300)"
    assert [(j.setting, j.method) for j in grid.jobs] == [("fmnist-mlp-sg2.0", "udp_fedavg"),
                                                           ("fmnist-mlp-sg2.0", "fedceo")]
    assert len(grid.all_jobs) == 15 and {j.config.training.rounds for j in grid.all_jobs} == {50}
    with pytest.raises(GridError, match="ships fashion_mnist, emnist and cifar10"):
        fedceo.grid("full", datasets=["mnist"])
    with pytest.raises(GridError, match="--dataset cifar10 is defined at --scale full only"):
        fedceo.grid("reduced", datasets=["cifar10"])
    with pytest.raises(GridError, match="unknown method 'fedceo2'"):
        fedceo.grid("ci", methods=["fedceo2"])
    with pytest.raises(GridError, match="--scale"):
        fedceo.grid("paper")


def test_csv_columns_only_change_for_fedceo_and_robust_hdp(tmp_path):
    assert columns("pfa") == COLUMNS
    assert [c for c in columns("robust-hdp") if c != "final_test_loss"] == COLUMNS
    cols = columns("fedceo")
    assert cols.index("acc_personal_final") == cols.index("test_acc_clients_mean_final") + 1
    assert cols.index("final_val_accuracy") == cols.index("acc_personal_final") + 1
    assert [c for c in cols if c not in ("acc_personal_final", "final_val_accuracy")] == COLUMNS
    job = fedceo.grid("ci", methods=["ppsgd"]).jobs[0]
    row = job_row(Outcome(job, job.run_dir(tmp_path), OK), "ci", tmp_path, columns=cols)
    assert list(row) == cols and row["status"] == "not run" and row["acc_personal_final"] is None


def test_cli_dry_run_lists_the_fifteen_ci_jobs(tmp_path):
    code, out, err = cli("reproduce", "fedceo", "--scale", "ci", "--out", tmp_path, "--dry-run")
    assert code == 0, err
    assert out.splitlines()[0] == f"fedceo, scale ci: 15 jobs -> {tmp_path / 'runs'}"
    jobs = [line.split()[:4] for line in out.splitlines() if line.startswith("fmnist-mlp-")]
    assert [(s, m) for s, m, _, _ in jobs] == [(s, m) for s in SETTINGS for m in METHODS]
    assert {(seed, state) for _, _, seed, state in jobs} == {("0", "new")}
    assert not any(tmp_path.iterdir())
    code, _, err = cli("reproduce", "fedceo", "--scale", "ci", "--out", tmp_path, "--dry-run", "--dataset", "mnist")
    assert code == 2 and err.startswith("error: --dataset: the FedCEO grid ships fashion_mnist, emnist and cifar10")


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, fmnist):
    out = tmp_path_factory.mktemp("fedceo_ci")
    grid = fedceo.grid("ci", rounds=5, settings_pattern="fmnist-mlp-sg1.5",
                       extra=["training.local_epochs=1", "data.max_train_samples=2000"])
    outcomes = run_jobs(grid.jobs, out)
    write_results(grid, outcomes, out, command="test")
    return grid, out, outcomes


# The two tests of ci_run (the ci grid's five methods on Fashion-MNIST, ~10 s): the integration tier; FedCEO runs end
# to end in the default tier in tests/experiment/test_fedceo_smoke.py and test_cli_runs_a_job_and_writes_the_results.
@pytest.mark.integration
def test_ci_setting_runs_end_to_end_with_personal_accuracy(ci_run):
    grid, out, outcomes = ci_run
    assert [(o.job.method, o.status) for o in outcomes] == [(m, OK) for m in METHODS]
    with open(out / "results.csv", newline="") as f:
        assert next(csv.reader(f)) == columns("fedceo")
    with open(out / "results.csv", newline="") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    assert list(rows) == METHODS
    for m, r in rows.items():
        assert r["status"] == "ok" and r["setting"] == "fmnist-mlp-sg1.5" and r["seed"] == "0"
        assert 0.0 <= float(r["final_accuracy"]) <= float(r["best_accuracy"]) <= 1.0
        assert (r["rounds_run"], r["meets_budgets"]) == ("5", "True")
        assert float(r["max_epsilon_spent"]) > 0
        if m in PERSONAL:
            assert 0.0 <= float(r["acc_personal_final"]) <= 1.0, m
        else:
            assert r["acc_personal_final"] == "", m
    metrics = {o.job.method: read_metrics(o.run_dir) for o in outcomes}
    # FedCEO smooths at round 5 with thr = theta / (2 lam); before that it is udp_fedavg on the same stream
    smooth = {m: metrics[m][4] for m in ("fedceo", "fedceo_theta1")}
    assert smooth["fedceo"]["threshold"] == pytest.approx(1.04) and smooth["fedceo_theta1"]["threshold"] == 1.0
    assert all("threshold" not in r for r in metrics["fedceo"][:4])
    curve = [[r["test_accuracy"] for r in metrics[m][:4]] for m in ("udp_fedavg", "fedceo", "fedceo_theta1")]
    assert curve[0] == curve[1] == curve[2]


@pytest.mark.integration  # ci_run: see above
def test_results_md_has_the_sigma_tables(ci_run):
    _, out, _ = ci_run
    md = (out / "results.md").read_text()
    assert "**Scale: ci (reduced: 5 rounds instead of 20, overrides training.local_epochs=1 " \
           "data.max_train_samples=2000)** — spec fedceo.md §9 CI scale" in md
    assert "NOT tuned for Fashion-MNIST" in md
    assert "acc_global for udp_fedavg, fedceo_theta1 and fedceo; acc_personal for ppsgd and centaur" in md
    overview = md.split("## Overview: final global accuracy")[1].split("\n## ")[0]
    assert "| method | σ_g = 1.5 |" in overview
    assert sum(line.startswith("| ") for line in overview.splitlines()) == 1 + 5
    personal = md.split("## Personalised accuracy acc_personal")[1].split("\n## ")[0]
    assert [line.split(" | ")[0].removeprefix("| ").split(" — ")[0] for line in personal.splitlines()
            if line.startswith("| ") and "σ_g" not in line] == ["ppsgd", "centaur", "fedceo_theta1", "fedceo"]
    section = md.split("## fmnist-mlp-sg1.5\n")[1]
    assert "personal acc (final)" in section and "λ = 0.5, ϑ = 1.04, I = 5" in section
    assert "Smallest client budget" not in md  # budgets are unlimited: no such line
    for suffix in ("", "-personal"):
        assert (out / "plots" / f"fmnist-mlp-sg1.5{suffix}.png").stat().st_size > 1000


def test_cli_runs_a_job_and_writes_the_results(tmp_path, fmnist):
    code, out, err = cli("reproduce", "fedceo", "--scale", "ci", "--out", tmp_path, "--settings", "fmnist-mlp-sg2.0",
                         "--methods", "ppsgd", "--rounds", "1")
    assert code == 0, err
    assert "fedceo (ci (reduced: 1 round instead of 20)): 1 ok" in out
    with open(tmp_path / "results.csv", newline="") as f:
        [row] = list(csv.DictReader(f))
    assert (row["method"], row["status"]) == ("ppsgd", "ok") and float(row["acc_personal_final"]) >= 0
    assert json.loads((tmp_path / "runs/fmnist-mlp-sg2.0/ppsgd/seed0/summary.json").read_text())["rounds_done"] == 1


def test_a_search_of_some_sigmas_sets_only_those(monkeypatch):
    monkeypatch.setitem(fedceo.SEARCHED, "full", {"2.0": (0.5, 1.02, 30)})
    by_setting = {s.name: s.meta for s in fedceo.settings("full")}
    assert (by_setting["fmnist-mlp-sg2.0"]["lam"], by_setting["fmnist-mlp-sg2.0"]["interval"]) == ("0.5", "30")
    assert "chosen on the validation splits" in by_setting["fmnist-mlp-sg2.0"]["source"]
    assert by_setting["fmnist-mlp-sg1.0"]["lam"] == "70"  # not searched yet: the paper's EMNIST row, said so
    assert "NOT tuned" in by_setting["fmnist-mlp-sg1.0"]["source"]
    notes = fedceo.grid("full").selection  # each note says which sigma_g it covers
    assert any(n.startswith("FedCEO λ/ϑ/I on fashion_mnist, σ_g 2.0: chosen") for n in notes)
    assert any(n.startswith("FedCEO λ/ϑ/I on fashion_mnist, σ_g 1.0, 1.5: the paper's") for n in notes)


@pytest.mark.parametrize("partition, mechanism, suffix", [("shards", None, "-shards"), (None, "udp", "-udp"),
                                                          ("shards", "udp", "-shards-udp")])
def test_variants_change_only_the_partition_or_the_client_mechanism(partition, mechanism, suffix):
    """Spec §9's non-i.i.d. and `udp` variants: the default grid plus the variant's overrides, and (udp) the
    paper's UDP-FedAvg as the baseline; the paper's rows are used and labelled as not tuned for the variant."""
    default = {(j.setting, j.method): j.config for j in fedceo.grid("full").jobs}
    grid = fedceo.grid("full", partition=partition, mechanism=mechanism)
    assert [s.name for s in grid.settings] == [f"fmnist-mlp{suffix}-sg{s}" for s in fedceo.SIGMAS]
    for job in grid.jobs:
        c = job.config
        base = default[job.setting.replace(suffix, ""), job.method]
        assert c.data.partition == (partition or "iid") and c.data.shards_per_client == 2
        assert (c.privacy.mechanism, c.privacy.unit) == (("udp", "client") if mechanism else ("dpsgd", "sample"))
        assert c.privacy.noise_multiplier == base.privacy.noise_multiplier
        expected = {"udp_fedavg": "udp_fedavg" if mechanism else "dp_fedavg_local"}.get(job.method, base.algorithm.name)
        assert c.algorithm.name == expected
        if c.algorithm.name == "fedceo":  # no search of a variant is built in: the paper's EMNIST rows
            lam, theta, interval = fedceo.FEDCEO_PARAMS[job.setting[-3:]]
            assert (c.algorithm.params["lam"], c.algorithm.params["interval"]) == (lam, interval)
        strip = {"name", "algorithm", "data", "privacy"}
        assert ({k: v for k, v in config_to_dict(c).items() if k not in strip}
                == {k: v for k, v in config_to_dict(base).items() if k not in strip})
    assert all("NOT tuned for Fashion-MNIST nor for" in n for n in grid.selection)
    with pytest.raises(GridError, match="apply to fashion_mnist only"):
        fedceo.grid("full", datasets=["emnist"], partition=partition, mechanism=mechanism)


def test_variant_values_are_checked_and_the_default_is_unchanged():
    with pytest.raises(GridError, match="--partition must be one of iid, shards"):
        fedceo.grid("ci", partition="dirichlet")
    with pytest.raises(GridError, match="--mechanism must be one of dpsgd, udp"):
        fedceo.grid("ci", mechanism="central")
    explicit = fedceo.grid("full", partition="iid", mechanism="dpsgd")
    assert ([config_to_yaml(j.config) for j in explicit.jobs]
            == [config_to_yaml(j.config) for j in fedceo.grid("full").jobs])


def test_udp_variant_runs_every_method_with_client_level_accounting():
    """Every compared method runs under `udp` on shards (tiny synthetic data): the ledger is client-level, per
    upload, and equal across methods (the mechanism is the same whatever a method uploads)."""
    grid = fedceo.grid("ci", partition="shards", mechanism="udp", settings_pattern="*sg1.0")
    eps = {}
    for job in grid.jobs:
        tiny = ["data={dataset: synthetic, clients: 6, partition: shards, client_test_fraction: 0.2, "
                "client_val_fraction: 0.1, options: {n_samples: 600, n_features: 784, n_classes: 10}}",
                "training.rounds=5", "training.local_epochs=1", "training.selection={kind: fixed, k: 3}"]
        cfg = load_config(fedceo.base_config("ci"), [*grid.setting(job.setting).overrides,
                                                      *next(m for m in grid.setting(job.setting).methods
                                                            if m.name == job.method).overrides, *tiny])
        result = build_run(cfg).run()
        assert result.privacy.unit == "client" and len(result.history) == 5
        eps[job.method] = max(result.spent().values())
    assert len(set(eps.values())) == 1, eps


@pytest.mark.parametrize("mechanism, says, never", [
    (None, "the same DP-SGD clients", "client-level UDP"),
    ("udp", "the same client-level UDP clients", "DP-SGD clients at"),
])
def test_results_md_states_the_grids_client_mechanism(tmp_path, mechanism, says, never):
    grid = fedceo.grid("ci", mechanism=mechanism)
    outcomes = [Outcome(j, j.run_dir(tmp_path), "not run") for j in grid.jobs]
    _, md_path = write_results(grid, outcomes, tmp_path)
    privacy = next(line for line in md_path.read_text().splitlines() if line.startswith("- Privacy:"))
    assert says in privacy and never not in privacy
