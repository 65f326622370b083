"""Attacks for evaluating what a privacy mechanism stops in practice (spec bidirectional.md §10).

Each attack reaches an algorithm only through an adapter that says what the attacker sees (for MP-DP:
`dpfl.algorithms.secure.mpdp.views`). So far: `demask` (a client undoing MP-DP's model hiding, W3).
"""
