"""The PRV accountant (dpfl.privacy.prv, Gopi, Lee, Wutschitz 2021) against PLD and RDP, its add direction, its
calibration, its ledger and its refusals.

The grid: 200 fixed (q, z, steps, delta) cases, drawn once (seed 68) from q in [1e-3, 1] (1: no sampling), z in [0.5,
20], steps in [1, 4000], delta in [1e-7, 1e-3], the ranges dpfl's configs use. On every case PRV's interval [lower,
upper] must contain PLD's epsilon (exact GDP's without sampling) up to PLD's own rounding (PLD is an upper bound, so
lower <= PLD; PLD's pessimistic grid is within 1e-3 of the truth here, so PLD <= upper + 1e-3): PRV's upper bound is
then within its stated error (upper - lower) of PLD. RDP is an upper bound too, so upper <= RDP + (upper - lower); in
fact upper <= RDP + eps_error (PRV's estimate never exceeds RDP). The full grid is in the integration tier (PLD takes
~1 s a case); the default tier runs every 20th case.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest

from dpfl.privacy import PrivacyLedger, calibrate_noise_multiplier, delta_for, dpsgd_event, epsilon
from dpfl.privacy import prv as prv_lib
from dpfl.privacy.prv import PRV_EPS_ERROR, _AddDirection, _truncated_mean, check_prv_supports, prv_bounds

pytestmark = pytest.mark.usefixtures("quiet_absl")

QS = (1e-3, 4e-3, 0.01, 0.03, 0.1, 0.3, 1.0)
ZS = (0.5, 0.7, 1.0, 1.5, 2.5, 5.0, 20.0)
STEPS = (1, 10, 100, 1000, 4000)
DELTAS = (1e-7, 1e-5, 1e-3)
_ALL = list(itertools.product(QS, ZS, STEPS, DELTAS))
GRID = [_ALL[i] for i in np.sort(np.random.default_rng(68).choice(len(_ALL), 200, replace=False))]
PLD_ROUNDING = 1e-3  # PLD's pessimistic discretisation (1e-4 per loss, or the coarser grid of its memory budget)


def _event(q, z, steps):
    if q == 1.0:
        return dpsgd_event(z, steps, sampling="full")
    return dpsgd_event(z, steps, sampling="poisson", sample_rate=q)


def test_the_grid_has_200_cases_spanning_the_ranges():
    assert len(GRID) == len(set(GRID)) == 200
    for axis, values in zip(zip(*GRID, strict=True), (QS, ZS, STEPS, DELTAS), strict=True):
        assert set(axis) == set(values)  # every value of every axis occurs


def _check_case(q, z, steps, delta):
    event = _event(q, z, steps)
    b = prv_bounds(event, delta)
    # without sampling the exact GDP epsilon is the reference (PLD's grid coarsens for epsilons in the thousands)
    pld = epsilon(event, delta, "gdp" if q == 1.0 else "pld")
    rdp = epsilon(event, delta, "rdp")
    case = (q, z, steps, delta, b, pld, rdp)
    assert 0.0 <= b.lower <= b.estimate <= b.upper, case
    # the mesh is coarsened only for large epsilons (above ~35 on this grid), its error then within 0.1% of epsilon
    assert b.eps_error == PRV_EPS_ERROR or (b.upper > 20 and b.eps_error <= 1e-3 * b.upper), case
    assert b.lower <= pld * (1 + 1e-9) + 1e-12, case  # PLD is an upper bound of the true epsilon >= lower
    assert pld <= b.upper + PLD_ROUNDING, case
    assert abs(b.upper - pld) <= (b.upper - b.lower) + PLD_ROUNDING, case  # within PRV's stated error of PLD
    assert b.upper <= rdp + b.eps_error * (1 + 1e-9), case  # never above RDP by more than the error
    assert epsilon(event, delta, "prv") == b.upper  # what dpfl reports: the upper bound


@pytest.mark.parametrize("case", GRID[::20], ids=str)
def test_prv_within_its_error_of_pld_and_below_rdp_on_a_twentieth_of_the_grid(case):
    _check_case(*case)


@pytest.mark.integration
def test_prv_within_its_error_of_pld_and_below_rdp_on_the_200_case_grid():
    for case in GRID:
        _check_case(*case)


def test_add_direction_is_a_privacy_loss_variable_and_its_mean_is_exact():
    """A PRV Y of (P, Q) has E[exp(-Y)] = 1 (E_P[Q/P]); the add direction's support ends at -log(1-q); its
    truncated mean (quadrature over the Gaussian sample) equals the mean of its own fine discretisation."""
    for q, z in ((0.01, 1.0), (0.2, 0.7), (0.5, 3.0)):
        prv = _AddDirection(q, z)
        top = -math.log1p(-q)
        t = np.linspace(-60.0, top, 2_000_001)
        mass = prv.probability(t[:-1], t[1:])
        mid = 0.5 * (t[:-1] + t[1:])
        assert float(mass.sum()) == pytest.approx(1.0, abs=1e-9)
        assert float((mass * np.exp(-mid)).sum()) == pytest.approx(1.0, rel=1e-6)
        assert float(prv.cdf(np.float64(top + 1e-9))) == 1.0
        a, b = -3.0, min(2.0, top)
        inside = (mid >= a) & (mid <= b)
        mean = _truncated_mean("add", q, z, a, b)
        assert mean == pytest.approx(float((mass[inside] * mid[inside]).sum() / mass[inside].sum()), abs=1e-6)


def test_both_directions_count_and_the_worse_one_is_reported():
    """Add/remove adjacency: epsilon is the larger of the two directions' (dp_accounting's PLD does the same).
    For a single step at a large q the add direction's loss is bounded by -log(1-q), the remove one's is not."""
    q, z, delta = 0.5, 0.7, 1e-3
    event = dpsgd_event(z, 1, sampling="poisson", sample_rate=q)
    directions = {}
    length = prv_lib._domain_length(0.0, ((q, z, 1),), PRV_EPS_ERROR, delta * 1e-3)
    for direction in ("remove", "add"):
        composed, used = prv_lib._compose(((direction, q, z),), [1], length, PRV_EPS_ERROR, delta * 1e-3)
        directions[direction] = prv_lib._epsilons(composed, delta, delta * 1e-3, used)
    b = prv_bounds(event, delta)
    assert b.upper == max(d[2] for d in directions.values())
    assert b.lower == max(d[0] for d in directions.values())
    assert directions["add"][1] <= -math.log1p(-q) + PRV_EPS_ERROR


def test_plain_gaussians_compose_exactly_and_match_gdp():
    """Plain Gaussians become one Gaussian of mu = sqrt(sum 1/z^2); the exact GDP epsilon lies in [lower, upper]."""
    event = dpa.ComposedDpEvent([dpsgd_event(2.0, 30, sampling="full"), dpa.GaussianDpEvent(5.0)])
    b = prv_bounds(event, 1e-5)
    exact = epsilon(event, 1e-5, "gdp")
    assert b.lower <= exact <= b.upper
    assert b.upper - b.lower <= 2 * PRV_EPS_ERROR + 2e-3  # 2 eps_error, and delta_error moves epsilon by ~1e-3


def test_signature_cache_and_trivial_events():
    event = dpsgd_event(1.0, 50, sampling="poisson", sample_rate=0.05)
    assert prv_bounds(event, 1e-5) is prv_bounds(dpa.SelfComposedDpEvent(dpsgd_event(1.0, 25, sampling="poisson",
                                                                                     sample_rate=0.05), 2), 1e-5)
    assert prv_bounds(dpa.NoOpDpEvent(), 1e-5).upper == 0.0
    assert prv_bounds(dpa.PoissonSampledDpEvent(0.0, dpa.GaussianDpEvent(1.0)), 1e-5).upper == 0.0
    assert prv_bounds(dpa.NonPrivateDpEvent(), 1e-5).upper == math.inf
    assert epsilon(dpa.GaussianDpEvent(0.0), 1e-5, "prv") == math.inf


def test_a_long_domain_coarsens_the_mesh_and_stays_an_upper_bound(monkeypatch):
    """Past PRV_MAX_POINTS the mesh (so eps_error) grows until the domain fits: the bounds stay bounds, wider."""
    event = dpsgd_event(0.8, 200, sampling="poisson", sample_rate=0.1)
    fine = prv_bounds(event, 1e-5)
    monkeypatch.setattr(prv_lib, "PRV_MAX_POINTS", 2**14)
    prv_lib._bounds.cache_clear()
    coarse = prv_bounds(event, 1e-5)
    prv_lib._bounds.cache_clear()
    assert fine.eps_error == PRV_EPS_ERROR < coarse.eps_error
    assert coarse.lower <= fine.lower and fine.upper <= coarse.upper
    assert coarse.lower <= epsilon(event, 1e-5, "pld") <= coarse.upper


def test_calibration_with_prv_reaches_the_target():
    target, delta, steps, q = 2.0, 1e-5, 300, 0.02
    z = calibrate_noise_multiplier(target, delta, steps=steps, sample_rate=q, accountant="prv", rel_tol=1e-4)
    assert epsilon(dpsgd_event(z, steps, sampling="poisson", sample_rate=q), delta, "prv") <= target
    assert epsilon(dpsgd_event(z * (1 - 2e-4), steps, sampling="poisson", sample_rate=q), delta, "prv") > target
    z_rdp = calibrate_noise_multiplier(target, delta, steps=steps, sample_rate=q, accountant="rdp", rel_tol=1e-4)
    assert z < z_rdp  # tighter accounting, less noise for the same guarantee


def test_ledger_with_heterogeneous_budgets_reports_the_upper_bound():
    ledger = PrivacyLedger(range(4), deltas=[1e-5, 1e-5, 1e-5, 1e-3], budgets=[1.0, 1.0, 3.0, 3.0], accountant="prv")
    step = dpsgd_event(1.2, 20, sampling="poisson", sample_rate=0.05)
    for r in range(3):
        ledger.record_many([0, 1, 2, 3] if r < 2 else [2, 3], r, step)
        ledger.close_round(r)
    spent = ledger.spent_array()
    bounds = ledger.prv_bounds_array()
    assert bounds.shape == (4, 4)
    np.testing.assert_array_equal(bounds[:, 2], spent)
    assert spent[0] == spent[1] == prv_bounds(dpsgd_event(1.2, 40, sampling="poisson", sample_rate=0.05), 1e-5).upper
    assert spent[2] == prv_bounds(dpsgd_event(1.2, 60, sampling="poisson", sample_rate=0.05), 1e-5).upper
    assert spent[3] < spent[2]  # a larger delta
    assert (bounds[:, 0] <= bounds[:, 1]).all() and (bounds[:, 1] <= bounds[:, 2]).all()
    assert ledger.would_exceed(0, dpsgd_event(0.3, 100, sampling="poisson", sample_rate=0.5))
    with pytest.raises(ValueError, match="needs accountant 'prv'"):
        PrivacyLedger(range(2), deltas=1e-5, accountant="rdp").prv_bounds_array()


@pytest.mark.parametrize("event", [
    dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(1.0)),
    dpa.LaplaceDpEvent(1.0),
    dpa.ZCDpEvent(0.1, 0.0),
    dpa.PoissonSampledDpEvent(0.1, dpa.LaplaceDpEvent(1.0)),
    dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), dpa.LaplaceDpEvent(1.0)]),
], ids=["fixed-size", "laplace", "zcdp", "sampled-laplace", "composed"])
def test_events_prv_cannot_account_are_refused(event):
    with pytest.raises(ValueError, match="accountant='prv' accounts Gaussian and Poisson-subsampled"):
        check_prv_supports(event)
    with pytest.raises(ValueError, match="accountant='prv'"):
        epsilon(event, 1e-5, "prv")
    ledger = PrivacyLedger(range(2), deltas=1e-5, accountant="prv")
    with pytest.raises(ValueError, match="accountant='prv'"):
        ledger.record(0, 0, event)


def test_delta_for_and_bad_arguments_are_refused():
    event = dpsgd_event(1.0, 10, sampling="poisson", sample_rate=0.1)
    with pytest.raises(ValueError, match="epsilon at a given delta only"):
        delta_for(event, 1.0, "prv")
    with pytest.raises(ValueError, match="delta must be"):
        prv_bounds(event, 0.0)
    with pytest.raises(ValueError, match="delta_error"):
        prv_bounds(event, 1e-5, delta_error=1e-5)
    with pytest.raises(ValueError, match="eps_error"):
        prv_bounds(event, 1e-5, eps_error=0.0)


def test_leaves_group_alike_mechanisms():
    gauss, sampled = [], Counter()
    event = dpa.ComposedDpEvent([dpsgd_event(1.0, 5, sampling="poisson", sample_rate=0.1),
                                 dpa.SelfComposedDpEvent(dpsgd_event(1.0, 2, sampling="poisson", sample_rate=0.1), 3),
                                 dpsgd_event(4.0, 4, sampling="full"), dpa.NoOpDpEvent()])
    assert prv_lib._leaves(event, 1, gauss, sampled)
    assert sampled == {(0.1, 1.0): 11} and gauss == [4 / 16.0]


# ---------------------------------------------------------------------------------------- config and a run
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("sets, message", [
    (["privacy.sampling=fixed", "privacy.accountant=prv"], "privacy.accountant: 'prv' cannot account fixed-size"),
    (["algorithm={name: dp_fedavg_central}", "privacy={clip: 1.0, budgets: 4, accountant: prv}",
      "training.selection={kind: fixed, k: 3}"], "privacy.accountant: 'prv' cannot account fixed-size"),
])
def test_config_refuses_what_prv_cannot_account(sets, message):
    from dpfl.experiment.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config(CONFIGS / "demo.yaml", sets)


def test_config_refuses_prv_for_private_selections():
    from dpfl.experiment.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="'prv' accounts Gaussian mechanisms only; rdpcfl's private selections"):
        load_config(CONFIGS / "rdpcfl" / "ci_digits_rotation.yaml", ["privacy.accountant=prv"])


def test_a_prv_run_end_to_end_reports_the_upper_bound_and_its_error_bars(tmp_path):
    """A tiny run (digits, 3 rounds, per-client budgets calibrated with prv): privacy.json's epsilon_spent is the
    PRV upper bound of each client's events, the `prv` block and each row carry the lower bound and estimate."""
    from cli_runner import cli

    out = tmp_path / "run"
    sets = ["name=prv", "training.rounds=3", "evaluation.every=3", "privacy.accountant=prv",
            "privacy.budgets=[1,1,2,2,2,4,4,4,8,8]"]
    args = [a for s in sets for a in ("--set", s)]
    code, text, err = cli("run", str(CONFIGS / "demo.yaml"), "--out", str(out), *args)
    assert code == 0, text + err
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["accountant"] == "prv" and privacy["meets_budgets"]
    block = privacy["prv"]
    assert block["eps_error"] == block["eps_error_nominal"] == PRV_EPS_ERROR
    assert block["delta_error_fraction"] == 1e-3 and block["reported"].startswith("upper")
    for row in privacy["clients"]:
        assert row["epsilon_prv_lower"] <= row["epsilon_prv_estimate"] <= row["epsilon_spent"] <= row["epsilon_budget"]
        assert row["epsilon_spent"] - row["epsilon_prv_lower"] <= 2 * PRV_EPS_ERROR + 2e-3
        assert row["epsilon_spent"] > 0.9 * row["epsilon_budget"]  # calibrated to (nearly) spend the budget
    assert block["epsilon_upper"] == [min(r["epsilon_spent"] for r in privacy["clients"]),
                                      max(r["epsilon_spent"] for r in privacy["clients"])]
    assert privacy["noise_calibration"]["accountant"] == "prv"
    from dpfl.results.report import write_report

    report = write_report(out).read_text()
    assert "PRV (privacy random variables" in report and "PRV error bars" in report
