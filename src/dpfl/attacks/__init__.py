"""Attacks that measure what a privacy mechanism stops in practice (spec bidirectional.md §10; docs/attacks.md).

Each attack reaches an algorithm only through an adapter that says what the attacker sees: `probe` (one client's
upload as the server receives it), `released` (a finished run's global model), `mpdp.views` (MP-DP's perturbed
model). Attacks: `inversion` (DLG, Inverting Gradients; metrics in `image_metrics`, pictures in `figures`),
`membership` (loss/confidence thresholds, shadow model, offline LiRA scores), `demask` (a client undoing MP-DP's
model hiding). Audits: `audit` (client-level canaries through the real mechanism) with `one_run` (Steinke et al.'s
one-run lower bound on epsilon).
"""
