"""Membership inference against any classifier (spec bidirectional.md §10 "Membership inference by clients", T31).

The attacker (a client) holds the model it received as a callable ``predict(x) -> [N, C]`` logits or scores,
and labelled examples of which it knows part of the membership. Nothing here is specific to MP-DP: an adapter
(e.g. ``mpdp.views``, or the demasked network of ``attacks.demask``) supplies ``predict``.

Every attack yields one score per example, **higher = more likely a member**:

- loss and confidence thresholds (Yeom et al., "Privacy Risk in Machine Learning: Analyzing the Connection to
  Overfitting", arXiv 1709.01604): members have lower loss and higher confidence;
- a shadow-model attack (Shokri et al., "Membership Inference Attacks Against Machine Learning Models",
  arXiv 1610.05820) in the spec's form: a classifier on the sorted output probabilities plus the loss, trained on
  balanced known members / non-members (of the target itself by default, of shadow models if given);
- offline LiRA scores (Carlini et al., "Membership Inference Attacks From First Principles", arXiv 2112.03570)
  from reference models trained without each example, as a pure function of their logit-scaled confidences.

Models trained with MSE on one-hot targets (MP-DP's loss) are supported by ``loss="mse_onehot"``: the loss score
is then ½‖out − onehot(y)‖², and probabilities are the softmax of the scores — not calibrated, but a monotone
per-example ranking, which is all the confidence and shadow features need.

Evaluation protocol (``run_membership_attacks``): members and non-members are subsampled to the same size n and
each split at random into an attacker-known half (⌊n/2⌋ per side) and a held-out half (the rest, per side), so both
halves are balanced. The shadow classifier (without explicit shadows) is trained on the known half; every
attack's ASR threshold is chosen on the known half (maximum balanced accuracy); ASR, AUC and TPR at 1% FPR are
measured on the held-out half only, which never picks anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from scipy.special import logsumexp
from scipy.stats import norm
from sklearn.metrics import roc_auc_score, roc_curve

__all__ = [
    "LOSSES",
    "MIN_PER_SIDE",
    "MAX_FPR",
    "NonFiniteOutputsError",
    "Predict",
    "Shadow",
    "ShadowAttack",
    "per_example_loss",
    "output_probabilities",
    "loss_scores",
    "confidence_scores",
    "logit_confidence",
    "attack_features",
    "fit_shadow_attack",
    "lira_offline_scores",
    "best_threshold",
    "tpr_at_fpr",
    "attack_metrics",
    "plot_roc",
    "run_membership_attacks",
]

Predict = Callable[[Any], Any]  # x -> [N, C] logits (cross-entropy) or scores (MSE on one-hot), torch or numpy
LOSSES = ("cross_entropy", "mse_onehot")
MIN_PER_SIDE = 4  # run_membership_attacks: 2 known + 2 held-out per side at the very least
MAX_FPR = 0.01  # the "TPR at 1% FPR" operating point (Carlini et al. 2022 argue for low-FPR reporting)


# ---------------------------------------------------------------------------------------------------------------
# Input handling


def _numpy(a: Any) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


class NonFiniteOutputsError(ValueError):
    """The attacked model's outputs (or the scores made from them) are NaN or infinite: a diverged model, which a
    caller may record as not attackable instead of failing."""

    @property
    def skipped(self) -> str:
        """What a report records in place of the attack's numbers."""
        return f"not attacked: {self} (the model diverged)"


def _outputs(outputs: Any) -> np.ndarray:
    z = _numpy(outputs).astype(np.float64)
    if z.ndim != 2 or z.shape[1] < 2:
        raise ValueError(f"model outputs must have shape [N, C] with C >= 2, got {z.shape}")
    if not np.isfinite(z).all():
        raise NonFiniteOutputsError("model outputs contain NaN or infinite values")
    return z


