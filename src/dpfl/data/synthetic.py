"""The convex federated problems of the operator-splitting spec (specs/operator_splitting.md, section 10).

Both generators draw from ONE ``numpy.random.Generator(seed)`` in a fixed order: ``x0``, then for
each client ``xi_i``, ``A_i`` and its noise/labels. ``xi_i`` is drawn even when ``shift_scale = 0``
and label flips are drawn even when ``flip_std = 0``, so changing a heterogeneity knob never
changes any ``A_i``, and a config reproduces its data exactly. Everything is float64: the tests
compare closed forms to 1e-8 and beyond.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

PRESETS = {"small": {"n_clients": 5, "dim": 20, "n_per_client": 200}}

KINDS = ("least_squares", "logistic")


@dataclass(eq=False)
class ConvexProblem:
    """Client data and the exact minimiser of ``f(x) = sum_i lambda_i f_i(x)``.

    Least squares: ``f_i(x) = 0.5 ||A_i x - b_i||^2``. Logistic: ``f_i(x) = sum_j log(1 + exp(-b_ij
    a_ij^T x)) + reg ||x||^2 / 2`` with ``reg = 1 / (m n)`` (m clients, n samples per client) and
    labels in {-1, +1}. ``f_i`` is a sum over samples, not a mean.
    """

    kind: str
    A: list[np.ndarray]
    b: list[np.ndarray]
    x0: np.ndarray
    client_x0: list[np.ndarray]  # the truth x0 + s * xi_i used for client i
    weights: np.ndarray  # lambda_i, summing to 1
    reg: float = 0.0
    theta_star: np.ndarray = field(default=None)  # type: ignore[assignment]
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.theta_star is None:
            self.theta_star = self._solve()

    @property
    def n_clients(self) -> int:
        return len(self.A)

    @property
    def dim(self) -> int:
        return int(self.x0.shape[0])

    @property
    def n_samples(self) -> np.ndarray:
        """N_i per client."""
        return np.array([a.shape[0] for a in self.A], dtype=np.int64)

    @cached_property
    def Q(self) -> list[np.ndarray]:  # noqa: N802 (the spec's notation)
        """``A_i^T A_i`` per client (the least-squares Hessians)."""
        return [a.T @ a for a in self.A]

    @cached_property
    def c(self) -> list[np.ndarray]:
        """``A_i^T b_i`` per client."""
        return [a.T @ y for a, y in zip(self.A, self.b, strict=True)]

    def client_objective(self, i: int, x: np.ndarray) -> float:
        a, y = self.A[i], self.b[i]
        if self.kind == "least_squares":
            r = a @ x - y
            return 0.5 * float(r @ r)
        return float(np.logaddexp(0.0, -y * (a @ x)).sum() + 0.5 * self.reg * (x @ x))

    def client_gradient(self, i: int, x: np.ndarray) -> np.ndarray:
        """The true gradient of ``f_i`` (no factor 2 on the least-squares term)."""
        a, y = self.A[i], self.b[i]
        if self.kind == "least_squares":
            return a.T @ (a @ x - y)
        return a.T @ (-y * _sigmoid(-y * (a @ x))) + self.reg * x

    def client_hessian(self, i: int, x: np.ndarray) -> np.ndarray:
        a, y = self.A[i], self.b[i]
        if self.kind == "least_squares":
            return self.Q[i]
        s = _sigmoid(y * (a @ x))
        return (a.T * (s * (1.0 - s))) @ a + self.reg * np.eye(self.dim)

    def objective(self, x: np.ndarray) -> float:
        """``f(x) = sum_i lambda_i f_i(x)``, the objective theta_star minimises."""
        return float(sum(w * self.client_objective(i, x) for i, w in enumerate(self.weights)))

    def gradient(self, x: np.ndarray) -> np.ndarray:
        return sum(w * self.client_gradient(i, x) for i, w in enumerate(self.weights))

    def hessian(self, x: np.ndarray) -> np.ndarray:
        return sum(w * self.client_hessian(i, x) for i, w in enumerate(self.weights))

    def _solve(self) -> np.ndarray:
        if self.kind == "least_squares":
            q = sum(w * qi for w, qi in zip(self.weights, self.Q, strict=True))
            c = sum(w * ci for w, ci in zip(self.weights, self.c, strict=True))
            return np.linalg.solve(q, c)
        return _newton(self, tol=1e-10)


def heterogeneity(problem: ConvexProblem, x: np.ndarray | None = None, per_sample: bool = False) -> float:
    """``H = (1/n) sum_i ||grad f_i(theta*)||^2`` (spec section 8, after Khaled et al.).

    At the optimum the weighted client gradients cancel, so what remains measures how much the
    clients disagree. ``per_sample=True`` divides each gradient by N_i (the mean loss's gradient),
    which makes H comparable across problem sizes. ``x`` replaces theta* if given.
    """
    x = problem.theta_star if x is None else np.asarray(x, dtype=np.float64)
    total = 0.0
    for i, n_i in enumerate(problem.n_samples):
        g = problem.client_gradient(i, x)
        if per_sample:
            g = g / n_i
        total += float(g @ g)
    return total / problem.n_clients


def make_least_squares(
    n_clients: int = 25,
    dim: int = 100,
    n_per_client: int = 5000,
    shift_scale: float = 0.0,
    noise_std: float = 0.25,
    seed: int = 0,
    weights: str | Sequence[float] | None = None,
    preset: str | None = None,
) -> ConvexProblem:
    """Least squares: ``b_i = A_i x0_i + e_i``, ``A_i`` i.i.d. N(0, 1), ``e_i ~ N(0, noise_std^2 I)``.

    ``preset="small"`` sets 5 clients, d = 20, N_i = 200 (the size the tests use).
    ``weights``: None/"uniform" (1/n), "samples" (N_i / N) or one non-negative weight per client summing to 1.
    """
    n_clients, dim, n_per_client = _sizes(n_clients, dim, n_per_client, preset)
    _check_nonneg("shift_scale", shift_scale)
    _check_nonneg("noise_std", noise_std)
    rng = np.random.default_rng(_seed(seed))  # = Generator(PCG64(seed))
    x0 = rng.standard_normal(dim)
    A, b, truths = [], [], []
    for _ in range(n_clients):
        xi = rng.standard_normal(dim)
        a = rng.standard_normal((n_per_client, dim))
        truth = x0 + shift_scale * xi
        noise = noise_std * rng.standard_normal(n_per_client)
        A.append(a)
        b.append(a @ truth + noise)
        truths.append(truth)
    params = dict(n_clients=n_clients, dim=dim, n_per_client=n_per_client, shift_scale=shift_scale,
                  noise_std=noise_std, seed=seed)
    return ConvexProblem("least_squares", A, b, x0, truths, _weights(weights, n_clients, n_per_client), params=params)


def make_logistic(
    n_clients: int = 10,
    dim: int = 100,
    n_per_client: int = 1000,
    shift_scale: float = 0.0,
    flip_std: float = 0.0,
    seed: int = 0,
    weights: str | Sequence[float] | None = None,
    preset: str | None = None,
) -> ConvexProblem:
    """Logistic regression: ``b = 2 Bernoulli(sigmoid(A_i x0_i)) - 1``, ``A_i`` i.i.d. N(0, 1).

    A label flips where ``|g| >= 0.5`` with ``g ~ N(0, flip_std^2)`` drawn per sample.

    ``theta*`` is found by Newton's method to a gradient norm of 1e-10. Presets and weights as in
    ``make_least_squares``.
    """
    n_clients, dim, n_per_client = _sizes(n_clients, dim, n_per_client, preset)
    _check_nonneg("shift_scale", shift_scale)
    _check_nonneg("flip_std", flip_std)
    rng = np.random.default_rng(_seed(seed))  # = Generator(PCG64(seed))
    x0 = rng.standard_normal(dim)
    A, b, truths = [], [], []
    for _ in range(n_clients):
        xi = rng.standard_normal(dim)
        a = rng.standard_normal((n_per_client, dim))
        truth = x0 + shift_scale * xi
        labels = np.where(rng.random(n_per_client) < _sigmoid(a @ truth), 1.0, -1.0)
        g = flip_std * rng.standard_normal(n_per_client)
        labels[np.abs(g) >= 0.5] *= -1.0
        A.append(a)
        b.append(labels)
        truths.append(truth)
    params = dict(n_clients=n_clients, dim=dim, n_per_client=n_per_client, shift_scale=shift_scale,
                  flip_std=flip_std, seed=seed)
    reg = 1.0 / (n_clients * n_per_client)
    return ConvexProblem(
        "logistic", A, b, x0, truths, _weights(weights, n_clients, n_per_client), reg=reg, params=params
    )


def _newton(problem: ConvexProblem, tol: float, max_iter: int = 100) -> np.ndarray:
    """Damped Newton (Armijo backtracking) on the strongly convex weighted logistic objective.

    Works on all clients' rows stacked, each row weighted by its client's lambda_i: one large
    matrix product per evaluation instead of one per client.
    """
    a = np.vstack(problem.A)
    y = np.concatenate(problem.b)
    w = np.repeat(problem.weights, problem.n_samples)
    reg = problem.reg

    def objective(x: np.ndarray) -> float:
        return float(w @ np.logaddexp(0.0, -y * (a @ x)) + 0.5 * reg * (x @ x))

    x = np.zeros(problem.dim)
    f = objective(x)
    gnorm = np.inf
    for _ in range(max_iter):
        margins = y * (a @ x)
        g = a.T @ (-w * y * _sigmoid(-margins)) + reg * x
        gnorm = float(np.linalg.norm(g))
        if gnorm <= tol:
            return x
        s = _sigmoid(margins)
        hessian = (a.T * (w * s * (1.0 - s))) @ a + reg * np.eye(problem.dim)
        step = np.linalg.solve(hessian, -g)
        t = 1.0
        if -float(g @ step) <= 1e3 * np.finfo(float).eps * (1.0 + abs(f)):
            # The predicted decrease is below the objective's rounding error: a line search on f
            # cannot see it, and the full Newton step is exact to second order here.
            x = x + step
            f = objective(x)
            continue
        while True:
            x_new = x + t * step
            f_new = objective(x_new)
            if f_new <= f + 1e-4 * t * float(g @ step) or t < 1e-10:
                break
            t *= 0.5
        x, f = x_new, f_new
    raise RuntimeError(f"Newton's method did not reach gradient norm {tol} in {max_iter} iterations (got {gnorm:.3e})")


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -z))


def _sizes(n_clients: int, dim: int, n_per_client: int, preset: str | None) -> tuple[int, int, int]:
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)} or None, got {preset!r}")
        p = PRESETS[preset]
        n_clients, dim, n_per_client = p["n_clients"], p["dim"], p["n_per_client"]
    for name, value in (("n_clients", n_clients), ("dim", dim), ("n_per_client", n_per_client)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(n_clients), int(dim), int(n_per_client)


def _seed(seed: int) -> int:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return int(seed)


def _check_nonneg(name: str, value: float) -> None:
    if not (isinstance(value, (int, float, np.floating, np.integer)) and np.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _weights(weights: str | Sequence[float] | None, n_clients: int, n_per_client: int) -> np.ndarray:
    if weights is None or (isinstance(weights, str) and weights == "uniform"):
        return np.full(n_clients, 1.0 / n_clients)
    if isinstance(weights, str):
        if weights == "samples":
            sizes = np.full(n_clients, float(n_per_client))
            return sizes / sizes.sum()
        raise ValueError(f"weights must be 'uniform', 'samples' or a sequence of {n_clients} numbers, got {weights!r}")
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n_clients,) or not np.all(np.isfinite(w)) or (w < 0).any() or abs(w.sum() - 1.0) > 1e-9:
        raise ValueError(
            f"weights must be {n_clients} finite non-negative numbers summing to 1, got {list(np.atleast_1d(w))}"
        )
    return w
