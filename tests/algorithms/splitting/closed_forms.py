"""Closed forms and one-line reference iterations of operator_splitting.md §12, written directly from the spec
(numpy, float64), independent of dpfl's scheme."""

from __future__ import annotations

import numpy as np


def fedavg_fixed_point(Q, c, lam, eta, k):
    """theta*_FedAvg(k) = (sum lambda_i S_i Q_i)^{-1} sum lambda_i S_i c_i, S_i = (1/k) sum_{j<k} (I - eta Q_i)^j."""
    d = Q[0].shape[0]
    lhs, rhs = np.zeros((d, d)), np.zeros(d)
    for qi, ci, li in zip(Q, c, lam, strict=True):
        m = np.eye(d) - eta * qi
        s, power = np.zeros((d, d)), np.eye(d)
        for _ in range(k):
            s += power
            power = power @ m
        s /= k
        lhs += li * s @ qi
        rhs += li * s @ ci
    return np.linalg.solve(lhs, rhs)


def fedprox_fixed_point(Q, c, lam, eta):
    """(sum lambda_i (I + eta Q_i)^{-1} Q_i)^{-1} sum lambda_i (I + eta Q_i)^{-1} c_i."""
    d = Q[0].shape[0]
    lhs, rhs = np.zeros((d, d)), np.zeros(d)
    for qi, ci, li in zip(Q, c, lam, strict=True):
        inv = np.linalg.inv(np.eye(d) + eta * qi)
        lhs += li * inv @ qi
        rhs += li * inv @ ci
    return np.linalg.solve(lhs, rhs)


def prox(Q, c, eta, x):
    """P^eta_{f_i}(x_i) for every block of x [n, d] (f_i = 0.5 ||A_i x - b_i||^2)."""
    d = Q[0].shape[0]
    return np.stack([np.linalg.solve(qi + np.eye(d) / eta, ci + xi / eta) for qi, ci, xi in zip(Q, c, x, strict=True)])


def gradient_steps(Q, c, eta, k, x):
    out = x.copy()
    for _ in range(k):
        out = np.stack([xi - eta * (qi @ xi - ci) for qi, ci, xi in zip(Q, c, out, strict=True)])
    return out


def project(lam, x):
    """P_H: every block becomes the lambda-weighted mean."""
    return np.broadcast_to(lam @ x, x.shape).copy()


def reflect(lam, x):
    return 2 * project(lam, x) - x
