"""The exponential mechanism by Gumbel-max (clustered_dpfl.md §5.4, required test 1)."""

import numpy as np
import pytest
from scipy import stats

from dpfl.algorithms.client import private_selection as sel


def test_gumbel_max_is_the_exponential_mechanism():
    scores, n_records, eps_sel = np.array([90.0, 85.0, 40.0, 85.5]), 50, 0.5
    delta = sel.accuracy_sensitivity(n_records)
    assert delta == pytest.approx(100 / 49)
    assert sel.gumbel_scale(delta, eps_sel) == pytest.approx(2 * delta / eps_sel)
    target = sel.selection_probabilities(scores, delta, eps_sel)
    logits = eps_sel * scores / (2 * delta)
    assert np.allclose(target, np.exp(logits) / np.exp(logits).sum())
    assert np.allclose(target, [0.472, 0.256, 0.001, 0.272], atol=1e-3)
    rng = np.random.default_rng(2024)
    draws = 200_000
    counts = np.bincount([sel.select(scores, delta, eps_sel, rng) for _ in range(draws)], minlength=4)
    assert (target * draws >= 5).all()  # the chi-square approximation holds in every cell (the rarest: ~200)
    assert stats.chisquare(counts, target * draws).pvalue > 1e-3


def test_a_wrong_scale_is_detected():
    """The same chi-square check rejects Gumbel noise at half the scale (the check has power)."""
    scores, delta, eps_sel = np.array([90.0, 85.0, 40.0, 85.5]), 100 / 49, 0.5
    rng = np.random.default_rng(7)
    noise = rng.gumbel(0, sel.gumbel_scale(delta, eps_sel) / 2, size=(50_000, 4))
    counts = np.bincount(np.argmax(scores + noise, axis=1), minlength=4)
    target = sel.selection_probabilities(scores, delta, eps_sel)
    assert stats.chisquare(counts[[0, 1, 3]], target[[0, 1, 3]] / target[[0, 1, 3]].sum() * counts[[0, 1, 3]].sum()
                           ).pvalue < 1e-6


def test_bad_inputs():
    with pytest.raises(ValueError, match=">= 2 records"):
        sel.accuracy_sensitivity(1)
    with pytest.raises(ValueError, match="eps_sel"):
        sel.gumbel_scale(1.0, 0.0)
    with pytest.raises(ValueError, match="scores"):
        sel.select(np.array([]), 1.0, 1.0, np.random.default_rng(0))


def test_answers_score_accuracy_or_the_clipped_loss_with_their_sensitivities():
    """A model that fits the client's data wins under both scores when the noise is negligible; the loss score's
    sensitivity is L_max / (N_i - 1)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x = torch.randn(200, 4)
    good = {"weight": torch.randn(3, 4), "bias": torch.zeros(3)}
    y = (x @ good["weight"].T).argmax(1)
    models = {n: torch.stack([torch.zeros_like(t), t, -t]) for n, t in good.items()}
    for score, cap in (("accuracy", None), ("neg_clipped_loss", 5.0)):
        choice = sel.ModelChoice((0,), models, eps_sel=1e6, score=score, loss_cap=cap)
        assert sel.answer(choice, model, x, y, "cross_entropy", np.random.default_rng(0)) == 1
    assert sel.ModelChoice((0,), models, 1.0, "neg_clipped_loss", 5.0).sensitivity(201) == pytest.approx(5.0 / 200)
    assert sel.ModelChoice((0,), models, 1.0).sensitivity(201) == pytest.approx(100.0 / 200)
    with pytest.raises(ValueError, match="loss cap"):
        sel.ModelChoice((0,), models, 1.0, "neg_clipped_loss")
