"""Secure aggregation (Bonawitz et al. 2017) and, later, bidirectional model perturbation (MP-DP).

The server learns the sum of the surviving clients' vectors and nothing else about any one of them, under an
honest-but-curious server that does not collude with clients (docs/secure.md states the threat model).
"""
