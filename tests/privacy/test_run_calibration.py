"""Noise from budgets for a planned run (dpfl.privacy.run_calibration): every mechanism's whole-run event at the
calibrated noise spends its target, never more, under the participation it was planned for."""

from __future__ import annotations

import math
import re

import dp_accounting as dpa
import numpy as np
import pytest

from dpfl.privacy.accountant import epsilon
from dpfl.privacy.budgets import ClientBudget
from dpfl.privacy.calibration import calibrate_noise_multiplier, heuristic_pfa_noise
from dpfl.privacy.events import dpsgd_event, gaussian_event, sampled_gaussian_event
from dpfl.privacy.fdp_run import NoisyRunAccounting
from dpfl.privacy.run_calibration import (PlannedRun, calibrate_run, calibration_targets,
                                          refuse_a_run_that_trains_nothing)

DELTA = 1e-5


def budgets(*eps: float, delta: float = DELTA) -> list[ClientBudget]:
    return [ClientBudget(e, delta) for e in eps]


def dpsgd_plan(**kw) -> PlannedRun:
    base = dict(mechanism="dpsgd", budgets=budgets(1.0, 4.0, 4.0, 8.0), rounds=20, records=[200, 200, 100, 400],
                batch_sizes=[16, 16, 8, 32], local_steps=[12, 12, 12, 12], local_sampling="poisson")
    return PlannedRun(**{**base, **kw})


def test_dpsgd_each_client_spends_its_own_budget_over_its_planned_steps():
    plan = dpsgd_plan(selection="fixed", k=2)
    cal = calibrate_run(plan)
    assert not cal.common and cal.participation == "expected"
    assert cal.participations == pytest.approx([10.0] * 4)  # 20 rounds x 2/4
    for i, b in enumerate(plan.budgets):
        steps = 10 * 12
        assert cal.steps[i] == steps
        z = calibrate_noise_multiplier(b.epsilon, DELTA, steps=steps, sampling="poisson",
                                       sample_rate=plan.batch_sizes[i] / plan.records[i])
        assert cal.noise[i] == z
        spent = epsilon(dpsgd_event(cal.noise[i], steps, sampling="poisson",
                                    sample_rate=plan.batch_sizes[i] / plan.records[i]), DELTA)
        assert 0.999 * b.epsilon <= spent <= b.epsilon


def test_worst_case_participation_plans_every_round_and_needs_more_noise():
    expected = calibrate_run(dpsgd_plan(selection="fixed", k=2))
    worst = calibrate_run(dpsgd_plan(selection="fixed", k=2, participation="worst_case"))
    assert worst.participations == pytest.approx([20.0] * 4) and list(worst.steps) == [240] * 4
    assert (worst.noise > expected.noise).all()
    # under full participation both plans are the same plan
    full = calibrate_run(dpsgd_plan())
    assert (calibrate_run(dpsgd_plan(participation="worst_case")).noise == full.noise).all()


@pytest.mark.parametrize("method", ["accountant", "pfa-heuristic"])
def test_an_expected_plan_of_less_than_one_participation_is_refused(method):
    """1 round with 2 of 4 clients: 0.5 planned participations (6 of a round's 12 steps). Calibrated so, no client
    could afford its first round and the run would stop before round 1, trained on nothing."""
    def refused(plan: PlannedRun) -> bool:
        cal = calibrate_run(plan)
        try:
            refuse_a_run_that_trains_nothing(plan, cal)
        except ValueError as err:
            assert re.search(r"1 round\(s\) at a participation rate of 0.5 plan each client 0.5 participations "
                             r".* less than one: no client could afford its first round", str(err)), err
            return True
        return False

    assert refused(dpsgd_plan(rounds=1, selection="fixed", k=2, method=method))
    assert calibrate_run(dpsgd_plan(rounds=1, selection="fixed", k=2, method=method)).steps.tolist() == [6] * 4
    assert not refused(dpsgd_plan(rounds=2, selection="fixed", k=2, method=method))
    assert not refused(dpsgd_plan(rounds=1, selection="fixed", k=2, participation="worst_case", method=method))
    # client 3 can afford a round (of 1 step): the run trains
    assert not refused(dpsgd_plan(rounds=1, selection="fixed", k=2, local_steps=[12, 12, 12, 1], method=method))


def test_fixed_size_local_sampling_and_the_pfa_heuristic():
    fixed = calibrate_run(dpsgd_plan(local_sampling="fixed"))
    for i, b in enumerate(dpsgd_plan().budgets):
        event = dpsgd_event(fixed.noise[i], 240, sampling="fixed", population=dpsgd_plan().records[i],
                            sample_size=dpsgd_plan().batch_sizes[i])
        assert epsilon(event, DELTA) <= b.epsilon
    heuristic = calibrate_run(dpsgd_plan(method="pfa-heuristic"))
    assert heuristic.noise[0] == heuristic_pfa_noise(1.0, DELTA, 16 / 200, 240) and list(heuristic.steps) == [240] * 4


def test_common_targets_for_the_min_and_max_epsilon_baselines():
    own = budgets(1.0, 2.0, 5.0)
    assert list(calibration_targets(own, [1.0, 2.0, 5.0], "own", True)) == [1.0, 2.0, 5.0]
    assert list(calibration_targets(own, [1.0, 20.0, 5.0], "min", True)) == [1.0] * 3  # reported, not true
    with pytest.raises(ValueError, match="exceeds the budgets of clients"):
        calibration_targets(own, [1.0, 2.0, 5.0], "max", True)
    assert list(calibration_targets(own, [1.0, 2.0, 5.0], "max", False)) == [5.0] * 3
    assert list(calibration_targets(own, [1.0, 2.0, 5.0], 0.5, True)) == [0.5] * 3


