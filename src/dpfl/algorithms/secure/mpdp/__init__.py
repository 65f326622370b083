"""MP-DP (Yang et al., arXiv 2412.11737): server-side model perturbation plus client-side distributed noise.

Spec: shared/specs/bidirectional.md; docs/algorithms/mpdp.md. `dn` (the DN distributions), `perturb` (MP_Server and the
factor plan of sequential ReLU MLPs / CNNs), `lmt` (client gradients and corrections at the perturbed model),
`ddp` (η and key-derived pairwise Δ), `recovery` (secagg_recovery of dropped clients), `update` (MU_Server),
`algorithm` (a FedSGD round of MP-DP and its baselines), `privacy` (the nominal calculator and audits).
"""
