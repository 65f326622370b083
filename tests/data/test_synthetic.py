import numpy as np
import pytest

from dpfl.data import heterogeneity, make_least_squares, make_logistic

MAKERS = {"least_squares": make_least_squares, "logistic": make_logistic}


@pytest.mark.parametrize("kind", MAKERS)
def test_small_preset_shapes(kind):
    p = MAKERS[kind](preset="small")
    assert p.kind == kind and (p.n_clients, p.dim) == (5, 20)
    assert [a.shape for a in p.A] == [(200, 20)] * 5 and [b.shape for b in p.b] == [(200,)] * 5
    assert p.x0.shape == (20,) and p.theta_star.shape == (20,)
    assert all(a.dtype == np.float64 for a in p.A)
    np.testing.assert_allclose(p.weights, np.full(5, 0.2))


def test_default_sizes_follow_the_spec():
    ls = make_least_squares(n_per_client=50)  # full N_i = 5000 only changes the row count
    assert (ls.n_clients, ls.dim) == (25, 100)
    lg = make_logistic()
    assert (lg.n_clients, lg.dim, int(lg.n_samples[0])) == (10, 100, 1000)
    assert lg.reg == pytest.approx(1 / (10 * 1000))


def test_draw_order_is_x0_then_per_client_xi_A_noise():
    s, sigma = 0.7, 0.3
    p = make_least_squares(n_clients=3, dim=4, n_per_client=6, shift_scale=s, noise_std=sigma, seed=11)
    rng = np.random.default_rng(11)
    x0 = rng.standard_normal(4)
    np.testing.assert_array_equal(p.x0, x0)
    for i in range(3):
        xi = rng.standard_normal(4)
        a = rng.standard_normal((6, 4))
        e = sigma * rng.standard_normal(6)
        np.testing.assert_array_equal(p.A[i], a)
        np.testing.assert_allclose(p.b[i], a @ (x0 + s * xi) + e, rtol=0, atol=1e-14)


def test_logistic_labels_follow_the_spec_recipe():
    p = make_logistic(n_clients=2, dim=3, n_per_client=50, shift_scale=0.5, flip_std=0.4, seed=5)
    rng = np.random.default_rng(5)
    x0 = rng.standard_normal(3)
    for i in range(2):
        xi = rng.standard_normal(3)
        a = rng.standard_normal((50, 3))
        prob = 1 / (1 + np.exp(-(a @ (x0 + 0.5 * xi))))
        labels = np.where(rng.random(50) < prob, 1.0, -1.0)
        g = 0.4 * rng.standard_normal(50)
        labels[np.abs(g) >= 0.5] *= -1
        np.testing.assert_array_equal(p.b[i], labels)


@pytest.mark.parametrize("kind", MAKERS)
def test_seed_reproducibility(kind):
    a, b, c = (MAKERS[kind](preset="small", seed=s) for s in (3, 3, 4))
    for x, y in zip(a.A + a.b, b.A + b.b, strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.theta_star, b.theta_star)
    assert not np.array_equal(a.A[0], c.A[0])


@pytest.mark.parametrize("kind,knob", [("least_squares", "noise_std"), ("logistic", "flip_std")])
def test_heterogeneity_knobs_leave_every_A_unchanged(kind, knob):
    base = MAKERS[kind](preset="small", seed=2)
    shifted = MAKERS[kind](preset="small", seed=2, shift_scale=1.0)
    noisier = MAKERS[kind](preset="small", seed=2, **{knob: 0.9})
    for i in range(base.n_clients):
        np.testing.assert_array_equal(base.A[i], shifted.A[i])
        np.testing.assert_array_equal(base.A[i], noisier.A[i])
    np.testing.assert_array_equal(base.x0, shifted.x0)
    assert not np.array_equal(base.b[0], shifted.b[0])
    assert not np.array_equal(base.b[0], noisier.b[0])


def test_logistic_labels_are_signs_and_flip_rate_matches():
    clean = make_logistic(preset="small", seed=1)
    flipped = make_logistic(preset="small", seed=1, flip_std=1.0)
    labels = np.concatenate(clean.b)
    assert set(np.unique(labels)) == {-1.0, 1.0}
    rate = np.mean(np.concatenate(clean.b) != np.concatenate(flipped.b))
    assert rate == pytest.approx(0.617, abs=0.05)  # P(|N(0,1)| >= 0.5)


