"""Membership inference attacks (spec bidirectional.md §10 "Membership inference by clients", T31).

Measured with the seeds below (OMP_NUM_THREADS=1, float64): the overfit CE model (200 digits, 100% train accuracy,
~85.5% test accuracy) gives loss-threshold ASR 0.73 / AUC 0.735, confidence 0.72 / 0.73, shadow (target's known
half) 0.665 / 0.70; with an independent shadow model 0.725 / 0.73; MLP attack classifier 0.665 / 0.705; TPR at
1% FPR 0.08 (loss). Over model seeds 0-4 the loss ASR ranged 0.675-0.73 and the AUC 0.68-0.74. The MSE-trained model
interpolates its one-hot targets and leaks far more (loss ASR 0.98, AUC 0.998). On random membership labels the
ASR/AUC were 0.517/0.549 (loss), 0.517/0.542 (confidence), 0.508/0.493 (shadow); over 20 random splits their means
were 0.494-0.499 with standard deviations 0.016-0.026, matching the binomial / Mann-Whitney standard errors used as
tolerances below.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from dpfl.attacks.membership import (
    Shadow,
    attack_metrics,
    best_threshold,
    confidence_scores,
    fit_shadow_attack,
    lira_offline_scores,
    logit_confidence,
    per_example_loss,
    plot_roc,
    run_membership_attacks,
    tpr_at_fpr,
)
from dpfl.data import load_dataset

N_MEMBERS = 200


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    assert ds.x_train.shape[1:] == (1, 8, 8) and float(ds.x_train.min()) >= 0 and float(ds.x_train.max()) <= 1
    flat = lambda a: a.reshape(len(a), -1).to(torch.float64)  # noqa: E731
    return flat(ds.x_train), ds.y_train, flat(ds.x_test), ds.y_test


def _train(x, y, seed, steps=1000, loss="cross_entropy"):
    """A 64-128-10 MLP, full-batch Adam, no regularisation: fits 200 digits to 100% (well under a second)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(torch.float64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        out = model(x)
        if loss == "cross_entropy":
            value = nn.functional.cross_entropy(out, y)
        else:
            value = 0.5 * ((out - nn.functional.one_hot(y, 10).to(out.dtype)) ** 2).sum(1).mean()
        value.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def overfit(digits):
    x, y, xt, yt = digits
    model = _train(x[:N_MEMBERS], y[:N_MEMBERS], seed=0)
    with torch.no_grad():
        assert (model(x[:N_MEMBERS]).argmax(1) == y[:N_MEMBERS]).all()  # 100% train accuracy: overfit
        assert (model(xt).argmax(1) == yt).double().mean() < 0.95  # measured 0.855: a generalisation gap
    return model, (x[:N_MEMBERS], y[:N_MEMBERS]), (xt[:N_MEMBERS], yt[:N_MEMBERS])


# The held-out evaluation has 100 members + 100 non-members here, so the binomial standard error of an ASR near
# 0.7 is sqrt(0.21/200) ≈ 0.032: the measured 0.665-0.73 clear 0.6 by 2-4 standard errors.


def test_overfit_model_is_attackable(overfit):  # T31, first half
    model, members, nonmembers = overfit
    res = run_membership_attacks(model, members, nonmembers, seed=0)
    assert set(res) == {"loss", "confidence", "shadow"}
    for name, m in res.items():
        assert m["n_members"] == m["n_nonmembers"] == N_MEMBERS // 2  # balanced held-out half
        assert m["threshold_protocol"] == "calibration"
        assert m["asr"] > 0.6 and m["auc"] > 0.6, (name, m["asr"], m["auc"])


def test_independent_shadow_model_and_mlp_attack(digits, overfit):
    x, y, _, _ = digits
    model, members, nonmembers = overfit
    shadow_model = _train(x[400:600], y[400:600], seed=1)  # same recipe, data disjoint from the target's sets
    shadow = Shadow(shadow_model, (x[400:600], y[400:600]), (x[600:800], y[600:800]))
    res = run_membership_attacks(model, members, nonmembers, seed=0, shadows=[shadow])
    assert res["shadow"]["asr"] > 0.6 and res["shadow"]["auc"] > 0.6  # measured 0.725 / 0.731
    res = run_membership_attacks(model, members, nonmembers, seed=0, classifier="mlp")
    assert res["shadow"]["asr"] > 0.6 and res["shadow"]["auc"] > 0.6  # measured 0.665 / 0.705
    # a plain 3-tuple works like Shadow, and scores are member probabilities
    attack = fit_shadow_attack([(shadow_model, shadow.members, shadow.nonmembers)], seed=0)
    with torch.no_grad():
        s = attack.scores(model(members[0]), members[1])
    assert s.shape == (N_MEMBERS,) and ((s >= 0) & (s <= 1)).all()


def test_mse_onehot_model_is_attackable(digits):
    x, y, xt, yt = digits
    model = _train(x[:N_MEMBERS], y[:N_MEMBERS], seed=0, steps=300, loss="mse")
    res = run_membership_attacks(model, (x[:N_MEMBERS], y[:N_MEMBERS]), (xt[:N_MEMBERS], yt[:N_MEMBERS]), seed=0,
                                 loss="mse_onehot")
    assert res["loss"]["asr"] > 0.6 and res["loss"]["auc"] > 0.6  # measured 0.98 / 0.998
    assert res["shadow"]["asr"] > 0.6  # measured 0.985


def test_random_membership_labels_give_chance(digits, overfit):  # T31, second half
    x, y, xt, yt = digits
    model = overfit[0]  # trained on x[:200] only; the pool below is disjoint from it
    pool_x, pool_y = torch.cat([x[600:], xt]), torch.cat([y[600:], yt])  # 1197 examples no one trained on
    perm = np.random.default_rng(1).permutation(len(pool_x))
    half = len(perm) // 2
    res = run_membership_attacks(model, (pool_x[perm[:half]], pool_y[perm[:half]]),
                                 (pool_x[perm[half:]], pool_y[perm[half:]]), seed=0)
    n = res["loss"]["n_members"]
    assert n == 299  # 598 held-out, 299 per side
    # Under the null the threshold (picked on the known half) is independent of the held-out half, so the held-out
    # accuracy is a binomial proportion over 2n examples: SE = 0.5/sqrt(2n) ≈ 0.020. The AUC is a Mann-Whitney
    # statistic: SE = sqrt((2n+1)/(12 n²)) ≈ 0.024. Allow 3 SE (measured: |ASR-0.5| <= 0.017, |AUC-0.5| <= 0.049).
    se_asr, se_auc = 0.5 / math.sqrt(2 * n), math.sqrt((2 * n + 1) / (12 * n * n))
    for name, m in res.items():
        assert abs(m["asr"] - 0.5) <= 3 * se_asr, (name, m["asr"])
        assert abs(m["auc"] - 0.5) <= 3 * se_auc, (name, m["auc"])


# --- metrics: known answers -------------------------------------------------------------------------------------


def test_metrics_perfect_separation():
    # a wide gap, so that the threshold cross-fitted on half of each side also separates the other half
    members, nonmembers = np.arange(100.0, 110.0), np.arange(0.0, 10.0)
    for kw in ({}, {"calibration": (members + 5, nonmembers + 5)}, {"threshold": 50.0}):
        m = attack_metrics(members, nonmembers, **kw)
        assert (m["asr"], m["auc"], m["tpr_at_1fpr"]) == (1.0, 1.0, 1.0), kw
    assert attack_metrics(members, nonmembers)["threshold_protocol"] == "cross_fit"
    assert best_threshold(members, nonmembers) == 54.5  # the midpoint of the gap
    # cross-fitting is honest: adjacent scores (10..19 vs 0..9) separate perfectly only in hindsight, and a
    # threshold chosen on one half misplaces some of the other half (AUC stays 1, threshold-free)
    m = attack_metrics(members - 90, nonmembers)
    assert m["auc"] == 1.0 and 0.5 < m["asr"] < 1.0


def test_metrics_identical_scores_are_chance():
    m = attack_metrics(np.ones(50), np.ones(50))
    assert m["auc"] == 0.5 and m["asr"] == 0.5 and m["tpr_at_1fpr"] == 0.0


def test_threshold_is_taken_from_calibration_not_from_evaluation():
    members, nonmembers = np.arange(10.0, 20.0), np.arange(0.0, 10.0)
    # a calibration split whose best threshold (29.5) calls every evaluation score a non-member
    m = attack_metrics(members, nonmembers, calibration=(np.arange(30.0, 40.0), np.arange(20.0, 30.0)))
    assert m["threshold"] == 29.5 and m["asr"] == 0.5 and m["auc"] == 1.0


def test_tpr_at_1fpr_hand_built():
    nonmembers = np.arange(200.0)  # FPR steps of 1/200: at most 2 false positives are allowed at 1%
    top = np.arange(1000.0, 1040.0)  # 40 members above every non-member
    low = np.full(50, -1.0)  # 50 members below every non-member
    # 10 members at 197.5: flagging them costs exactly 2 false positives (198, 199) -> FPR 0.01 allowed, TPR 0.5
    m = attack_metrics(np.concatenate([top, np.full(10, 197.5), low]), nonmembers)
    assert m["tpr_at_1fpr"] == 0.5
    # at 196.5 they cost 3 false positives (FPR 0.015): only the 40 clear members count, TPR 0.4
    m = attack_metrics(np.concatenate([top, np.full(10, 196.5), low]), nonmembers)
    assert m["tpr_at_1fpr"] == 0.4
    assert tpr_at_fpr(np.array([0.0, 0.02, 1.0]), np.array([0.3, 0.9, 1.0])) == 0.3  # no interpolation


# --- scores ----------------------------------------------------------------------------------------------------


def test_scores_known_answers():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0]], dtype=torch.float64)
    labels = torch.tensor([0, 2])
    ce = per_example_loss(logits, labels)
    assert np.allclose(ce, nn.functional.cross_entropy(logits, labels, reduction="none").numpy(), atol=1e-12)
    scores = np.array([[0.9, 0.2, 0.0], [0.0, 1.0, 0.0]])
    assert np.allclose(per_example_loss(scores, [0, 1], loss="mse_onehot"), [0.5 * (0.01 + 0.04), 0.0])
    p = torch.softmax(logits, 1).numpy()
    assert np.allclose(confidence_scores(logits), p.max(1))
    assert np.allclose(confidence_scores(logits, labels, kind="true_label"), p[[0, 1], [0, 2]])
    py = p[[0, 1], [0, 2]]
    assert np.allclose(logit_confidence(logits, labels), np.log(py / (1 - py)), atol=1e-12)
    # stable where p_y rounds to 1 in float64: phi = 800 - logsumexp(0, 0)
    assert logit_confidence(np.array([[800.0, 0.0, 0.0]]), [0])[0] == pytest.approx(800 - math.log(2))


