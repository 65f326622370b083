"""Clustered DP-FL (specs/clustered_dpfl.md): R-DPCFL's clustering of the round-1 updates and its private selection."""

from dpfl.algorithms.server.clustered.gmm import ClusterFit, choose_clusters, fit_clusters, pca_features, separation

__all__ = ["ClusterFit", "choose_clusters", "fit_clusters", "pca_features", "separation"]
