"""Client selection draws from the round's own stream over the candidates in id order, whatever order they come in."""

from __future__ import annotations

import numpy as np
import pytest

from dpfl.algorithms.selection import Selection


@pytest.mark.parametrize("selection", [Selection(), Selection("fixed", k=5), Selection("poisson", rate=0.3)])
def test_the_draw_does_not_depend_on_the_candidates_order(selection):
    ids = np.arange(3, 60, 2)
    shuffled = np.random.default_rng(0).permutation(ids)
    for r in range(4):
        sorted_pick = selection.select(ids, seed=7, round_=r)
        assert np.array_equal(selection.select(shuffled, seed=7, round_=r), sorted_pick)
        assert np.array_equal(selection.select(list(ids), seed=7, round_=r), sorted_pick)
        assert np.all(np.diff(sorted_pick) > 0) and np.isin(sorted_pick, ids).all()
    picks = {tuple(Selection("fixed", k=5).select(ids, seed=7, round_=r)) for r in range(4)}
    assert len(picks) > 1  # the rounds draw differently
