"""MP-DP (Yang et al., arXiv 2412.11737): server-side model perturbation plus client-side distributed noise.

Spec: shared/specs/bidirectional.md. Built so far: the DN distributions (`dn`), the privacy calculator
(`privacy`). The model perturbation, local training, distributed noise and the round are still to come.
"""
