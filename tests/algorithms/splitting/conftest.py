import numpy as np
import pytest

from dpfl.algorithms.client.convex_clients import ConvexClients
from dpfl.data.synthetic import make_least_squares


class LeastSquares:
    """The `small` heterogeneous least-squares problem (s = 1) with its numpy Q_i, c_i, lambda_i."""

    def __init__(self, shift_scale: float = 1.0, seed: int = 0) -> None:
        self.problem = make_least_squares(preset="small", shift_scale=shift_scale, seed=seed)
        self.fns = ConvexClients(self.problem)
        self.Q, self.c, self.lam = self.problem.Q, self.problem.c, self.problem.weights
        self.theta = self.problem.theta_star
        eig = np.array([np.linalg.eigvalsh(q) for q in self.Q])
        self.max_eig, self.mean_eig = float(eig.max()), float(eig.mean())


@pytest.fixture(scope="session")
def ls() -> LeastSquares:
    return LeastSquares()


@pytest.fixture(scope="session")
def ls_homogeneous() -> LeastSquares:
    return LeastSquares(shift_scale=0.0)