def test_lira_offline_scores():
    rng = np.random.default_rng(0)
    out = rng.normal(loc=[0.0, 0.0, 5.0], scale=[1.0, 1.0, 0.1], size=(16, 3))  # 16 OUT models, 3 examples
    target = np.array([6.0, 0.0, 5.0])  # far above its OUT distribution / inside it / inside a narrow one
    s = lira_offline_scores(target, out)
    assert s[0] > s[1] + 5 and s[0] > s[2] + 5
    assert 0.2 < s[1] < 2 and 0.2 < s[2] < 2  # about -log(1/2) at the OUT mean
    assert lira_offline_scores(np.array([-6.0, 0.0, 5.0]), out)[0] < s[1]  # one-sided: far below is not a member
    # a fixed (pooled) variance treats a 0.5 offset alike on a narrow and a wide example
    fixed = lira_offline_scores(np.array([0.5, 0.5, 5.5]), out, fixed_variance=True)
    free = lira_offline_scores(np.array([0.5, 0.5, 5.5]), out)
    assert abs(fixed[2] - fixed[0]) < 1 and free[2] > free[0] + 5
    # scores never saturate: finite and increasing far in the tail
    far = lira_offline_scores(np.array([50.0, 60.0, 5.0]), out)
    assert np.isfinite(far).all() and far[1] > far[0]


