"""f-DP accounting of Noisy-FedAvg / FedProx: the spec's reference vectors (fdp_accounting.md §9, T1–T12).

Reference values were computed independently in double precision and rounded to 6 decimals; tolerances are the
spec's (μ absolute 2e-6, ε relative 1e-6) unless a test says otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import SelfComposedDpEvent

from dpfl.privacy.accountant import epsilon
from dpfl.privacy.events import gaussian_event
from dpfl.privacy.fdp import COMPOSITION, PAPER, PAPER_LABEL, SHIFTED, fdp_report, parse_grid, resolve_view
from dpfl.privacy.fdp_bounds import composition_mu, h0_mu, paper_claimed_mu, shifted_mu, shifted_mu_nnls
from dpfl.privacy.fdp_sensitivity import c_min, sensitivities, step_sizes, z_min
from dpfl.privacy.gdp import gdp_delta, gdp_eps, gdp_log_delta, gdp_mu_for, gdp_to_rdp, rdp_classical_eps
from dpfl.privacy.rdp_curves import rdp_curve

MU, EPS = 2e-6, 1e-6
T2 = dict(eta=0.01, K=5, V=1.0, sigma=0.02, m=100, L=1.0)  # μ_1 = 0.5
GRID = [1, 10, 100, 1000, 10000, 100000]


def _tilde(sens, m=100, sigma=0.02):
    """γ̃ in the aggregate view with full participation: √m·γ/σ."""
    return math.sqrt(m) * sens.gamma / sigma


def _report(schedule="constant", rounds=GRID, paper="printed", **kw):
    args = {**T2, "algo": "fedavg", "schedule": schedule, "rounds": rounds, "view": "aggregate", "release": "final",
            "paper": paper, **kw}
    return fdp_report(**args)


# ---- T1 conversions --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mu, eps", [(0.5, 1.993091), (1, 4.377178), (2, 9.997256), (3, 16.675494), (5, 33.103732)])
def test_t1_gdp_to_epsilon(mu, eps):
    assert gdp_eps(mu, 1e-5) == pytest.approx(eps, rel=EPS)


def test_t1_other_conversions():
    assert gdp_eps(0.5, 1e-3) == pytest.approx(1.352276, rel=EPS)
    assert gdp_delta(0.0, 0.5) == pytest.approx(0.197413, abs=1e-6)
    assert gdp_mu_for(1, 1e-5) == pytest.approx(0.268051, abs=MU)
    assert gdp_mu_for(8, 1e-5) == pytest.approx(1.666031, abs=MU)
    assert rdp_classical_eps(0.5, 1e-5) == pytest.approx(2.524263, rel=EPS)
    assert rdp_classical_eps(1, 1e-5) == pytest.approx(5.298526, rel=EPS)
    assert gdp_eps(0.0, 1e-5) == 0.0 and gdp_log_delta(3.0, 0.0) == -math.inf
    assert gdp_eps(0.01, 0.5) == 0.0  # δ(0) = 2Φ(μ/2) − 1 <= δ: ε = 0
    for mu in (0.3, 1, 4, 20):  # the classical RDP conversion is never tighter than the exact one
        assert rdp_classical_eps(mu, 1e-5) >= gdp_eps(mu, 1e-5)
    with pytest.raises(ValueError):
        gdp_eps(-1, 1e-5)
    with pytest.raises(ValueError):
        gdp_eps(1, 1.5)


# ---- T2 FedAvg, constant steps ---------------------------------------------------------------------------------
def test_t2_sensitivities_and_constant_fedavg_table():
    s = sensitivities("fedavg", step_sizes("constant", 0.01, 3, 5), 1.0, 100, L=1.0)
    assert s.gamma == pytest.approx([0.001] * 3, rel=1e-12) and s.rho == pytest.approx([1.0510100501] * 3, rel=1e-10)
    r = _report()
    comp, shift, paper = (r.curve(n) for n in (COMPOSITION, SHIFTED, PAPER))
    assert comp.mu == pytest.approx([0.5, 1.581139, 5.0, 15.811388, 50.0, 158.113883], abs=MU)
    assert comp.eps[1e-5] == pytest.approx([1.993091, 7.511276, 33.103732, 191.549201, 1462.285016, 13173.351706],
                                           rel=EPS)
    assert paper.mu == pytest.approx([0.5, 1.565306, 3.148663, 3.170487, 3.170487, 3.170487], abs=MU)
    assert paper.eps[1e-5] == pytest.approx([1.993091, 7.420984, 17.756457, 17.917056, 17.917056, 17.917056], rel=EPS)
    assert shift.mu == pytest.approx(comp.mu, rel=1e-12)  # special case (i): a = 0 is optimal
    assert r.headline == SHIFTED


def test_t2_paper_value_three_ways_and_its_infeasible_lambda():
    T = 1000
    s = sensitivities("fedavg", step_sizes("constant", 0.01, T, 5), 1.0, 100, L=1.0)
    g, rho = _tilde(s), s.rho
    prefix = h0_mu(g, rho)
    ell = 5 * math.log1p(0.01)
    closed = 0.5 * np.sqrt(np.tanh(np.arange(1, T + 1) * ell / 2) / math.tanh(ell / 2))
    eq_a = paper_claimed_mu("fedavg", "constant", np.arange(1, T + 1), **T2)
    assert prefix == pytest.approx(closed, rel=1e-9) and eq_a == pytest.approx(closed, rel=1e-9)
    limit = 0.5 / math.sqrt(math.tanh(ell / 2))
    assert limit == pytest.approx(3.170487, abs=MU)
    assert (2 / (10 * 0.02)) * math.sqrt(2 * 0.01 * 5 / 1) == pytest.approx(3.162278, abs=MU)  # small-ηKL approx.
    # T = 2: H0 is below composition, and only because λ_1 = ρ(1+ρ)/(1+ρ²) > 1 (infeasible)
    assert prefix[1] == pytest.approx(0.706888, abs=MU) and composition_mu(g)[1] == pytest.approx(0.707107, abs=MU)
    r0 = rho[0]
    assert r0 * (1 + r0) / (1 + r0**2) == pytest.approx(1.024237, abs=MU)


@pytest.mark.parametrize("L, expected", [(1, 2.917078), (10, 1.033918), (100, 0.515877)])
def test_t2_paper_formula_falls_as_L_grows_while_composition_does_not(L, expected):
    r = _report(rounds=[50], L=float(L))
    assert r.curve(PAPER).mu[0] == pytest.approx(expected, abs=MU)
    assert r.curve(COMPOSITION).mu[0] == pytest.approx(3.535534, abs=MU)


def test_t2_upload_view_is_composition_times_sqrt_m():
    r = fdp_report(algo="fedavg", schedule="constant", rounds=[100], **T2)
    assert r.view == "upload" and [c.name for c in r.curves] == [COMPOSITION]
    assert r.curve(COMPOSITION).mu[0] == pytest.approx(50.0, abs=MU)


# ---- T3 FedProx ---------------------------------------------------------------------------------------------------
def test_t3_fedprox_paper_constants():
    r = fdp_report(algo="fedprox", schedule="constant", eta=0.1, K=5, V=1.0, sigma=0.1, m=100, L=1.0, alpha=2.0,
                   rounds=[1, 10, 100, 1000], view="aggregate", release="final", sensitivity="paper", paper="printed")
    paper, comp, shift = (r.curve(n) for n in (PAPER, COMPOSITION, SHIFTED))
    assert paper.mu == pytest.approx([1.0, 1.730360, 1.732051, 1.732051], abs=MU)
    assert paper.eps[1e-5] == pytest.approx([4.377178, 8.375491, 8.385419, 8.385419], rel=EPS)
    assert comp.mu == pytest.approx([1.0, 3.162278, 10.0, 31.622777], abs=MU)
    assert comp.eps[1e-5] == pytest.approx([4.377178, 17.856587, 91.817290, 633.929851], rel=EPS)
    assert shift.mu == pytest.approx(comp.mu, rel=1e-12)


def test_t3_fedprox_exact_forms_agree_with_the_closed_form():
    eta, K, alpha, L = 0.1, 5, 2.0, 1.0
    s = sensitivities("fedprox", step_sizes("constant", eta, 1, K), 1.0, 100, L=L, alpha=alpha)
    assert s.gamma[0] == pytest.approx(6.7232e-3, rel=1e-9) and s.rho[0] == pytest.approx(1.40951, rel=1e-9)
    assert s.gamma[0] == pytest.approx(2 * (1 - (1 - eta * alpha) ** K) / (100 * alpha), rel=1e-12)
    closed_rho = alpha / (alpha - L) - (L / (alpha - L)) * (1 - eta * (alpha - L)) ** K
    assert s.rho[0] == pytest.approx(closed_rho, rel=1e-12)
    assert math.sqrt(100) * s.gamma[0] / 0.1 == pytest.approx(0.672320, abs=MU)
    assert sensitivities("fedprox", step_sizes("constant", eta, 2, K), 1.0, 100, alpha=0.0).gamma == pytest.approx(
        sensitivities("fedavg", step_sizes("constant", eta, 2, K), 1.0, 100).gamma)  # α = 0 is FedAvg


# ---- T4 stage-wise, T5 step decay, T6 other schedules ------------------------------------------------------------
def test_t4_stagewise():
    r = _report("stagewise", rounds=[1, 10, 100, 1000, 2000, 100000], paper="printed")
    assert r.curve(PAPER).mu == pytest.approx([0.5, 0.689202, 0.705337, 0.706930, 0.707018, 0.707105], abs=MU)
    assert r.curve(COMPOSITION).mu == pytest.approx([0.5, 0.622448, 0.639332, 0.641080, 0.641177, 0.641273], abs=MU)
    assert r.curve(SHIFTED).mu == pytest.approx([0.5, 0.474479, 0.279437, 0.135402, 0.106576, 0.024804], abs=MU)
    s = sensitivities("fedavg", step_sizes("stagewise", 0.01, 2000, 5), 1.0, 100, L=1.0)
    g = _tilde(s)
    assert shifted_mu(g, s.rho) == pytest.approx(h0_mu(g, s.rho), rel=1e-9)  # special case (ii)
    assert shifted_mu_nnls(g, s.rho) == pytest.approx(0.106576, abs=MU)


@pytest.mark.parametrize("T, Ts, shift, comp, h0", [(300, 100, 4.858990, 5.049752, 3.162074),
                                                    (1000, 200, 7.078773, 7.211103, 3.170487),
                                                    (2000, 1000, 15.830636, 15.890249, 3.170487)])
def test_t5_step_decay_neither_special_case(T, Ts, shift, comp, h0):
    eta = np.where(np.arange(T)[:, None] < Ts, 0.01, 0.001) * np.ones((T, 5))
    s = sensitivities("fedavg", eta, 1.0, 100, L=1.0)
    g = _tilde(s)
    assert shifted_mu(g, s.rho)[-1] == pytest.approx(shift, abs=MU)
    assert shifted_mu_nnls(g, s.rho) == pytest.approx(shift, abs=MU)
    assert composition_mu(g)[-1] == pytest.approx(comp, abs=MU) and h0_mu(g, s.rho)[-1] == pytest.approx(h0, abs=MU)


def test_t6_cyclic_and_continuous():
    s = sensitivities("fedavg", step_sizes("cyclic", 0.01, 100, 5), 1.0, 100, L=1.0)
    assert s.gamma[0] == pytest.approx(4.566667e-4, rel=1e-6) and s.rho[0] == pytest.approx(1.0230215429, rel=1e-10)
    assert (c_min(5), c_min(1), z_min(5)) == pytest.approx((1.274353, 1.442695, 3.294154), abs=MU)
    assert composition_mu(_tilde(s))[-1] == pytest.approx(2.283333, abs=MU)
    eta_consistent = _report("cyclic", rounds=[10, 100, 1000], paper="eta-consistent").curve(PAPER).mu
    assert eta_consistent == pytest.approx([0.720507, 1.929217, 2.137022], abs=MU)
    printed = _report("cyclic", rounds=[10, 100, 1000], paper="printed").curve(PAPER).mu
    assert printed == pytest.approx(eta_consistent / 0.01, rel=1e-12)
    c = sensitivities("fedavg", step_sizes("continuous", 0.01, 2, 5), 1.0, 100, L=1.0)
    assert c.gamma == pytest.approx([4.566667e-4, 1.291270e-4], rel=1e-6)
    assert c.rho == pytest.approx([1.0230215429, 1.0064729046], rel=1e-10)
    r = _report("continuous", rounds=[1000], paper="eta-consistent")
    assert r.curve(COMPOSITION).mu[0] == pytest.approx(0.247034, abs=MU)
    assert r.curve(SHIFTED).mu[0] == pytest.approx(0.029704, abs=MU)
    assert r.curve(PAPER).mu[0] == pytest.approx(0.465747, abs=MU)
    assert _report("continuous", rounds=[1000], paper="h0").curve(PAPER).mu[0] == pytest.approx(0.029704, abs=MU)


def test_paper_surrogates_upper_bound_the_exact_sensitivities():
    for schedule in ("constant", "cyclic", "stagewise", "continuous"):
        eta = step_sizes(schedule, 0.01, 50, 5)
        exact = sensitivities("fedavg", eta, 1.0, 100, L=1.0)
        paper = sensitivities("fedavg", eta, 1.0, 100, L=1.0, mode="paper", schedule=schedule)
        assert np.all(paper.gamma >= exact.gamma * (1 - 1e-12)), schedule
        assert np.all(paper.rho >= exact.rho * (1 - 1e-12)), schedule


# ---- T7 monotonicity and ordering, T9 solver agreement ------------------------------------------------------------
def test_t7_orderings_and_scalings():
    T = 400
    rng = np.random.default_rng(0)
    eta = 0.01 * rng.uniform(0.2, 1.0, size=(T, 5))
    s = sensitivities("fedavg", eta, 1.0, 100, L=1.0)
    g = _tilde(s)
    h0, shift, comp = h0_mu(g, s.rho), shifted_mu(g, s.rho), composition_mu(g)
    assert np.all(h0 <= shift * (1 + 1e-12)) and np.all(shift <= comp * (1 + 1e-12))
    assert np.all(np.diff(comp) >= 0)
    paper = paper_claimed_mu("fedavg", "constant", np.arange(1, T + 1), **T2)
    assert np.all(np.diff(paper) >= 0) and paper[-1] <= 3.170487 + MU
    larger_L = sensitivities("fedavg", eta, 1.0, 100, L=3.0)
    assert np.all(shifted_mu(g, larger_L.rho) >= shift * (1 - 1e-12))  # nondecreasing in L
    assert shifted_mu(2 * g, s.rho) == pytest.approx(2 * shift, rel=1e-12)  # ∝ V, ∝ 1/σ
    agg = lambda m: fdp_report(algo="fedavg", schedule="constant", eta=0.01, K=5, V=1.0, sigma=0.02, m=m,  # noqa: E731
                               rounds=[10], view="aggregate").curve(COMPOSITION).mu[0]
    up = lambda m: fdp_report(algo="fedavg", schedule="constant", eta=0.01, K=5, V=1.0, sigma=0.02, m=m,  # noqa: E731
                              rounds=[10], view="upload").curve(COMPOSITION).mu[0]
    assert agg(400) == pytest.approx(agg(100) / 2, rel=1e-12) and up(400) == pytest.approx(up(100), rel=1e-12)
    eps = [gdp_eps(mu, 1e-5) for mu in (0.5, 1, 2)]
    assert eps == sorted(eps) and gdp_eps(1, 1e-3) < gdp_eps(1, 1e-5)


@pytest.mark.parametrize("case", ["t2", "t3"])
@pytest.mark.parametrize("T", [10, 100, 1000])
def test_t9_nnls_equals_composition_for_constant_sequences(case, T):
    if case == "t2":
        g, rho = np.full(T, 0.5), np.full(T, 1.0510100501)
    else:
        g, rho = np.full(T, 1.0), np.full(T, 2.0)
    assert shifted_mu_nnls(g, rho) == pytest.approx(composition_mu(g)[-1], rel=1e-9)


def test_t9_convex_minorant_matches_nnls_on_random_instances():
    rng = np.random.default_rng(2024)
    for _ in range(200):
        T = int(rng.integers(1, 61))
        rho = np.exp(rng.uniform(0, 0.6, T))
        gamma = rng.uniform(0, 1, T) * (rng.uniform(size=T) > 0.1)
        if gamma.sum() == 0:
            gamma[0] = 1.0
        assert shifted_mu(gamma, rho)[-1] == pytest.approx(shifted_mu_nnls(gamma, rho), rel=1e-9, abs=1e-12)


# ---- T8 against dpfl's RDP / PLD accountants; T10 round trips ----------------------------------------------------
def _t8(mu1: float, T: int) -> None:
    mu = composition_mu(np.full(T, mu1))[-1]
    event = SelfComposedDpEvent(gaussian_event(1 / mu1), T)
    orders = [1.5, 2.0, 4.0, 16.0, 64.0]
    assert rdp_curve(event, orders) == pytest.approx([gdp_to_rdp(mu, z) for z in orders], rel=1e-12)
    exact = gdp_eps(mu, 1e-5)
    assert abs(epsilon(event, 1e-5, "pld") - exact) <= max(1e-3 * exact, 1e-3)
    assert epsilon(event, 1e-5, "rdp") >= exact


@pytest.mark.parametrize("mu1", [0.5, 1.0])
@pytest.mark.parametrize("T", [1, 10, 100])
def test_t8_composition_equals_the_general_accountants(mu1, T):
    _t8(mu1, T)


@pytest.mark.integration
@pytest.mark.parametrize("mu1", [0.5, 1.0])
def test_t8_composition_equals_the_general_accountants_at_a_thousand_rounds(mu1):
    """The PLD accountant took ~10–35 s here (was `slow`; ~1 s in the integration tier today)."""
    _t8(mu1, 1000)


@pytest.mark.parametrize("mu", [0.1, 0.5, 2.0, 30.0])
def test_t10_round_trips(mu):
    eps = gdp_eps(mu, 1e-5)
    assert gdp_delta(eps, mu) == pytest.approx(1e-5, rel=1e-9)
    assert gdp_mu_for(eps, 1e-5) == pytest.approx(mu, rel=1e-9)
    assert gdp_eps(gdp_mu_for(3.0, 1e-5), 1e-5) == pytest.approx(3.0, rel=1e-9)
    assert gdp_to_rdp(mu, 3.0) == 3.0 * mu * mu / 2


# ---- T11 overflow -------------------------------------------------------------------------------------------------
def test_t11_everything_finite_at_a_hundred_thousand_rounds():
    with np.errstate(over="raise", invalid="raise"):
        t2 = _report(rounds=GRID)
        t4 = _report("stagewise", rounds=[100000])
        t3 = fdp_report(algo="fedprox", schedule="constant", eta=0.1, K=5, V=1.0, sigma=0.1, m=100, L=1.0, alpha=2.0,
                        rounds=[100000], view="aggregate", release="final", sensitivity="paper", paper="printed")
    for r in (t2, t3, t4):
        for c in r.curves:
            assert np.all(np.isfinite(c.mu)) and np.all(np.isfinite(c.eps[1e-5]))
    assert t3.curve(COMPOSITION).mu[0] == pytest.approx(316.227766, abs=MU)
    assert t3.curve(SHIFTED).mu[0] == pytest.approx(316.227766, abs=MU)
    assert t3.curve(COMPOSITION).eps[1e-5][0] == pytest.approx(51347.683575, rel=EPS)
    assert t3.curve(PAPER).mu[0] == pytest.approx(1.732051, abs=MU)
    assert t4.curve(SHIFTED).mu[0] == pytest.approx(0.024804, abs=MU)
    with np.errstate(over="ignore", invalid="ignore"):  # the naive formula is NaN there; the log form is not
        a, b = -1462.285016 / 50 + 25, -1462.285016 / 50 - 25
        from scipy.stats import norm

        naive = norm.cdf(a) - np.exp(1462.285016) * norm.cdf(b)
    assert math.isnan(naive) and gdp_delta(1462.285016, 50.0) == pytest.approx(1e-5, rel=1e-6)


# ---- T12 labelling and defaults ------------------------------------------------------------------------------------
def test_t12_labels_views_and_which_bounds_apply():
    r = _report(rounds=[10])
    paper = r.curve(PAPER)
    assert paper.is_guarantee is False and paper.label == PAPER_LABEL == "paper-claimed (NOT a guarantee)"
    assert r.headline != PAPER and all(c.is_guarantee for c in r.curves if c.name != PAPER)
    d = r.to_dict()
    assert [(c["bound"], c["is_guarantee"]) for c in d["curves"]] == [(COMPOSITION, True), (SHIFTED, True),
                                                                       (PAPER, False)]
    assert any("ASSUMPTION" in a for a in d["assumptions"])
    assert resolve_view("auto", False) == "upload" and resolve_view("auto", True) == "aggregate"
    base = {**T2, "algo": "fedavg", "schedule": "constant", "rounds": [10]}
    assert [c.name for c in fdp_report(**base).curves] == [COMPOSITION]  # auto, no secure aggregation: upload
    assert [c.name for c in fdp_report(**base, secure_aggregation=True).curves] == [COMPOSITION]  # transcript
    assert [c.name for c in fdp_report(**base, secure_aggregation=True, release="final").curves] == [COMPOSITION,
                                                                                                    SHIFTED]
    no_l = fdp_report(**{**base, "L": None}, view="aggregate", release="final")
    assert [c.name for c in no_l.curves] == [COMPOSITION] and any("L" in w for w in no_l.warnings)
    with pytest.raises(ValueError, match="needs the smoothness constant L"):
        fdp_report(**{**base, "L": None}, paper="printed")


def test_grid_parsing_and_custom_steps():
    assert parse_grid("1,10,100", 5).tolist() == [1, 10, 100]
    grid = parse_grid("log:60", 10000)
    assert grid[0] == 1 and grid[-1] == 10000 and np.all(np.diff(grid) > 0)
    with pytest.raises(ValueError, match="log:N"):
        parse_grid("log:x", 10)
    custom = step_sizes("stagewise", 0.01, 100, 5)
    r = fdp_report(**{**T2, "algo": "fedavg", "schedule": "custom", "rounds": [100]}, eta_array=custom,
                   view="aggregate", release="final")
    assert r.params["schedule"] == "custom"
    with pytest.raises(ValueError, match="named schedule"):
        fdp_report(**{**T2, "algo": "fedavg", "schedule": "custom", "rounds": [10]}, eta_array=custom,
                   paper="printed")
    assert r.curve(SHIFTED).mu[0] == pytest.approx(0.279437, abs=MU)
