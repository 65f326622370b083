"""Attacks that measure what a privacy mechanism stops in practice (spec bidirectional.md §10; docs/attacks.md).

Pure functions of what an attacker sees, with no knowledge of dpfl's runs or configs: `inversion` (DLG, Inverting
Gradients; metrics in `image_metrics`, pictures in `figures`), `membership` (loss/confidence thresholds, shadow
model, offline LiRA scores), `demask` (a client undoing MP-DP's model hiding) and `one_run` (Steinke et al.'s
one-run lower bound on epsilon). `dpfl.evaluate` wires them to runs: a probe round's upload (`evaluate.probe`), a
finished run's global model (`evaluate.released`), the canary audits (`evaluate.audit`, `evaluate.sample_audit`)
and MP-DP's client and server attacks (`evaluate.mpdp_attacks`, `evaluate.mpdp_inversion`).
"""