# --- plot and errors ---------------------------------------------------------------------------------------------


def test_plot_roc_writes_png(tmp_path):
    rng = np.random.default_rng(0)
    m = attack_metrics(rng.normal(1, 1, 100), rng.normal(0, 1, 100))
    curves = {"loss": (m["fpr"], m["tpr"]), "chance-ish": ([0, 0.5, 1], [0, 0.5, 1])}
    path = plot_roc(curves, tmp_path / "a" / "roc.png")
    data = path.read_bytes()
    assert path.stat().st_size > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_raises():
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(10, 4, generator=g), torch.randint(0, 3, (10,), generator=g)
    predict = lambda a: torch.as_tensor(a)[:, :3]  # noqa: E731
    with pytest.raises(ValueError, match="empty"):
        run_membership_attacks(predict, (x[:0], y[:0]), (x, y))
    with pytest.raises(ValueError, match="labels"):
        run_membership_attacks(predict, (x, y[:9]), (x, y))
    with pytest.raises(ValueError, match="at least 4"):
        run_membership_attacks(predict, (x[:3], y[:3]), (x, y))
    with pytest.raises(ValueError, match="loss must be"):
        run_membership_attacks(predict, (x, y), (x, y), loss="hinge")
    with pytest.raises(ValueError, match="rows"):
        run_membership_attacks(lambda a: torch.zeros(5, 3), (x, y), (x, y))
    with pytest.raises(ValueError, match=r"\[N, C\]"):
        run_membership_attacks(lambda a: torch.zeros(len(a)), (x, y), (x, y))
    with pytest.raises(ValueError, match="lie in"):
        run_membership_attacks(predict, (x, y + 3), (x, y))
    with pytest.raises(ValueError, match="classifier"):
        run_membership_attacks(predict, (x, y), (x, y), classifier="forest")
    with pytest.raises(ValueError, match="non-empty"):
        attack_metrics([], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        attack_metrics([np.nan, 1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="not both"):
        attack_metrics([1.0, 2.0], [0.0, 1.0], calibration=([1.0], [0.0]), threshold=0.5)
    with pytest.raises(ValueError, match="at least 2 OUT"):
        lira_offline_scores(np.zeros(3), np.zeros((1, 3)))
    with pytest.raises(ValueError, match="shape"):
        lira_offline_scores(np.zeros(3), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="at least one"):
        fit_shadow_attack([])
    with pytest.raises(ValueError, match="at least one curve"):
        plot_roc({}, "unused.png")
