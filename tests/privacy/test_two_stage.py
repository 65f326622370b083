"""R-DPCFL's two-stage accounting (clustered_dpfl.md §4, required test 2)."""

import math
from itertools import pairwise

import dp_accounting as dpa
import numpy as np
import pytest

from dpfl.privacy import two_stage as ts
from dpfl.privacy.ledger import PrivacyLedger

N, B, K, E, DELTA = 1000, 32, 1, 40, 1e-4


def sgm_rdp(q: float, z: float) -> np.ndarray:
    """dp-accounting's RDP of one Poisson-subsampled Gaussian step at the spec's orders (independent of dpfl)."""
    acc = dpa.rdp.RdpAccountant(list(ts.ORDERS))
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)))
    return np.asarray(acc._rdp)


def test_the_ledger_of_a_run_is_the_analytic_sum_of_its_parts():
    z, eps_sel, n_sel = 1.3, 0.15, 5
    a = np.asarray(ts.ORDERS)
    analytic = (K * a / (2 * z**2) + K * (E - 1) * math.ceil(N / B) * sgm_rdp(B / N, z)
                + n_sel * a * eps_sel**2 / 8)
    # what a run records: round 1 (full batch), one event per later round, one per selection as it is made
    per_round = ts.training_event(z, N, B, K, 1, "full"), ts.training_event(z, N, B, K, 1, None)
    events = [per_round[0]] + [per_round[1]] * (E - 1) + [ts.selection_event(eps_sel)] * n_sel
    from dpfl.privacy.rdp_curves import RDP_CURVES

    curve = RDP_CURVES.curve(dpa.ComposedDpEvent(events), ts.ORDERS)
    assert np.allclose(curve, analytic, rtol=1e-12, atol=0)
    whole = ts.training_event(z, N, B, K, E, "full")
    assert np.allclose(RDP_CURVES.curve(dpa.ComposedDpEvent([whole, ts.selection_event(eps_sel, n_sel)]), ts.ORDERS),
                       analytic, rtol=1e-12, atol=0)
    ledger = PrivacyLedger([0], DELTA, orders=ts.ORDERS)
    for r, event in enumerate(events):
        ledger.record(0, min(r, E - 1), event)
    expected = ts.epsilon(dpa.ComposedDpEvent(events), DELTA)
    assert ledger.spent(0) == pytest.approx(expected, rel=1e-9)


def test_epsilon_falls_as_the_noise_grows():
    eps = [ts.epsilon(ts.training_event(z, N, B, K, E), DELTA) for z in (0.6, 0.8, 1.0, 1.5, 2.0, 4.0)]
    assert all(a > b for a, b in pairwise(eps))
    classic = [ts.epsilon(ts.training_event(z, N, B, K, E), DELTA, "classic") for z in (0.8, 1.5)]
    assert classic[0] > eps[1] and classic[1] > eps[3]  # the reference code's conversion is looser


@pytest.mark.parametrize("split", ["subtract", "joint"])
@pytest.mark.parametrize("conversion", ["dp_accounting", "classic"])
def test_calibration_spends_at_most_the_budget_on_the_0_01_grid(split, conversion):
    plan = ts.plan(5.0, DELTA, N, B, K, E, split=split, conversion=conversion)
    z = plan.noise_multiplier
    assert z == pytest.approx(round(z, 2)) and plan.n_sel == math.floor(0.1 * E) + 1
    assert plan.eps_sel == pytest.approx(0.03 * 5.0)

    def whole(v):
        return dpa.ComposedDpEvent([ts.training_event(v, N, B, K, E), ts.selection_event(plan.eps_sel, plan.n_sel)])

    if split == "subtract":
        assert plan.eps_clust == pytest.approx(ts.epsilon(ts.selection_event(plan.eps_sel, plan.n_sel), DELTA,
                                                          conversion))
        assert plan.eps_train == pytest.approx(5.0 - plan.eps_clust)
        train = ts.epsilon(ts.training_event(z, N, B, K, E), DELTA, conversion)
        before = ts.epsilon(ts.training_event(z - 0.01, N, B, K, E), DELTA, conversion)
        assert train <= plan.eps_train < before
    else:
        assert ts.epsilon(whole(z), DELTA, conversion) <= 5.0 < ts.epsilon(whole(z - 0.01), DELTA, conversion)
    assert plan.planned_epsilon == pytest.approx(ts.epsilon(whole(z), DELTA, conversion))
    assert plan.planned_epsilon <= 5.0


def test_a_budget_too_small_for_the_selections_is_refused():
    with pytest.raises(ValueError, match="no training budget.*selection_budget_ratio or clustering_rounds_ratio"):
        ts.plan(1.2, DELTA, 8000, 32, 1, 200)


