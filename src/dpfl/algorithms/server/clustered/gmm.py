"""Clusters from the round-1 updates (clustered_dpfl.md §5.2-§5.3): PCA to 2-D, a spherical GMM, confidence scores.

Everything here is post-processing of the released round-1 updates, so it costs no privacy. Why each step:
- PCA through the n x n Gram matrix: p (parameters) is much larger than n (clients), so the eigenproblem is n x n.
  The components are fitted on the column-standardised updates; by default (parity with the reference code) they
  are applied to the raw updates (`project="raw"`), `"standardized"` is the principled choice.
- Two components, min-max scaled to [0, 1] (or standardised): the reference code's feature space.
- scikit-learn's GaussianMixture (spherical, k-means++ init, tol 1e-6, uniform initial weights), then the mixture
  weights are forced to 1/M before the posteriors, so a cluster's size does not pull clients into it.
- The separation score S of a pair of clusters, its overlap O = 1 - erf(S / sqrt 2), MSS = min S and MPO = max O
  say how trustworthy the clustering is; MSS also chooses M when it is not given, and MPO sets the length of the
  second stage E_c = floor((1 - MPO) E / 2).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["ClusterFit", "choose_clusters", "fit_clusters", "pca_features", "second_stage_rounds", "separation"]

COMPONENTS = 2
M_CANDIDATES = tuple(range(2, 9))


def pca_features(updates: np.ndarray, *, project: Literal["raw", "standardized"] = "raw",
                 scaler: Literal["minmax", "standard"] = "minmax") -> np.ndarray:
    """[n, 2] features of the clients' updates [n, p] (see the module docstring)."""
    x = np.asarray(updates, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2 or not np.isfinite(x).all():
        raise ValueError(f"clustering needs a finite [clients >= 2, parameters] matrix of updates, got shape {x.shape}")
    if project not in ("raw", "standardized") or scaler not in ("minmax", "standard"):
        raise ValueError(f"project must be raw|standardized and scaler minmax|standard, got {project!r}, {scaler!r}")
    std = x.std(axis=0)
    std[std == 0] = 1.0
    xs = (x - x.mean(axis=0)) / std
    values, vectors = np.linalg.eigh(xs @ xs.T)  # ascending
    keep = np.argsort(values)[::-1][:COMPONENTS]
    values, vectors = values[keep], vectors[:, keep]
    positive = values > values.max(initial=0.0) * 1e-12
    values, vectors = values[positive], vectors[:, positive]
    signs = np.sign(vectors[np.abs(vectors).argmax(axis=0), range(vectors.shape[1])])  # sklearn's svd_flip
    vectors = vectors * np.where(signs == 0, 1.0, signs)
    components = xs.T @ vectors / np.sqrt(values)  # [p, k], unit columns
    features = (x if project == "raw" else xs) @ components
    if features.shape[1] < COMPONENTS:  # rank-1 updates: a zero second feature
        features = np.hstack([features, np.zeros((x.shape[0], COMPONENTS - features.shape[1]))])
    if scaler == "minmax":
        span = features.max(axis=0) - features.min(axis=0)
        return (features - features.min(axis=0)) / np.where(span > 0, span, 1.0)
    sd = features.std(axis=0)
    return (features - features.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def separation(means: np.ndarray, radii: np.ndarray) -> tuple[float, float]:
    """(MSS, MPO): the smallest pairwise S_{mm'} = ||mu_m - mu_m'|| / (2 max(r_m, r_m')) and the largest overlap
    O = 1 - erf(S / sqrt 2). One cluster has no pair: (inf, 0)."""
    mu, r = np.asarray(means, dtype=np.float64), np.asarray(radii, dtype=np.float64)
    scores = [float(np.linalg.norm(mu[a] - mu[b]) / (2.0 * max(r[a], r[b])))
              for a in range(len(mu)) for b in range(a + 1, len(mu))]
    if not scores:
        return math.inf, 0.0
    mss = min(scores)
    return mss, 1.0 - math.erf(mss / math.sqrt(2.0))


def second_stage_rounds(mpo: float, rounds: int) -> tuple[int, int]:
    """(E_c, effective E_c = max(E_c, 2)) with E_c = floor((1 - MPO) E / 2); needs E >= 3."""
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 3:
        raise ValueError(f"R-DPCFL needs E >= 3 rounds, got {rounds!r}")
    if not 0.0 <= mpo <= 1.0:
        raise ValueError(f"MPO must be in [0, 1], got {mpo}")
    e_c = math.floor((1.0 - mpo) * rounds / 2.0)
    return e_c, max(e_c, 2)


@dataclass(frozen=True)
class ClusterFit:
    """A GMM on the clients' features: posteriors pi [n, M] (uniform mixture weights), its scores and EM facts."""

    n_clusters: int
    posteriors: np.ndarray
    means: np.ndarray
    radii: np.ndarray
    mss: float
    mpo: float
    em_iterations: int
    converged: bool

    @property
    def assignment(self) -> np.ndarray:
        """The posterior-argmax cluster of every client."""
        return self.posteriors.argmax(axis=1)


def fit_clusters(features: np.ndarray, n_clusters: int, seed: int) -> ClusterFit:
    """scikit-learn's spherical GaussianMixture with the spec's settings, then posteriors under weights 1/M."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    f = np.asarray(features, dtype=np.float64)
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, (int, np.integer)) or not 1 <= n_clusters <= len(f):
        raise ValueError(f"the number of clusters must be in [1, {len(f)}] (the clients), got {n_clusters!r}")
    gmm = GaussianMixture(n_components=int(n_clusters), covariance_type="spherical", init_params="k-means++",
                          tol=1e-6, weights_init=np.full(n_clusters, 1.0 / n_clusters), random_state=int(seed))
    with warnings.catch_warnings():  # non-convergence is recorded (`converged`), not printed
        warnings.simplefilter("ignore", ConvergenceWarning)
        gmm.fit(f)
    gmm.weights_ = np.full(n_clusters, 1.0 / n_clusters)  # §5.2 step 5: cluster sizes must not pull clients in
    radii = np.sqrt(gmm.covariances_)
    mss, mpo = separation(gmm.means_, radii)
    return ClusterFit(int(n_clusters), gmm.predict_proba(f), gmm.means_.copy(), radii, mss, mpo, int(gmm.n_iter_),
                      bool(gmm.converged_))


def choose_clusters(features: np.ndarray, seed: int, candidates: tuple[int, ...] = M_CANDIDATES) -> ClusterFit:
    """The fit with the largest MSS over the candidate M (capped at n - 1); ties go to the smaller M."""
    usable = sorted({int(m) for m in candidates if 2 <= m <= len(features) - 1})
    if not usable:
        raise ValueError(f"no candidate number of clusters in {candidates} fits {len(features)} clients "
                         "(each must be in [2, n - 1])")
    best: ClusterFit | None = None
    for m in usable:
        fit = fit_clusters(features, m, seed)
        if best is None or fit.mss > best.mss:
            best = fit
    assert best is not None
    return best