def _labels(labels: Any, n: int, n_classes: int) -> np.ndarray:
    y = _numpy(labels)
    if y.ndim != 1 or len(y) != n:
        raise ValueError(f"labels must have shape [{n}] to match the outputs, got {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be integer class indices, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise ValueError(f"labels must lie in [0, {n_classes}), got range [{y.min()}, {y.max()}]")
    return y


def _check_loss(loss: str) -> None:
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")


def _scores(a: Any, name: str) -> np.ndarray:
    s = _numpy(a).astype(np.float64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of scores, got shape {s.shape}")
    if not np.isfinite(s).all():
        raise NonFiniteOutputsError(f"{name} contains NaN or infinite values")
    return s


def _predict(predict: Predict, x: Any, y: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Run the attacked model on a labelled set without building a graph; check what comes back."""
    n = len(x)
    if n == 0:
        raise ValueError(f"{what} is empty")
    if len(y) != n:
        raise ValueError(f"{what}: {n} inputs but {len(y)} labels")
    with torch.no_grad():
        out = predict(x)
    z = _outputs(out)
    if len(z) != n:
        raise ValueError(f"{what}: predict returned {len(z)} rows for {n} inputs")
    return z, _labels(y, n, z.shape[1])


# ---------------------------------------------------------------------------------------------------------------
# Per-example scores (higher = more likely a member)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    return z - logsumexp(z, axis=1, keepdims=True)


def output_probabilities(outputs: Any) -> np.ndarray:
    """Softmax of the outputs, [N, C] (for MSE-trained models a ranking device, not a calibrated probability)."""
    return np.exp(_log_softmax(_outputs(outputs)))


def per_example_loss(outputs: Any, labels: Any, loss: str = "cross_entropy") -> np.ndarray:
    """The training loss of each example: cross-entropy from logits, or ½‖out − onehot(y)‖² (spec's MSE)."""
    _check_loss(loss)
    z = _outputs(outputs)
    y = _labels(labels, len(z), z.shape[1])
    rows = np.arange(len(z))
    with np.errstate(over="ignore", invalid="ignore"):
        if loss == "cross_entropy":
            out = -_log_softmax(z)[rows, y]
        else:
            target = np.zeros_like(z)
            target[rows, y] = 1.0
            out = 0.5 * ((z - target) ** 2).sum(axis=1)
    if not np.isfinite(out).all():
        raise NonFiniteOutputsError(f"the {loss} loss of the model's outputs overflows")
    return out


def loss_scores(outputs: Any, labels: Any, loss: str = "cross_entropy") -> np.ndarray:
    """Yeom et al.'s loss attack score: minus the loss (members were fitted, so their loss is low)."""
    return -per_example_loss(outputs, labels, loss)


def confidence_scores(outputs: Any, labels: Any = None, kind: str = "max") -> np.ndarray:
    """Yeom et al.-style confidence: the largest softmax probability (``kind="max"``, needs no label) or that of
    the true label (``kind="true_label"``; for cross-entropy a monotone function of the loss)."""
    p = output_probabilities(outputs)
    if kind == "max":
        return p.max(axis=1)
    if kind == "true_label":
        if labels is None:
            raise ValueError('kind="true_label" needs the labels')
        y = _labels(labels, len(p), p.shape[1])
        return p[np.arange(len(p)), y]
    raise ValueError(f'kind must be "max" or "true_label", got {kind!r}')


def logit_confidence(outputs: Any, labels: Any) -> np.ndarray:
    """φ = log(p_y / (1 − p_y)) of the softmax, computed stably as z_y − logsumexp_{j≠y} z_j.

    Carlini et al. (arXiv 2112.03570, §4.2) use this logit scaling because it makes the confidences of one example
    over re-trained models approximately Gaussian, which LiRA's parametric test assumes.
    """
    z = _outputs(outputs)
    y = _labels(labels, len(z), z.shape[1])
    rows = np.arange(len(z))
    others = z.copy()
    others[rows, y] = -np.inf
    return z[rows, y] - logsumexp(others, axis=1)


def attack_features(outputs: Any, labels: Any, loss: str = "cross_entropy") -> np.ndarray:
    """Shadow-attack features (spec §10): the output probabilities sorted in decreasing order, plus the loss.

    Sorting makes the features class-agnostic (Shokri et al. train one attack model per class instead; with the
    loss appended, one model for all classes is the simpler and usual variant).
    """
    p = np.sort(output_probabilities(outputs), axis=1)[:, ::-1]
    return np.column_stack([p, per_example_loss(outputs, labels, loss)])


# ---------------------------------------------------------------------------------------------------------------
# Shadow-model attack (Shokri et al.)


class Shadow(NamedTuple):
    """A model with known membership to train the attack classifier on: ``(predict, (x, y), (x, y))``.

    A plain 3-tuple of the same form is accepted as well.
    """

    predict: Predict
    members: tuple[Any, Any]
    nonmembers: tuple[Any, Any]


@dataclass(frozen=True)
class ShadowAttack:
    """A fitted attack classifier; ``scores`` is its member probability for each example."""

    classifier: Any  # a fitted scikit-learn pipeline (scaler + classifier)
    loss: str

    def scores(self, outputs: Any, labels: Any) -> np.ndarray:
        return self.classifier.predict_proba(attack_features(outputs, labels, self.loss))[:, 1]


def _balanced(n_in: int, n_out: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Indices subsampling the larger side to the smaller one, so the attack trains on balanced data."""
    n = min(n_in, n_out)
    return np.sort(rng.permutation(n_in)[:n]), np.sort(rng.permutation(n_out)[:n])


def _classifier(kind: str, seed: int) -> Any:
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if kind == "logistic":
        return make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed))
    if kind == "mlp":
        return make_pipeline(StandardScaler(), MLPClassifier(hidden_layer_sizes=(32,), max_iter=2000,
                                                             random_state=seed))
    raise ValueError(f'classifier must be "logistic" or "mlp", got {kind!r}')


def _fit_on_outputs(
    sets: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], loss: str, seed: int, classifier: str
) -> ShadowAttack:
    """Fit on (member outputs, member labels, non-member outputs, non-member labels) of one or more models."""
    rng = np.random.default_rng(seed)
    feats, target = [], []
    for out_in, y_in, out_out, y_out in sets:
        i, o = _balanced(len(out_in), len(out_out), rng)
        feats += [attack_features(out_in[i], y_in[i], loss), attack_features(out_out[o], y_out[o], loss)]
        target += [np.ones(len(i)), np.zeros(len(o))]
    model = _classifier(classifier, seed)
    model.fit(np.concatenate(feats), np.concatenate(target))
    return ShadowAttack(model, loss)


def fit_shadow_attack(
    shadows: Sequence[Shadow | tuple[Predict, tuple[Any, Any], tuple[Any, Any]]],
    *,
    loss: str = "cross_entropy",
    seed: int = 0,
    classifier: str = "logistic",
) -> ShadowAttack:
    """Train the attack classifier on models with known membership (Shokri et al., arXiv 1610.05820).

    Each shadow's members and non-members are subsampled to the same size (seeded), their features
    (``attack_features``) pooled, and a standardised logistic regression (or a small MLP) fitted. The spec's
    client attacker passes the *target* model with its known half as the only "shadow"; independently trained
    shadow models work the same way.
    """
    _check_loss(loss)
    if len(shadows) == 0:
        raise ValueError("fit_shadow_attack needs at least one (predict, members, nonmembers) triple")
    sets = []
    for k, item in enumerate(shadows):
        if len(item) != 3:
            raise ValueError(f"shadow {k} must be (predict, (x, y), (x, y)), got {len(item)} items")
        predict, (xm, ym), (xn, yn) = item
        out_in, y_in = _predict(predict, xm, ym, f"shadow {k} members")
        out_out, y_out = _predict(predict, xn, yn, f"shadow {k} nonmembers")
        if out_in.shape[1] != out_out.shape[1]:
            raise ValueError(f"shadow {k}: members and non-members give different numbers of outputs")
        sets.append((out_in, y_in, out_out, y_out))
    if len({s[0].shape[1] for s in sets}) != 1:
        raise ValueError("all shadow models must have the same number of outputs")
    return _fit_on_outputs(sets, loss, seed, classifier)


# ---------------------------------------------------------------------------------------------------------------
# Offline LiRA (Carlini et al.)


def lira_offline_scores(
    target_phi: Any, out_phis: Any, *, fixed_variance: bool = False, min_std: float = 1e-6
) -> np.ndarray:
    """Offline LiRA score per example: −log Pr[Z ≥ φ_target], Z ~ N(μ_out, σ_out²) (higher = more likely member).

    ``target_phi`` [N]: the target model's ``logit_confidence`` on each example; ``out_phis`` [K, N]: the same for
    K ≥ 2 reference models trained WITHOUT each example. μ_out, σ_out are each example's mean and standard deviation
    (ddof=1) over the K; with ``fixed_variance`` one pooled σ (root of the mean per-example variance) replaces them,
    which Carlini et al. (arXiv 2112.03570, §4.3) recommend for few reference models. The test is one-sided —
    membership raises the confidence — and this is their 1 − Pr[Z > φ] on a log scale, a monotone transform that
    does not saturate at 1 far in the tail. No model is trained here.
    """
    t = _scores(target_phi, "target_phi")
    o = _numpy(out_phis).astype(np.float64)
    if o.ndim != 2 or o.shape[1] != len(t):
        raise ValueError(f"out_phis must have shape [K, {len(t)}] (K reference models), got {o.shape}")
    if o.shape[0] < 2:
        raise ValueError(f"need at least 2 OUT reference models to estimate a variance, got {o.shape[0]}")
    if not np.isfinite(o).all():
        raise ValueError("out_phis contains NaN or infinite values")
    if min_std <= 0:
        raise ValueError(f"min_std must be positive, got {min_std}")
    mu = o.mean(axis=0)
    var = o.var(axis=0, ddof=1)
    std = np.full_like(mu, np.sqrt(var.mean())) if fixed_variance else np.sqrt(var)
    return -norm.logsf(t, loc=mu, scale=np.maximum(std, min_std))


# ---------------------------------------------------------------------------------------------------------------
# Metrics


def _balanced_accuracy(s_in: np.ndarray, s_out: np.ndarray, t: np.ndarray | float) -> np.ndarray:
    """(TPR + TNR) / 2 of the rule "member iff score > t", vectorised over thresholds t."""
    tpr = (len(s_in) - np.searchsorted(np.sort(s_in), t, side="right")) / len(s_in)
    tnr = np.searchsorted(np.sort(s_out), t, side="right") / len(s_out)
    return (tpr + tnr) / 2


def best_threshold(scores_members: Any, scores_nonmembers: Any) -> float:
    """The threshold t maximising balanced accuracy of "member iff score > t" on the given (calibration) scores.

    Candidates are −inf, the midpoints between consecutive distinct scores and +inf; ties go to the lowest.
    """
    s_in, s_out = _scores(scores_members, "scores_members"), _scores(scores_nonmembers, "scores_nonmembers")
    u = np.unique(np.concatenate([s_in, s_out]))
    cands = np.concatenate([[-np.inf], (u[:-1] + u[1:]) / 2, [np.inf]])
    return float(cands[int(np.argmax(_balanced_accuracy(s_in, s_out, cands)))])


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, max_fpr: float = MAX_FPR) -> float:
    """The largest TPR among ROC points with FPR <= max_fpr — no interpolation between points.

    A 1e-12 slack absorbs rounding in k/n == max_fpr (e.g. 2/200 vs 0.01).
    """
    ok = np.asarray(fpr) <= max_fpr + 1e-12
    return float(np.asarray(tpr)[ok].max()) if ok.any() else 0.0


def attack_metrics(
    scores_members: Any,
    scores_nonmembers: Any,
    *,
    calibration: tuple[Any, Any] | None = None,
    threshold: float | None = None,
) -> dict[str, Any]:
    """ASR, AUC, TPR at 1% FPR and the ROC of an attack on an evaluation set (higher score = member).

    ``asr`` is the balanced accuracy (= accuracy when the set is balanced, as the spec's is) of "member iff
    score > t" on the evaluation scores, with t never chosen on them:
    - ``threshold`` given: that t (``threshold_protocol="given"``);
    - ``calibration=(members, nonmembers)`` scores of a separate split: t = ``best_threshold`` on it
      (``"calibration"``; ``run_membership_attacks`` passes the attacker's known half);
    - neither: two-fold cross-fitting (``"cross_fit"``) — each side is split in two at random (seed 0), t is
      chosen on one fold and applied to the other, both ways, and the predictions pooled.
    ``auc`` is ``roc_auc_score`` and ``tpr_at_1fpr`` the largest TPR with FPR <= 1% on ``roc_curve`` (all points
    kept), both threshold-free; ``fpr``/``tpr`` are that curve, for ``plot_roc``.
    """
    s_in, s_out = _scores(scores_members, "scores_members"), _scores(scores_nonmembers, "scores_nonmembers")
    if calibration is not None and threshold is not None:
        raise ValueError("give a calibration split or a threshold, not both")
    if threshold is not None:
        protocol, t = "given", float(threshold)
        asr = float(_balanced_accuracy(s_in, s_out, t))
    elif calibration is not None:
        protocol, t = "calibration", best_threshold(*calibration)
        asr = float(_balanced_accuracy(s_in, s_out, t))
    else:
        protocol, t = "cross_fit", None
        if min(len(s_in), len(s_out)) < 2:
            raise ValueError("cross-fitting the threshold needs at least 2 scores per side; give a threshold")
        rng = np.random.default_rng(0)
        fin, fout = rng.permutation(len(s_in)) % 2, rng.permutation(len(s_out)) % 2
        hits_in = hits_out = 0
        for f in (0, 1):
            tf = best_threshold(s_in[fin == f], s_out[fout == f])
            hits_in += int((s_in[fin != f] > tf).sum())
            hits_out += int((s_out[fout != f] <= tf).sum())
        asr = (hits_in / len(s_in) + hits_out / len(s_out)) / 2
    truth = np.concatenate([np.ones(len(s_in)), np.zeros(len(s_out))])
    scores = np.concatenate([s_in, s_out])
    fpr, tpr, _ = roc_curve(truth, scores, drop_intermediate=False)
    return {
        "asr": asr,
        "auc": float(roc_auc_score(truth, scores)),
        "tpr_at_1fpr": tpr_at_fpr(fpr, tpr, MAX_FPR),
        "fpr": fpr,
        "tpr": tpr,
        "threshold": t,
        "threshold_protocol": protocol,
        "n_members": len(s_in),
        "n_nonmembers": len(s_out),
    }


# ---------------------------------------------------------------------------------------------------------------
# Plot


def plot_roc(curves: Mapping[str, tuple[Any, Any]], path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Log-log ROC curves with the chance diagonal, as a PNG (Carlini et al.: low-FPR behaviour matters).

    Built on ``matplotlib.figure.Figure`` (rendered by Agg), so pyplot's global state and backend stay untouched.
    Points with FPR or TPR = 0 cannot sit on log axes; the axes start at the smallest positive FPR (at most 1e-3,
    at least 1e-5).
    """
    from matplotlib.figure import Figure

    if not curves:
        raise ValueError("plot_roc needs at least one curve")
    pos = [float(np.min(f[f > 0])) for f in (np.asarray(c[0], dtype=float) for c in curves.values()) if (f > 0).any()]
    lo = float(np.clip(min(pos, default=1e-3), 1e-5, 1e-3))
    fig = Figure(figsize=(5, 5), dpi=100)
    ax = fig.add_subplot()
    for name, (fpr, tpr) in curves.items():
        fpr, tpr = np.asarray(fpr, dtype=float), np.asarray(tpr, dtype=float)
        if fpr.shape != tpr.shape or fpr.ndim != 1:
            raise ValueError(f"curve {name!r}: fpr and tpr must be 1-D arrays of one length")
        ax.plot(fpr, tpr, label=name)
    ax.plot([lo, 1], [lo, 1], linestyle="--", color="grey", label="chance")
    ax.set_xscale("log", nonpositive="mask")
    ax.set_yscale("log", nonpositive="mask")
    ax.set_xlim(lo, 1)
    ax.set_ylim(lo, 1)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(title or "membership inference ROC")
    ax.legend(loc="lower right")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


# ---------------------------------------------------------------------------------------------------------------
# End to end


def run_membership_attacks(
    predict: Predict,
    members: tuple[Any, Any],
    nonmembers: tuple[Any, Any],
    *,
    seed: int = 0,
    loss: str = "cross_entropy",
    shadows: Sequence[Shadow | tuple[Predict, tuple[Any, Any], tuple[Any, Any]]] | None = None,
    classifier: str = "logistic",
) -> dict[str, dict[str, Any]]:
    """Loss threshold, confidence threshold and shadow attack on ``predict``, per the module's protocol.

    ``members``/``nonmembers`` are ``(x, y)`` with at least ``MIN_PER_SIDE`` examples each; both are subsampled
    (seeded) to the smaller size n and split into a known half (⌊n/2⌋ per side: the attacker's knowledge, used to
    train the shadow classifier unless ``shadows`` is given and to choose every ASR threshold) and a held-out
    half (n − ⌊n/2⌋ per side: the evaluation). Returns ``{"loss" | "confidence" | "shadow": attack_metrics(...)}``.
    """
    _check_loss(loss)
    for what, pair in (("members", members), ("nonmembers", nonmembers)):
        if len(pair) != 2:
            raise ValueError(f"{what} must be a pair (x, y)")
    out_in, y_in = _predict(predict, *members, "members")
    out_out, y_out = _predict(predict, *nonmembers, "nonmembers")
    if out_in.shape[1] != out_out.shape[1]:
        raise ValueError("predict gives different numbers of outputs for members and non-members")
    n = min(len(y_in), len(y_out))
    if n < MIN_PER_SIDE:
        raise ValueError(f"need at least {MIN_PER_SIDE} members and {MIN_PER_SIDE} non-members, "
                         f"got {len(y_in)} and {len(y_out)}")
    rng = np.random.default_rng(seed)
    p_in, p_out = rng.permutation(len(y_in))[:n], rng.permutation(len(y_out))[:n]
    k = n // 2
    known_in, eval_in, known_out, eval_out = p_in[:k], p_in[k:], p_out[:k], p_out[k:]

    if shadows is None:
        attack = _fit_on_outputs([(out_in[known_in], y_in[known_in], out_out[known_out], y_out[known_out])],
                                 loss, seed, classifier)
    else:
        attack = fit_shadow_attack(shadows, loss=loss, seed=seed, classifier=classifier)

    score_fns: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
        "loss": lambda z, y: loss_scores(z, y, loss),
        "confidence": lambda z, y: confidence_scores(z, kind="max"),
        "shadow": attack.scores,
    }
    results = {}
    for name, fn in score_fns.items():
        s_in, s_out = fn(out_in, y_in), fn(out_out, y_out)
        results[name] = attack_metrics(s_in[eval_in], s_out[eval_out],
                                       calibration=(s_in[known_in], s_out[known_out]))
    return results
