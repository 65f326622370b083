"""MP-DP's nominal privacy calculator against the spec's worked numbers (bidirectional.md §8.5, T25-T28)."""

import math

import pytest

from dpfl.algorithms.secure.mpdp.privacy import (
    NOMINAL_LABEL,
    PrivacyConfigError,
    c_n,
    composed,
    epsilon_of,
    solve_sigma_eta,
    theta_max,
)


def _both_hold(theta, eps, delta):
    c = 2 * math.log(2 / (delta * math.sqrt(2 * math.pi)))
    return eps >= theta / 2 + math.sqrt(theta) and (eps - theta / 2) ** 2 >= c * theta


@pytest.mark.parametrize("eps", [0.5, 1, 2, 3, 5, 8])
def test_theta_max_is_the_boundary_of_both_inequalities(eps):
    t = theta_max(eps, 1e-5)
    assert _both_hold(t * (1 - 1e-12), eps, 1e-5)
    assert not _both_hold(1.001 * t, eps, 1e-5)


@pytest.mark.parametrize("eps,theta,s5,s100", [
    (0.5, 0.01084, 4.2962, 0.9607), (1, 0.04244, 2.1709, 0.4854), (2, 0.16304, 1.1076, 0.2477),
    (3, 0.35314, 0.7526, 0.1683), (5, 0.91422, 0.4677, 0.1046), (8, 2.13037, 0.3064, 0.0685)])
def test_worked_numbers_complete_graph(eps, theta, s5, s100):
    assert theta_max(eps, 1e-5) == pytest.approx(theta, abs=5e-6)
    for K, sigma in ((5, s5), (100, s100)):
        plan = solve_sigma_eta(eps, 1e-5, K, math.inf)
        assert plan.sigma_eta == pytest.approx(sigma, abs=5e-5)
        assert plan.sigma_eta / math.sqrt(K) == pytest.approx(sigma / math.sqrt(K), abs=5e-5)


def test_worked_numbers_n_out_graph():
    assert c_n(1000, 77) == pytest.approx(0.0951, abs=5e-5)
    assert theta_max(1, 1e-5 / 3) == pytest.approx(0.03882, abs=5e-6)
    with pytest.raises(PrivacyConfigError, match="1.565"):
        solve_sigma_eta(1, 1e-5, 1000, 1.56, "n_out", 77)
    assert solve_sigma_eta(1, 1e-5, 1000, 2 * 1.565, "n_out", 77).sigma_eta == pytest.approx(0.1853, abs=5e-4)
    assert solve_sigma_eta(1, 1e-5, 1000, math.inf, "n_out", 77).sigma_eta == pytest.approx(0.1605, abs=5e-4)
    assert solve_sigma_eta(3, 1e-5, 1000, math.inf, "n_out", 77).sigma_eta == pytest.approx(0.0555, abs=5e-4)
    with pytest.raises(PrivacyConfigError, match="0.541"):
        solve_sigma_eta(3, 1e-5, 1000, 0.54, "n_out", 77)


@pytest.mark.parametrize("K,n_min", [(81, 67), (100, 68), (1000, 77), (10_000, 86)])
def test_smallest_admissible_n(K, n_min):
    solve_sigma_eta(1, 1e-5, K, math.inf, "n_out", n_min)
    with pytest.raises(PrivacyConfigError, match="Theorem 11 conditions violated"):
        solve_sigma_eta(1, 1e-5, K, math.inf, "n_out", n_min - 1)


def test_paper_k100_n5_lists_every_failed_condition_and_unverified_mode_stamps():
    with pytest.raises(PrivacyConfigError) as err:
        solve_sigma_eta(1, 1e-5, 100, math.inf, "n_out", 5)
    msg = str(err.value)
    for needed in ("67.24", "21.04", "33.69", "floor((n-1)/3) - 1 >= 1"):
        assert needed in msg
    plan = solve_sigma_eta(1, 1e-5, 100, math.inf, "n_out", 5, mode="unverified")
    assert plan.stamps and plan.stamps[0].startswith("UNVERIFIED: Theorem 11 conditions violated")
    assert "UNVERIFIED" in plan.label and NOMINAL_LABEL in plan.label
    assert plan.sigma_eta == pytest.approx(solve_sigma_eta(1, 1e-5, 100, math.inf).sigma_eta)
    with pytest.raises(PrivacyConfigError, match="K >= 81"):
        solve_sigma_eta(1, 1e-5, 50, math.inf, "n_out", 40)


@pytest.mark.parametrize("kwargs,match", [
    (dict(eps=0), "ε must be > 0"), (dict(delta=1.0), "δ must be in"), (dict(delta=0.0), "δ must be in"),
    (dict(sigma_delta=0.1), "too small"), (dict(graph="n_out", n=120), "n < K"),
])
def test_bad_parameters_are_refused(kwargs, match):
    args = dict(eps=1.0, delta=1e-5, K=100, sigma_delta=10.0) | kwargs
    with pytest.raises(PrivacyConfigError, match=match):
        solve_sigma_eta(**args)


@pytest.mark.parametrize("graph,n,K", [("complete", None, 5), ("complete", None, 100), ("n_out", 77, 1000)])
def test_round_trip(graph, n, K):
    plan = solve_sigma_eta(2.0, 1e-5, K, 50.0, graph, n)
    assert epsilon_of(plan.sigma_eta, 50.0, 1e-5, K, graph, n).eps == pytest.approx(2.0, rel=1e-9, abs=1e-9)


def test_variance_form_of_theta_is_pinned():
    # σ_Δ -> ∞: a Gaussian mechanism on the sum of K independent noises, θ = 1/(K σ_η²) (not 1/(K σ_η)).
    sigma = 2.0
    eps = epsilon_of(sigma, math.inf, 1e-5, 5).eps
    theta = 1 / (5 * sigma**2)
    c = 2 * math.log(2 / (1e-5 * math.sqrt(2 * math.pi)))
    assert eps == pytest.approx(theta / 2 + math.sqrt(c * theta), rel=1e-12)
    # collusion: fewer honest clients means more noise for the same epsilon
    assert (solve_sigma_eta(1, 1e-5, 100, math.inf, k_honest=50).sigma_eta
            > solve_sigma_eta(1, 1e-5, 100, math.inf).sigma_eta)


def test_composition_formulas_and_labels():
    out = composed(0.5, 1e-6, 10, delta_prime=1e-5)
    assert out["basic"] == pytest.approx({"epsilon": 5.0, "delta": 1e-5})
    adv = 0.5 * math.sqrt(20 * math.log(1e5)) + 10 * 0.5 * math.expm1(0.5)
    assert out["advanced"]["epsilon"] == pytest.approx(adv)
    assert out["advanced"]["delta"] == pytest.approx(10 * 1e-6 + 1e-5)
    assert out["composed"]["epsilon"] == pytest.approx(min(5.0, adv))
    assert out["composed"]["label"].startswith("T-fold composed (nominal")
    many = composed(0.1, 1e-7, 1000)
    assert many["composed"]["which"] == "advanced" and many["composed"]["epsilon"] < 100
