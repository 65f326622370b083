"""Grid expansion: the right jobs, methods of a setting sharing everything but the method, honest labels.

No run here: configs are validated, never executed.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from dpfl.experiment.build import resolve_batch_sizes, resolve_budgets
from dpfl.experiment.config import ALGORITHMS, Rhdp20Budgets, config_to_dict
from dpfl.privacy.budget_distributions import RHDP_BATCH20, RHDP_EPS20
from dpfl.reproduce import pfa, robust_hdp
from dpfl.reproduce.jobs import GridError, Method, Setting, build_grid, config_dir, scale_label

PFA_METHODS = ["np_fedavg", "max_eps", "pfa", "pfa_plus", "weiavg", "fedavg", "min_eps"]
PFA_AVAILABLE = [m for m, alg in zip(PFA_METHODS, ["fedavg", "max_eps", "pfa", "pfa_plus", "weiavg",
                                                  "dp_fedavg_local", "min_eps"], strict=True) if alg in ALGORITHMS]
RHDP_METHODS = ["robust_hdp", "weiavg", "pfa", "fedavg", "min_eps", "oracle", "np_fedavg"]


def _by(jobs, *keys):
    groups = defaultdict(list)
    for j in jobs:
        groups[tuple(getattr(j, k) for k in keys)].append(j)
    return groups


def _shared_part(cfg) -> dict:
    """The config without what a method may change: its name, algorithm and (for np_fedavg/max_eps) privacy."""
    d = config_to_dict(cfg)
    for key in ("name", "algorithm", "privacy"):
        d.pop(key)
    return d


def test_pfa_full_grid_is_the_spec_main_grid_on_fmnist():
    grid = pfa.grid("full")
    assert grid.label == "full"
    assert [s.name for s in grid.settings] == [
        f"fmnist-{model}-iid-{dist}-M{m}-rdp" for model in ("logr", "cnn_pfa") for dist in ("MixGauss1", "MixGauss3")
        for m in (20, 30, 40, 50)]
    assert len(grid.jobs) == 16 * len(PFA_AVAILABLE) * 5
    assert grid.seeds == [0, 1, 2, 3, 4]
    for job in grid.jobs:
        c = job.config
        m = int(job.setting.rsplit("-M", 1)[1].split("-")[0])
        assert (c.data.clients, c.training.selection.kind, c.training.selection.k) == (m, "fixed", int(0.8 * m))
        assert c.data.max_train_samples == m * 1200 and c.data.partition == "iid"
        assert (c.training.local_steps, c.training.batch_size, c.training.rounds) == (100, 8, 100)
        assert c.seed == job.seed and c.data.dataset == "fashion_mnist"
        if c.privacy.mechanism != "none":
            assert (c.privacy.delta, c.privacy.clip) == (1e-5, 1.0)
            assert (c.privacy.calibration, c.privacy.sampling) == ("accountant", "poisson")
    heuristic = pfa.grid("full", calibration="pfa-heuristic")
    assert all(s.name.endswith("-heuristic") for s in heuristic.settings)
    assert {(j.config.privacy.calibration, j.config.privacy.sampling) for j in heuristic.jobs
            if j.config.privacy.mechanism != "none"} == {("pfa-heuristic", "fixed")}


def test_pfa_methods_are_configured_as_the_paper_compares_them():
    grid = pfa.grid("full", seeds=1)
    for (setting,), jobs in _by(grid.jobs, "setting").items():
        by_method = {j.method: j.config for j in jobs}
        assert list(by_method) == PFA_AVAILABLE
        dist = "MixGauss1" if "MixGauss1" in setting else "MixGauss3"
        assert by_method["np_fedavg"].algorithm.name == "fedavg" and by_method["np_fedavg"].privacy.mechanism == "none"
        assert by_method["max_eps"].algorithm.params["epsilon"] == 10.0
        assert by_method["max_eps"].privacy.allow_budget_violation is True
        # the smallest drawn budget: the paper's constant sits inside the small-budget component and would overspend
        assert by_method["min_eps"].algorithm.params["epsilon"] == "observed"
        assert dist in ("MixGauss1", "MixGauss3")
        assert by_method["fedavg"].algorithm.name == "dp_fedavg_local"
        assert by_method["fedavg"].algorithm.params["weighting"] == "uniform"
        p = by_method["pfa"].algorithm.params
        assert (p["split"], p["public_fraction"], p["k"], p["subspace"], p["svd_solver"]) == \
            ("top_fraction", 0.1, 1, "centered", "exact")
        for name, cfg in by_method.items():
            if name not in ("np_fedavg", "max_eps"):
                assert cfg.privacy.allow_budget_violation is False, name
    labels = {j.method: j.label for j in grid.jobs}
    assert labels["max_eps"] == "NOT private (violates budgets)"
    assert labels["min_eps"].startswith("smallest drawn ε")


def test_methods_of_a_setting_share_data_budgets_model_and_seed():
    """Everything but the method is identical, including the drawn budgets and batch sizes."""
    for grid in (pfa.grid("full", seeds=2), robust_hdp.grid("full", seeds=2)):
        for (setting, seed), jobs in _by(grid.jobs, "setting", "seed").items():
            shared = [_shared_part(j.config) for j in jobs]
            assert all(s == shared[0] for s in shared), (setting, seed)
            private = [j.config for j in jobs if j.config.privacy.mechanism != "none"]
            budgets = [[b.epsilon for b in resolve_budgets(c)] for c in private]
            assert all(b == budgets[0] for b in budgets), (setting, seed)
            assert len({c.privacy.delta for c in private}) == 1
            assert len({str(resolve_batch_sizes(c)) for c in private}) == 1
        # different seeds: different budget draws for PFA's distributions (a sanity check of the test itself)
    g = pfa.grid("full", seeds=2, settings_pattern="fmnist-logr-iid-MixGauss1-*", methods=["fedavg"])
    assert resolve_budgets(g.jobs[0].config) != resolve_budgets(g.jobs[1].config)


def test_pfa_ci_grid_is_spec_7_4():
    grid = pfa.grid("ci")
    assert grid.label == "ci" and grid.seeds == [0]
    assert {s.name for s in grid.settings} == {
        f"fmnist-{m}-iid-MixGauss1-M10-{c}" for m in ("logr", "cnn_pfa") for c in ("rdp", "heuristic")}
    assert len(grid.jobs) == 4 * len(PFA_AVAILABLE)
    for job in grid.jobs:
        c = job.config
        assert (c.data.clients, c.training.selection.k, c.data.max_train_samples) == (10, 8, 2000)
        assert (c.training.local_steps, c.training.batch_size, c.training.rounds) == (10, 8, 5)
    with pytest.raises(GridError, match="fashion_mnist only"):
        pfa.grid("ci", datasets=["mnist"])


def test_robust_hdp_full_grid_uses_the_fixed_lists_and_the_falsified_budget_setting():
    grid = robust_hdp.grid("full")
    names = [s.name for s in grid.settings]
    assert names == [f"fmnist-Dist{i}" for i in range(1, 10)] + ["fmnist-Dist5-misreport", "fmnist-Dist5-misreport-c10",
                                                                 "fmnist-Dist5-noise-only", "fmnist-Dist5-weights-only"]
    assert len(grid.jobs) == (9 * 7 + 5 + 1 + 2) * 3
    for job in grid.jobs:
        if job.setting.endswith("-only"):  # the lie's controls: tests/reproduce/test_robust_hdp_controls.py
            continue
        c = job.config
        assert (c.data.clients, c.data.client_test_fraction, c.data.max_train_samples) == (20, 0.2, 60000)
        assert (c.model.name, c.training.local_epochs, c.training.batch_size) == ("cnn_rhdp", 1, "rhdp20")
        assert (c.training.rounds, c.training.selection.kind) == (200, "all")
        if c.privacy.mechanism != "none":
            assert (c.privacy.clip, c.privacy.delta, c.privacy.sampling) == (3.0, 1e-4, "poisson")
            assert isinstance(c.privacy.budgets, Rhdp20Budgets)
            assert c.privacy.budgets.dist == job.setting.split("-")[1]
            assert [b.epsilon for b in resolve_budgets(c)] == list(RHDP_EPS20[c.privacy.budgets.dist])
    liars = [j for j in grid.jobs if j.setting == "fmnist-Dist5-misreport"]
    assert sorted({j.method for j in liars}) == sorted(robust_hdp.MISREPORT_METHODS)
    other_liar = [j for j in grid.jobs if j.setting == "fmnist-Dist5-misreport-c10"]
    assert [j.method for j in other_liar] == ["weiavg"] * 3
    eps, batch = RHDP_EPS20["Dist5"], RHDP_BATCH20  # client 10 stands in for client 0: same budget and batch size
    assert (eps[10], batch[10]) == (eps[0], batch[0])
    honest = {(j.method, j.seed): j.config for j in grid.jobs if j.setting == "fmnist-Dist5"}
    for j in liars + other_liar:  # the lie is the only difference from the honest run it is compared with
        liar = 10 if j.setting.endswith("c10") else 0
        assert (j.config.privacy.misreport.client, j.config.privacy.misreport.factor) == (liar, 10.0)
        a, b = config_to_dict(j.config), config_to_dict(honest[(j.method, j.seed)])
        a["privacy"]["misreport"] = None
        a.pop("name"), b.pop("name")
        assert a == b
    by_method = {j.method: j.config for j in grid.jobs if j.setting == "fmnist-Dist1" and j.seed == 0}
    assert list(by_method) == RHDP_METHODS
    assert (by_method["pfa"].algorithm.params["split"], by_method["pfa"].algorithm.params["k"]) == ("gmm", 1)
    assert by_method["min_eps"].algorithm.params["epsilon"] == "observed"
    assert by_method["oracle"].algorithm.name == "oracle"
    assert {j.method: j.label for j in grid.jobs}["oracle"] == "privileged reference (reads the true noise)"


def test_robust_hdp_ci_grid_is_spec_7_4():
    grid = robust_hdp.grid("ci")
    assert [s.name for s in grid.settings] == ["fmnist-Dist5", "fmnist-Dist5-misreport"]
    assert len(grid.jobs) == 7 + 5
    for job in grid.jobs:
        c = job.config
        assert (c.data.clients, c.data.max_train_samples, c.data.client_test_fraction) == (6, 1800, 0.2)
        assert (c.training.rounds, c.training.local_epochs) == (3, 1)
        assert c.training.batch_size == list(RHDP_BATCH20[:6])
        if c.privacy.mechanism != "none":
            assert c.privacy.budgets == list(RHDP_EPS20["Dist5"][:6])
            assert (c.privacy.misreport is not None) == job.setting.endswith("misreport")


def test_reductions_are_labelled_and_applied_to_every_job():
    grid = pfa.grid("full", seeds=2, rounds=30)
    assert grid.label == "full (reduced: 30 rounds instead of 100, 2 seeds instead of 5)"
    assert {j.config.training.rounds for j in grid.jobs} == {30}
    assert {j.seed for j in grid.jobs} == {0, 1}
    assert robust_hdp.grid("ci", rounds=10).label == "ci (changed: 10 rounds instead of 3)"
    assert robust_hdp.grid("full", rounds=200, seeds=3).label == "full"  # the spec's values are no change
    assert scale_label("full", spec_rounds=100, spec_seeds=5, rounds=200, seeds=1) == \
        "full (reduced: 200 rounds instead of 100, 1 seed instead of 5)"
    extra = robust_hdp.grid("ci", extra=["model.name=logr"])
    assert extra.label == "ci (reduced: overrides model.name=logr)"
    assert {j.config.model.name for j in extra.jobs} == {"logr"}


def test_selection_of_settings_and_methods():
    grid = robust_hdp.grid("full", settings_pattern="fmnist-Dist[12],*misreport", methods=["weiavg", "oracle"])
    assert sorted({j.setting for j in grid.jobs}) == ["fmnist-Dist1", "fmnist-Dist2", "fmnist-Dist5-misreport"]
    assert {j.method for j in grid.jobs} == {"weiavg", "oracle"}
    assert len(grid.jobs) == 3 * 2 * 3
    assert len(grid.all_jobs) == 213  # collection of earlier runs looks at the whole grid
    assert any("--methods weiavg,oracle" in n for n in grid.selection)
    with pytest.raises(GridError, match="unknown method 'wiavg'"):
        robust_hdp.grid("ci", methods=["wiavg"])
    with pytest.raises(GridError, match="matches no setting"):
        robust_hdp.grid("ci", settings_pattern="mnist-*")
    with pytest.raises(GridError, match="--seeds must be >= 1"):
        robust_hdp.grid("ci", seeds=0)
    with pytest.raises(GridError, match="--scale"):
        robust_hdp.grid("huge")


def test_a_method_whose_algorithm_is_missing_is_left_out_with_a_note():
    base = config_dir() / "pfa" / "ci_fmnist_logr.yaml"
    methods = (Method("fedavg", "dp_fedavg_local", ("algorithm={name: dp_fedavg_local}",)),
               Method("future", "not_an_algorithm_yet", ("algorithm={name: not_an_algorithm_yet}",)))
    grid = build_grid("x", "ci", [Setting("s", base, (), methods, "fashion_mnist")], spec_rounds=5, spec_seeds=1)
    assert [j.method for j in grid.jobs] == ["fedavg"]
    assert grid.notes == ["method future left out: this dpfl build has no algorithm 'not_an_algorithm_yet' yet"]
    with pytest.raises(GridError, match="not have yet"):
        build_grid("x", "ci", [Setting("s", base, (), methods, "fashion_mnist")], spec_rounds=5, spec_seeds=1,
                   methods=["future"])


def test_a_method_whose_algorithm_the_user_registered_is_in_the_grid(clean_registries):
    """The grid knows algorithms by the registry the configs resolve through, so a user's algorithm is one too."""
    from dpfl.algorithms.catalog.fedavg import FedAvgParams, dp_fedavg_local
    from dpfl.algorithms.registry import register_algorithm

    method = Method("mine", "my_fedavg", ("algorithm={name: my_fedavg}",))
    assert not method.available
    register_algorithm("my_fedavg", dp_fedavg_local, params=FedAvgParams)
    assert method.available


def test_mnist_settings_are_in_the_grid_when_asked_for():
    grid = robust_hdp.grid("full", datasets=["fashion_mnist", "mnist"], seeds=1)
    assert {j.config.data.dataset for j in grid.jobs if j.setting.startswith("mnist-")} == {"mnist"}
    assert len(grid.settings) == 26  # per dataset: Dist1..9, the falsified budget, its client-10 variant, 2 controls
    with pytest.raises(GridError, match="ships fashion_mnist and mnist"):
        pfa.grid("full", datasets=["cifar10"])