def test_least_squares_theta_star_is_the_pooled_solution():
    p = make_least_squares(preset="small", shift_scale=1.0, seed=0)
    pooled, *_ = np.linalg.lstsq(np.vstack(p.A), np.concatenate(p.b), rcond=None)
    np.testing.assert_allclose(p.theta_star, pooled, rtol=1e-10, atol=1e-12)
    g = p.gradient(p.theta_star)
    assert np.linalg.norm(g) <= 1e-9 * np.linalg.norm(p.gradient(np.zeros(p.dim)))


@pytest.mark.parametrize("shift", [0.0, 1.0])
def test_logistic_theta_star_is_stationary(shift):
    p = make_logistic(preset="small", shift_scale=shift, seed=0)
    assert np.linalg.norm(p.gradient(p.theta_star)) <= 1e-10
    # and it is a minimum: moving in any direction increases the objective
    rng = np.random.default_rng(0)
    for _ in range(5):
        d = rng.standard_normal(p.dim) * 1e-3
        assert p.objective(p.theta_star + d) > p.objective(p.theta_star)


@pytest.mark.parametrize("kind", MAKERS)
def test_gradient_is_the_true_gradient(kind):
    p = MAKERS[kind](n_clients=2, dim=4, n_per_client=30, shift_scale=0.5, seed=7)
    x = np.random.default_rng(1).standard_normal(4)
    h = 1e-6
    numeric = np.array([(p.objective(x + h * e) - p.objective(x - h * e)) / (2 * h) for e in np.eye(4)])
    np.testing.assert_allclose(p.gradient(x), numeric, rtol=1e-6, atol=1e-6)
    # f = sum lambda_i f_i with f_i = 0.5 ||A x - b||^2 (least squares): no factor 2, no mean
    if kind == "least_squares":
        expected = 0.5 * sum(0.5 * np.sum((a @ x - b) ** 2) for a, b in zip(p.A, p.b, strict=True))
        assert p.objective(x) == pytest.approx(expected)


@pytest.mark.parametrize("kind", MAKERS)
def test_shift_increases_heterogeneity(kind):
    h0 = heterogeneity(MAKERS[kind](preset="small", shift_scale=0.0, seed=0))
    h1 = heterogeneity(MAKERS[kind](preset="small", shift_scale=1.0, seed=0))
    assert 0 <= h0 < h1
    assert h1 > 3 * h0


def test_heterogeneity_definition():
    p = make_least_squares(preset="small", shift_scale=0.5, seed=3)
    grads = [a.T @ (a @ p.theta_star - b) for a, b in zip(p.A, p.b, strict=True)]
    assert heterogeneity(p) == pytest.approx(np.mean([g @ g for g in grads]))
    assert heterogeneity(p, per_sample=True) == pytest.approx(np.mean([g @ g / 200**2 for g in grads]))
    assert heterogeneity(p, x=np.zeros(p.dim)) > heterogeneity(p)


def test_weights_change_the_minimiser():
    uniform = make_least_squares(preset="small", shift_scale=1.0)
    by_samples = make_least_squares(preset="small", shift_scale=1.0, weights="samples")
    assert np.array_equal(uniform.theta_star, by_samples.theta_star)
    w = [0.6, 0.1, 0.1, 0.1, 0.1]
    skewed = make_least_squares(preset="small", shift_scale=1.0, weights=w)
    assert np.linalg.norm(skewed.gradient(skewed.theta_star)) < 1e-8
    assert np.linalg.norm(skewed.theta_star - uniform.theta_star) > 1e-3
    q = sum(wi * ai.T @ ai for wi, ai in zip(w, skewed.A, strict=True))
    c = sum(wi * ai.T @ bi for wi, ai, bi in zip(w, skewed.A, skewed.b, strict=True))
    np.testing.assert_allclose(skewed.theta_star, np.linalg.solve(q, c), rtol=1e-12)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"preset": "tiny"}, "preset must be one of small"),
        ({"shift_scale": -1.0}, "shift_scale must be a finite number >= 0"),
        ({"n_clients": 0}, "n_clients must be an int >= 1"),
        ({"seed": -1}, "seed must be a non-negative int"),
        ({"weights": [0.5, 0.5]}, "weights must be 25 finite non-negative numbers summing to 1"),
        ({"weights": "size"}, "weights must be 'uniform', 'samples'"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_least_squares(**{"n_per_client": 2, **kwargs})