@pytest.mark.parametrize("selection, k, rate", [("all", None, None), ("fixed", 3, None), ("poisson", None, 0.25)])
def test_central_noise_spends_the_smallest_budget_over_the_rounds(selection, k, rate):
    plan = PlannedRun("central", budgets(3.0, 2.0, 9.0, 5.0, 2.5, 4.0, 8.0, 6.0), 30, selection=selection, k=k,
                      rate=rate)
    cal = calibrate_run(plan)
    assert cal.common and len(set(cal.noise)) == 1
    spent = epsilon(dpa.SelfComposedDpEvent(plan.client_level_event(cal.noise[0]), 30), DELTA)
    assert 0.999 * 2.0 <= spent <= 2.0


def test_udp_noise_per_participation_hidden_sampling_and_worst_case():
    plan = PlannedRun("udp", budgets(2.0, 3.0, 4.0, 4.0), 40, selection="poisson", rate=0.25, upload_cohort=4.0)
    cal = calibrate_run(plan)
    assert cal.participations == pytest.approx([10.0] * 4)
    spent = epsilon(dpa.SelfComposedDpEvent(gaussian_event(cal.noise[0] / 2.0), 10), DELTA)
    assert 0.999 * 2.0 <= spent <= 2.0
    worst = calibrate_run(PlannedRun("udp", plan.budgets, 40, selection="poisson", rate=0.25, upload_cohort=4.0,
                                     participation="worst_case"))
    assert epsilon(dpa.SelfComposedDpEvent(gaussian_event(worst.noise[0] / 2.0), 40), DELTA) <= 2.0
    assert worst.noise[0] == pytest.approx(2.0 * cal.noise[0], rel=1e-4)  # 4x the rounds of a Gaussian: 2x noise
    hidden = calibrate_run(PlannedRun("udp", plan.budgets, 40, selection="poisson", rate=0.25, upload_cohort=4.0,
                                      hidden_sampling=True))
    event = sampled_gaussian_event(hidden.noise[0] / 2.0, sampling="poisson", sample_rate=0.25)
    assert 0.999 * 2.0 <= epsilon(dpa.SelfComposedDpEvent(event, 40), DELTA) <= 2.0
    assert hidden.noise[0] < cal.noise[0]  # amplification by sampling: less noise for the same budget


def noisy(view: str = "upload", sigma: float | None = None) -> NoisyRunAccounting:
    eta = np.full((12, 3), 0.1)
    eta[6:] = 0.05  # rounds differ: the calibration must sum every round's mu_t^2
    return NoisyRunAccounting("fedavg", "custom", eta, clip=1.0, sigma=sigma, view=view)


@pytest.mark.parametrize("view", ["upload", "aggregate"])
@pytest.mark.parametrize("accountant", ["gdp", "rdp"])
def test_parameter_noise_sigma_spends_the_budget_over_every_round(view, accountant):
    plan = PlannedRun("param_noise", budgets(3.0, 1.5, 6.0, 2.0, 4.0), 12, accountant=accountant, noisy=noisy(view))
    cal = calibrate_run(plan)
    run = noisy(view, sigma=float(cal.noise[0]))
    events = [run.event(t, 5) for t in range(12)]  # what the run's ledger records for a client in every round
    spent = epsilon(dpa.ComposedDpEvent(events), DELTA, accountant)
    assert 0.999 * 1.5 <= spent <= 1.5
    if accountant == "gdp":  # exact: mu_comp of the f-DP block at the calibrated sigma is the target's mu
        from dpfl.privacy.gdp import gdp_mu_for

        mu = run.bounds([True] * 12, [5] * 12)["composition"]
        assert mu == pytest.approx(gdp_mu_for(1.5, DELTA), rel=1e-5)


def test_parameter_noise_expected_participation_of_fixed_cohorts():
    plan = PlannedRun("param_noise", budgets(2.0, 2.0, 2.0, 2.0), 12, accountant="gdp", selection="fixed", k=2,
                      noisy=noisy("aggregate"))
    expected = calibrate_run(plan)
    worst = calibrate_run(PlannedRun(**{**plan.__dict__, "participation": "worst_case"}))
    # GDP composes mu^2: half the rounds on average need 1/sqrt(2) of the worst case's sigma
    assert expected.noise[0] == pytest.approx(worst.noise[0] / math.sqrt(2), rel=1e-5)


def test_bad_plans_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="unlimited budgets"):
        calibrate_run(dpsgd_plan(budgets=budgets(1.0, math.inf, 1.0, 1.0)))
    with pytest.raises(ValueError, match="needs records"):
        PlannedRun("dpsgd", budgets(1.0), 3)
    with pytest.raises(ValueError, match="fixed selection needs k"):
        PlannedRun("central", budgets(1.0, 2.0), 3, selection="fixed", k=5)
    with pytest.raises(ValueError, match="participation must be one of"):
        PlannedRun("central", budgets(1.0), 3, participation="sometimes")
    with pytest.raises(ValueError, match="the PFA heuristic calibrates DP-SGD only"):
        PlannedRun("central", budgets(1.0), 3, method="pfa-heuristic")
    with pytest.raises(ValueError, match="exact only for compositions of Gaussian"):
        calibrate_run(PlannedRun("central", budgets(1.0, 2.0), 3, selection="poisson", rate=0.5, accountant="gdp"))
    # a common noise ignores unlimited clients but needs one finite budget
    cal = calibrate_run(PlannedRun("central", budgets(2.0, math.inf), 5))
    assert epsilon(dpa.SelfComposedDpEvent(gaussian_event(cal.noise[0]), 5), DELTA) <= 2.0
