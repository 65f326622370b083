"""Evaluations driven by a config or a finished run: they build runs, load released models and call the attacks.

`dpfl.attacks` holds the attacks themselves as pure functions of what an attacker sees; this layer wires them to
dpfl's runs (docs/attacks.md): `audit` and `sample_audit` (the empirical one-run audit through the real mechanism),
`probe` (one client's upload in a probe round, inverted), `released` (a finished run's global model, for membership
inference), `mpdp_attacks` and `mpdp_inversion` (what a curious client and the server learn from an MP-DP run),
`confidence` (a released model's loss split into right and wrong predictions) and `fdp_from_run` (a Noisy-FedAvg
run's f-DP curves). It sits above `dpfl.api` and `dpfl.experiment`, below `dpfl.reproduce` and `dpfl.cli`.
"""
