"""Checks of a built run before its first round: a run that cannot train is refused, and what its noise means for
the clients is said where a user would not expect it.

Apart from the loop because they change nothing in a run that is allowed: they read the run's budgets, noise and
selection, and raise (`ValueError`, one line) or warn (`RunNotice`).
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np

from dpfl.privacy.adaptive_clipping import update_noise_multiplier

if TYPE_CHECKING:
    from dpfl.experiment.federated_run import FederatedRun

# below this many expected participations in the whole run, a run most likely trains nothing
MIN_PARTICIPATIONS = 1.0


class RunNotice(UserWarning):
    """What a run's configuration means that its user may not expect (the CLI prints it as one `note:` line)."""


def refuse_a_run_that_trains_nothing(run: FederatedRun) -> None:
    """No client can afford its first round within its budget (no noise, or too little for a finite budget), or the
    client selection draws, on average, less than one participant in the whole run: the run would end with the
    initial model. Refused before anything is written."""
    selection = run.algorithm.selection
    expected = selection.expected_count(run.n_clients) * run.rounds
    if expected < MIN_PARTICIPATIONS:
        raise ValueError(f"training.selection: a rate of {selection.rate:g} draws on average {expected:.3g} "
                         f"participants in {run.rounds} rounds of {run.n_clients} clients: the run would most likely "
                         "train nothing; raise the rate or the rounds")
    if run.ledger is None or not run.enforce_budgets or run.heuristic_steps is not None:
        return
    active = np.arange(run.n_clients)
    eligible = run.first_round_eligible(active)
    if len(eligible) < selection.min_candidates():
        noise = _stage_noise(run)
        why = " (a noise multiplier of 0 makes a round cost an infinite epsilon)" if noise == 0 else ""
        raise ValueError(f"privacy: {'no client' if not len(eligible) else f'only {len(eligible)} clients'} can "
                         f"afford even one round within its budget at this noise{why}, so the run would train "
                         "nothing; give a larger privacy.noise_multiplier, or leave it null to calibrate it from the "
                         "budgets")


def note_what_the_noise_means(run: FederatedRun) -> None:
    """Central DP serves every client with one noise, fitted to the smallest budget; client-level noise on few
    clients' updates is larger than their mean."""
    alg = run.algorithm
    if alg.unit != "client" or run.budgets is None:
        return
    noise = _stage_noise(run)
    budgets = sorted({b.epsilon for b in run.budgets})
    if (alg.central or alg.aggregator.central_noise) and run.calibrated is not None and len(budgets) > 1:
        warnings.warn(RunNotice(
            f"central DP adds one noise for all clients, calibrated to the smallest budget (epsilon {budgets[0]:g}); "
            f"clients with larger budgets (up to {budgets[-1]:g}) get that same guarantee and spend less than they "
            "allow"), stacklevel=3)
    # the cohort whose mean the noise is sized for: a simulated cohort's (noise_cohort_size) where one is simulated
    cohort = alg.aggregator.accounted_selection(alg.selection).expected_count(run.n_clients)
    if noise is None or noise <= 0 or cohort <= 0:
        return
    adaptive = alg.aggregator.adaptive_clipping
    share = ""
    if adaptive is not None and adaptive.count_noise is not None:  # Theorem 1: the update gets z_Delta > z
        noise, share = update_noise_multiplier(noise, adaptive.count_noise), f", the update's share of {noise:g}"
    dim = sum(p.numel() for p in run.model.parameters())
    ratio = noise * math.sqrt(dim) / cohort  # E||noise|| on the mean update / the largest mean update (the clip)
    if ratio > 1:
        warnings.warn(RunNotice(
            f"client-level DP with about {cohort:g} clients per round: the noise added to their mean update has a "
            f"norm about {ratio:.3g} times the largest mean update it can hide in (noise {noise:g}{share} x "
            f"sqrt({dim}) parameters / {cohort:g} clients), so it will dominate; client-level DP needs many clients "
            "per round"), stacklevel=3)


def _stage_noise(run: FederatedRun) -> float | None:
    """The noise multiplier of the run's mechanism: the server's (central DP), the uploads' (UDP), or the clients'
    DP-SGD noise (the smallest); None where no stage states one."""
    alg = run.algorithm
    for stage in (alg.aggregator, alg.upload):
        if stage.noise is not None:
            return float(stage.noise)
    if alg.local.private and len(run.noise):
        return float(np.min(run.noise))
    return None
