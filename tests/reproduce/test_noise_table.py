"""The round-1 noise-statistic table (thesis Table 3.4): same uploads for the shared-calibration methods."""

from __future__ import annotations

import pytest

from dpfl.experiment.build import build_demo_config
from dpfl.experiment.config import apply_overrides, config_to_dict, validate_config
from dpfl.reproduce.noise_table import round1_noise_statistics, write_noise_table


def _cfg(*overrides: str):
    base = ("data.clients=5", "privacy.budgets=[0.5,1.0,2.0,4.0,8.0]", "training.rounds=20",
            "training.local_epochs=null", "training.local_steps=4", "model.name=logr",
            "algorithm={name: robust_hdp}")
    return validate_config(apply_overrides(config_to_dict(build_demo_config()), (*base, *overrides)))


@pytest.fixture(scope="module")
def stats():
    return round1_noise_statistics(_cfg())


def test_the_oracle_minimises_the_analytic_statistic_and_min_eps_is_noisiest(stats):
    analytic = {m: s["noise_stat_analytic"] for m, s in stats.items()}
    assert all(analytic["oracle"] <= v * (1 + 1e-9) for v in analytic.values())
    # everyone at the smallest epsilon with uniform weights is noisier than uniform weights at own epsilons
    assert analytic["min_eps"] > analytic["fedavg"] > analytic["weiavg"] > analytic["oracle"]
    assert all(s["noise_stat_empirical"] > 0 for s in stats.values())


def test_the_statistic_depends_on_the_planned_length(stats):
    longer = round1_noise_statistics(_cfg("training.rounds=80"), methods=("fedavg",))
    assert longer["fedavg"]["noise_stat_analytic"] > 1.5 * stats["fedavg"]["noise_stat_analytic"]


def test_table_files_are_written_and_cached(tmp_path, stats):
    computed = []
    cfgs = {"digits-5": _cfg()}
    csv_path, md_path = write_noise_table(cfgs, tmp_path, label="test", on_setting=computed.append)
    both = ["digits-5 (dp_accounting)", "digits-5 (classic)"]
    assert computed == both
    text = md_path.read_text()
    assert "| digits-5 | dp_accounting |" in text and "| digits-5 | classic |" in text and "Ratio to the oracle" in text
    assert "Setting-conversion pairs computed by: dpfl " in text
    assert "(2 setting-conversion pairs). Written by: dpfl " in text
    assert len(csv_path.read_text().splitlines()) == 1 + 2 * 5
    write_noise_table(cfgs, tmp_path, label="test", on_setting=computed.append)
    assert computed == both  # cached: not recomputed
    write_noise_table({"digits-5": _cfg("seed=1")}, tmp_path, on_setting=computed.append)
    assert computed == both + both  # a different config is recomputed


def test_the_classic_conversion_buys_more_noise_each_the_smallest_that_meets_the_budget(stats):
    """The thesis code's conversion min_α [RDP(α) + log(1/δ)/(α−1)] is looser than dp-accounting's, so every client
    gets more noise for the same ε and every method's statistic grows; each classic z is the smallest multiple of
    0.01 meeting the target under that conversion (the RHDP code rounded sigma up to 2 decimals)."""
    from dpfl.experiment.build import build_run
    from dpfl.privacy.events import dpsgd_event
    from dpfl.privacy.two_stage import epsilon
    from dpfl.reproduce.noise_table import classic_noise

    run = build_run(_cfg())
    z = classic_noise(run)
    assert (z > run.noise).all()
    plan = run.planned_run("dpsgd")
    assert list(plan.participations()) == [20] * 5  # everyone every round: 20 rounds of 4 steps
    for i, zi in enumerate(z):
        event = lambda v, i=i: dpsgd_event(v, 20 * plan.local_steps[i], sampling="poisson",  # noqa: E731
                                           sample_rate=plan.batch_sizes[i] / plan.records[i])
        target, delta = plan.budgets[i].epsilon, plan.budgets[i].delta
        assert abs(zi * 100 - round(zi * 100)) < 1e-9
        assert epsilon(event(zi), delta, "classic") <= target < epsilon(event(zi - 0.01), delta, "classic")
    classic = round1_noise_statistics(_cfg(), conversion="classic")
    for m, s in stats.items():
        assert classic[m]["noise_stat_analytic"] > s["noise_stat_analytic"]
        assert classic[m]["z_mean"] > s["z_mean"]


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="no round-1 noise statistic"):
        round1_noise_statistics(_cfg(), methods=("pfa",))