def test_baselines_calibrate_training_alone_and_round1_options():
    plan = ts.plan(5.0, DELTA, N, B, K, E, selections=False, round1_batch=None)
    assert plan.n_sel == 0 and plan.eps_sel == 0.0 and plan.planned_epsilon <= 5.0
    single = ts.training_event(plan.noise_multiplier, N, B, K, E, None)
    assert single == dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(B / N, dpa.GaussianDpEvent(
        plan.noise_multiplier)), K * E * math.ceil(N / B))
    two = ts.plan(5.0, DELTA, N, B, K, E, selections=False)  # the full-batch round costs a little more noise
    assert two.noise_multiplier >= plan.noise_multiplier
    b1 = ts.training_event(1.0, N, B, K, E, 128)
    assert b1.events[0] == dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(128 / N, dpa.GaussianDpEvent(1.0)),
                                                   K * math.ceil(N / 128))
    assert ts.n_selections(E, selection_rounds="every_round") == E - 2


def test_a_given_selection_count_is_what_the_plan_charges():
    """`n_sel` (the reference IFCA's floor(0.1 E)) replaces the window's count in the plan and its calibration."""
    window = ts.plan(5.0, DELTA, N, B, K, E, round1_batch=None)
    fewer = ts.plan(5.0, DELTA, N, B, K, E, round1_batch=None, n_sel=window.n_sel - 1)
    assert fewer.n_sel == window.n_sel - 1 and fewer.eps_clust < window.eps_clust
    whole = dpa.ComposedDpEvent([ts.training_event(fewer.noise_multiplier, N, B, K, E, None),
                                 ts.selection_event(fewer.eps_sel, fewer.n_sel)])
    assert fewer.planned_epsilon == pytest.approx(ts.epsilon(whole, DELTA), rel=1e-12)
    with pytest.raises(ValueError, match="n_sel must be an integer >= 1"):
        ts.plan(5.0, DELTA, N, B, K, E, n_sel=0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(delta=1e-3), r"delta must be in \(0, 1/N_i\)"),
    (dict(split="half"), "split must be one of"),
    (dict(conversion="pld"), "conversion must be one of"),
    (dict(rounds=2), "rounds must be an integer >= 3"),
])
def test_bad_plans_are_clear_errors(kwargs, match):
    args = dict(eps_total=5.0, delta=DELTA, n_records=N, batch=B, local_epochs=K, rounds=E) | kwargs
    with pytest.raises(ValueError, match=match):
        ts.plan(**args)


@pytest.mark.parametrize("round1_batch, n_sel", [("full", None), (128, None), (None, math.floor(0.1 * E))])
def test_the_two_stage_plan_agrees_with_opacus_rdp_accountant(round1_batch, n_sel):
    """Spec §9 test 2's optional cross-check, for R-DPCFL's plan (full-batch round 1), a b^1 = 128 round 1 and the
    reference IFCA's single stage with floor(0.1 E) selections. Opacus composes the same schedule from its own
    subsampled-Gaussian RDP (`compute_rdp`; q = 1 is exactly alpha / (2 z^2)) plus the selections' analytic
    n_sel alpha eps_sel^2 / 8, and converts with its `get_privacy_spent`.
    - At Opacus' integer orders the curves agree to 1e-9 (the same bound, two implementations).
    - Over Opacus' default orders (the plan's are the same plus 64) the epsilons agree to 1e-5 and the plan's is
      never the smaller: the optimum is a fractional order (5.1-5.3 here), where dp-accounting's series is a little
      conservative against Opacus' (tests/privacy/test_accountant.py says why)."""
    pytest.importorskip("opacus")
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as opacus_rdp

    from dpfl.privacy.rdp_curves import RDP_CURVES

    plan = ts.plan(4.0, DELTA, N, B, K, E, round1_batch=round1_batch, n_sel=n_sel)
    z = plan.noise_multiplier

    def opacus_curve(orders):
        if round1_batch is None:
            curve = opacus_rdp.compute_rdp(q=B / N, noise_multiplier=z, steps=K * E * math.ceil(N / B), orders=orders)
        else:
            b1 = N if round1_batch == "full" else round1_batch
            curve = (opacus_rdp.compute_rdp(q=b1 / N, noise_multiplier=z, steps=K * math.ceil(N / b1), orders=orders)
                     + opacus_rdp.compute_rdp(q=B / N, noise_multiplier=z, steps=K * (E - 1) * math.ceil(N / B),
                                              orders=orders))
        return np.asarray(curve) + plan.n_sel * np.asarray(orders) * plan.eps_sel**2 / 8

    whole = dpa.ComposedDpEvent([ts.training_event(z, N, B, K, E, round1_batch),
                                 ts.selection_event(plan.eps_sel, plan.n_sel)])
    ints = [float(a) for a in range(2, 64)]
    assert np.allclose(RDP_CURVES.curve(whole, ints), opacus_curve(ints), rtol=1e-9, atol=0)
    theirs, order = opacus_rdp.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS,
                                                 rdp=opacus_curve(RDPAccountant.DEFAULT_ALPHAS), delta=DELTA)
    assert theirs <= plan.planned_epsilon <= theirs * (1 + 1e-5), order  # never below Opacus: the safe side
    assert plan.planned_epsilon <= 4.0
