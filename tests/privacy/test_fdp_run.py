"""The f-DP accounting of a Noisy-FedAvg/FedProx run: per-round events, per-client participation, cohorts, views."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpfl.privacy.fdp import COMPOSITION, PAPER_LABEL, SHIFTED, fdp_report
from dpfl.privacy.fdp_bounds import composition_mu, shifted_mu
from dpfl.privacy.fdp_run import NoisyRunAccounting
from dpfl.privacy.fdp_sensitivity import step_sizes

ETA, K, V, SIGMA = 0.01, 5, 1.0, 0.02  # the spec's T2 values: one client's shift 2VKη = 0.1


def accounting(view="upload", schedule="constant", T=20, **kw):
    return NoisyRunAccounting("fedavg", schedule, step_sizes(schedule, ETA, T, K), V, SIGMA, view=view, **kw)


def test_round_events_are_the_gaussian_of_the_view():
    up = accounting("upload")
    assert up.event(0, 100).noise_multiplier == pytest.approx(SIGMA / 0.1)  # σ over 2VKη, whatever the cohort
    assert up.event(3, 7).noise_multiplier == pytest.approx(SIGMA / 0.1)
    agg = accounting("aggregate")
    # the average moves by 0.1/m over σ/√m: μ = 0.1/(σ√m) = 0.5 at m = 100 (T2's μ_1)
    assert 1 / agg.event(0, 100).noise_multiplier == pytest.approx(0.5)
    assert 1 / agg.event(0, 25).noise_multiplier == pytest.approx(1.0)  # fewer uploads, less noise to hide in
    honest = accounting("aggregate", honest_clients=25)
    assert 1 / honest.event(0, 100).noise_multiplier == pytest.approx(1.0)  # only 25 noises unknown
    with pytest.raises(ValueError, match="at least one upload"):
        up.event(0, 0)


def test_full_participation_equals_the_accountant_on_the_same_schedule():
    for view, release, L in (("upload", "transcript", None), ("aggregate", "final", 1.0)):
        acc = NoisyRunAccounting("fedavg", "stagewise", step_sizes("stagewise", ETA, 50, K), V, SIGMA, view=view,
                                 release=release, smoothness_L=L)
        mus = acc.bounds(np.ones(50, bool), [100] * 50)
        ref = fdp_report(algo="fedavg", schedule="stagewise", eta=ETA, K=K, V=V, sigma=SIGMA, m=100, rounds=[50],
                         L=L, view=view, release=release)
        assert mus[COMPOSITION] == pytest.approx(ref.curve(COMPOSITION).mu[-1], rel=1e-12)
        if L is not None:
            assert mus[SHIFTED] == pytest.approx(ref.curve(SHIFTED).mu[-1], rel=1e-12)
            assert mus[SHIFTED] < mus[COMPOSITION]  # decaying steps: the last iterate leaks less (spec T4)
        else:
            assert SHIFTED not in mus


def test_rounds_sat_out_cost_nothing_and_cohorts_change_the_noise():
    acc = accounting("aggregate", release="final", smoothness_L=1.0, T=6)
    part = np.array([1, 0, 1, 1, 0, 1], bool)
    cohorts = [100, 100, 50, 50, 25, 25]
    gamma, rho = acc.normalised(part, cohorts)
    expected = 0.1 / (SIGMA * np.sqrt(cohorts))  # γ̃_t = one client's shift / (σ√m_t)
    np.testing.assert_allclose(gamma, np.where(part, expected, 0.0), rtol=1e-12)
    s = SIGMA / np.sqrt(cohorts)
    np.testing.assert_allclose(rho, acc.rho[:6] * np.concatenate([[1.0], s[:-1] / s[1:]]), rtol=1e-12)
    mus = acc.bounds(part, cohorts)
    assert mus[COMPOSITION] == pytest.approx(math.sqrt(np.sum(expected[part] ** 2)), rel=1e-12)
    assert mus[SHIFTED] == pytest.approx(shifted_mu(gamma, rho)[-1], rel=1e-12)
    assert acc.bounds(np.zeros(6, bool), cohorts)[COMPOSITION] == 0.0


def test_report_per_client_headline_and_labels():
    acc = accounting("aggregate", release="final", smoothness_L=1.0, T=10)
    part = np.ones((3, 10), bool)
    part[2, 5:] = False  # client 2 sat out the last five rounds
    rep = acc.report(part, [3] * 10, [[1e-5], [1e-5, 1e-3], [1e-5]], 10)
    c0, c1, c2 = rep["clients"]
    assert c0["headline"] == SHIFTED and c0["mu"] == c1["mu"] and c2["rounds_participated"] == 5
    assert c0["bounds"][COMPOSITION]["mu"] == pytest.approx(composition_mu(acc.normalised(part[0], [3] * 10)[0])[-1])
    assert set(c1["epsilon"]) == {"1e-05", "0.001"} and c1["epsilon"]["0.001"] < c1["epsilon"]["1e-05"]
    assert rep["mu_max"] == max(c["mu"] for c in rep["clients"])
    assert c0["rdp"]["2.0"] == pytest.approx(c0["mu"] ** 2)  # ζμ²/2 at ζ = 2
    claimed = rep["paper_claimed"]
    assert claimed["label"] == PAPER_LABEL and claimed["is_guarantee"] is False
    assert any("did NOT declare secure_aggregation" in a for a in rep["assumptions"])
    assert accounting("upload").report(np.ones((1, 5), bool), [3] * 5, [[1e-5]], 5)["paper_claimed"] is None
    assert any("partial participation" in w for w in rep["warnings"])
    assert not any("partial" in w for w in acc.report(np.ones((2, 10), bool), [2] * 10, [[1e-5]] * 2, 10)["warnings"])
    steep = NoisyRunAccounting("fedavg", "cyclic", step_sizes("cyclic", 0.5, 3, K), V, SIGMA, view="upload",
                               smoothness_L=4.0)
    assert any("ηL <= 1" in w for w in steep.warnings())


def test_fedprox_and_validation():
    steps = step_sizes("constant", 0.1, 4, 5)
    prox = NoisyRunAccounting("fedprox", "constant", steps, 1.0, 0.1, view="aggregate", alpha=2.0, smoothness_L=1.0)
    assert prox.gamma_one[0] / 100 == pytest.approx(6.7232e-3, rel=1e-4)  # spec T3's exact K-dependent γ at m = 100
    assert prox.rho[0] == pytest.approx(1.40951, rel=1e-5)
    with pytest.raises(ValueError, match="resolved"):
        accounting("auto")
    with pytest.raises(ValueError, match="release"):
        accounting(release="last")
    with pytest.raises(ValueError, match="σ must be > 0"):
        NoisyRunAccounting("fedavg", "constant", steps, 1.0, 0.0, view="upload")
    with pytest.raises(ValueError, match="one cohort size"):
        accounting().normalised([True, True], [3])
