"""The mechanism-state contract (dpfl.algorithms.stages): an upload mechanism's state goes through the loop, its
checkpoint and a kill, and a resumed run releases exactly what an uninterrupted run releases.

The mechanism (tests/stateful_mechanism.py, test only) moves its clip C_t every round from the released norms, so a
resume that restarted it from `init()` (or lost its state) would clip, noise and aggregate differently from round 3
on: the final parameters would differ.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.stages import MechanismChain
from dpfl.experiment.run_records import RunState
from dpfl.privacy.events import gaussian_event
from stateful_mechanism import ReleasedNormClip, federation_run
from untimed import untimed

SCRIPT = Path(__file__).parents[1] / "stateful_mechanism.py"


def test_the_mechanism_parameter_changes_every_round_and_is_reported():
    result = federation_run().run()
    clips = [row["mechanism_clip"] for row in result.history]
    assert clips[0] == 0.05  # init()
    assert len(set(clips)) == len(clips)  # a new C_t every round: a lost state would show
    assert result.spent() and all(eps > 0 for eps in result.spent().values())  # the chain's events were charged


def test_the_chain_derives_its_unit_events_and_description_from_its_links():
    chain = MechanismChain((ReleasedNormClip(noise_multiplier=0.5), FullUpdate()))
    assert chain.unit == "client" and chain.accounted
    assert repr(chain.event(0, 0, 4)) == repr(gaussian_event(0.5))
    assert chain.init() == ({"clip": 0.05}, None)
    assert chain.describe().startswith("TEST ONLY") and chain.describe().endswith("full update")
    with pytest.raises(ValueError, match="at least one mechanism"):
        MechanismChain(())


def test_a_killed_run_resumes_with_its_mechanism_state(tmp_path):
    """Killed by SIGKILL right after round 2's checkpoint, then resumed in a new process: the same parameters,
    metrics and ledger as the uninterrupted run in this process."""
    full = federation_run().run()
    checkpoint, out = tmp_path / "checkpoint.pt", tmp_path / "result.pt"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    killed = subprocess.run([sys.executable, str(SCRIPT), str(checkpoint), str(out), "--kill-after", "2"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    assert not out.exists()
    saved = RunState.from_dict(torch.load(checkpoint, weights_only=True))
    assert saved.round == 2 and saved.mechanism_state[0]["clip"] == full.history[2]["mechanism_clip"]
    resumed = subprocess.run([sys.executable, str(SCRIPT), str(checkpoint), str(out)], env=env, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    got = torch.load(out, weights_only=True)
    assert untimed(got["history"]) == untimed(full.history)
    assert got["spent"] == full.spent()
    for name, t in full.params.items():
        assert torch.equal(got["params"][name], t)


def test_a_checkpoint_without_the_mechanism_state_is_refused():
    states = []
    federation_run().run(on_checkpoint=states.append)
    forgetful = RunState.from_dict({**states[1].to_dict(), "mechanism_state": None})
    with pytest.raises(ValueError, match="no state for the upload mechanism"):
        federation_run().run(state=forgetful)
