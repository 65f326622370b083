"""dpfl's documented upper bounds on sizes, and the one check that enforces them.

A config is validated and the run built before anything is written, so a value no run could honour
(a billion clients, 10^15 rounds, a batch beyond any dataset, a structure nested a thousand deep) must
fail there, as one line, instead of hanging, allocating gigabytes or overflowing a C integer halfway
through a run. The bounds sit far above every example config and reproduction grid (at most 100
clients, 600 rounds, 200 local steps, 30 local epochs, batch 128 and TK = 30,000 steps of the f-DP grid);
each field's docstring restates its own.
"""

from __future__ import annotations

# the algorithms' own bounds live with their params models (MAX_LOCAL_EPOCHS: training.local_epochs too)
from dpfl.algorithms.catalog.validation import MAX_ITERATIONS, MAX_LOCAL_EPOCHS
from dpfl.algorithms.catalog.validation import at_most as _at_most
from dpfl.privacy.calibration import MIN_NOISE_MULTIPLIER

__all__ = ["MAX_BATCH_SIZE", "MAX_CLIENTS", "MAX_CONFIG_CHARS", "MAX_DEPTH", "MAX_ITERATIONS", "MAX_LOCAL_EPOCHS",
           "MAX_LOCAL_STEPS", "MAX_NOISE_MULTIPLIER", "MAX_NOISY_STEPS", "MAX_ROUNDS", "MIN_NOISE_MULTIPLIER",
           "_at_most"]

MAX_CLIENTS = 10_000_000  # data.clients: a cross-device population (10 million fit in 24 GiB, docs/scale.md)
MAX_ROUNDS = 1_000_000  # training.rounds
MAX_LOCAL_STEPS = 1_000_000  # training.local_steps
MAX_BATCH_SIZE = 1_000_000  # every batch size; a batch above a client's records is its whole set
MAX_NOISY_STEPS = 10_000_000  # rounds x local_steps of Noisy-FedAvg/FedProx: the f-DP step-size table's size
# privacy.noise_multiplier: 0 (no noise) or within these. Outside, float64 accountants break down: the RDP
# accountant overflows above ~1e154 and reports epsilon = 0 (!) for a Poisson-sampled z of 1e-160.
MAX_NOISE_MULTIPLIER = 1e6
MAX_CONFIG_CHARS = 64 * 2**20  # a config file (a list of a million budgets is ~10 MB)
MAX_DEPTH = 32  # nesting of the config document (the deepest field, algorithm.params.step_sizes, is 5 levels)
