"""A round's budget check for a whole population is answered per group of alike clients (`RunEvents.client_groups`,
`PrivacyLedger.exceeding_mask`, issue 67's population scale): the groups must give every client the event
`RunEvents.client` gives it, and the eligible clients must be those the per-client check finds."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.experiment.build import build_run
from dpfl.experiment.config import validate_config
from dpfl.privacy import gaussian_event


def hetero_run(algorithm="dp_fedavg_local", **privacy):
    return build_run(validate_config({
        "name": "groups", "seed": 0,
        "data": {"dataset": "digits", "clients": 30, "partition": "iid_equal"},
        "model": {"name": "logr"}, "algorithm": {"name": algorithm},
        "training": {"rounds": 12, "local_steps": 3, "batch_size": "hetero", "optimizer": {"lr": 0.1},
                     "selection": {"kind": "fixed", "k": 5}},
        "privacy": {"clip": 1.0, "budgets": {"distribution": "choice", "values": [0.5, 1.0, 3.0]}, **privacy}}))


def per_client_eligible(run, candidates, r, cohort):
    return [int(i) for i in candidates if not run.ledger.would_exceed(int(i), run.events.client(int(i), r, cohort))]


@pytest.mark.parametrize("round_", [0, 2])
def test_groups_give_each_client_its_event_and_the_same_eligible_clients(round_):
    run = hetero_run()
    assert len(set(run.batch_sizes.tolist())) > 1 and len(set(np.round(run.noise, 9).tolist())) > 1
    for r in range(round_):  # some history, so the ledger's classes differ between clients
        run._record(r, np.arange(0, 30, 2 + r), np.arange(30), None)
    candidates = np.arange(30)
    index, events = run.events.client_groups(candidates, round_, 5)
    assert [events[j] for j in index] == [run.events.client(i, round_, 5) for i in range(30)]
    assert len(events) < 30  # grouped: fewer events than clients
    eligible = run._eligible(candidates, None, round_)
    assert eligible.tolist() == per_client_eligible(run, candidates, round_, 5)


def test_clients_past_their_plan_are_ineligible_in_both_checks():
    run = hetero_run()
    for r in range(3):  # clients 0..14 take part in three rounds, more than the two their noise was planned for
        run._record(r, np.arange(15), np.arange(30), None)
    eligible = run._eligible(np.arange(30), None, 3)
    assert 0 < len(eligible) < 30  # the check excludes some clients and keeps others
    assert eligible.tolist() == per_client_eligible(run, np.arange(30), 3, 5)


@dataclass(frozen=True)
class PerClientUpload(ClippedNoisyUpdate):
    """An upload whose event depends on the client (it says so by not declaring `same_event_for_every_client`)."""

    def events_for_every_client(self) -> bool:
        return False

    def event(self, client, round_, cohort):
        return gaussian_event(2.0 + client % 3)


def test_an_upload_whose_event_depends_on_the_client_is_asked_per_client():
    run = hetero_run("udp_fedavg")
    run.algorithm = replace(run.algorithm, upload=PerClientUpload(**{
        f: getattr(run.algorithm.upload, f) for f in ("clip", "noise_multiplier", "cohort", "unit")}))
    index, events = run.events.client_groups(np.arange(30), 0, 5)
    assert [events[j] for j in index] == [run.events.client(i, 0, 5) for i in range(30)]
    assert len({repr(e) for e in events}) >= 3  # three upload events, per client
