"""What a curious client learns from an MP-DP comparison run (spec bidirectional.md §10), measured at its end.

Two attacks, both by a client on the last model it received: adaptive demasking (W3: client 0 removes the model
hiding with its own labels, `attacks.demask`) and membership inference (`attacks.membership`: loss, confidence and
shadow attacks). The MIA target is what the spec names: for mpdp* the perturbed model Ŵ as received ("plain") and
client 0's demasked network ("adaptive"); for fedavg and mp_cdp the plaintext global model after the last round.
Members are the clients' training records and non-members the test set (never trained on); the attacker knows half
of each (balanced) and is scored on the other half.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpfl.algorithms.secure.mpdp.perturb import FactorPlan, forward
from dpfl.algorithms.secure.mpdp.views import ClientView
from dpfl.attacks.demask import Demasked, demask
from dpfl.attacks.membership import NonFiniteOutputsError, run_membership_attacks
from dpfl.seeding import Purpose, numpy_generator

__all__ = ["KEPT_METRICS", "FederatedArrays", "client_attacks", "comparison_arrays", "demasking_report",
           "measure_client_attacks", "membership_report"]

KEPT_METRICS = ("asr", "auc", "tpr_at_1fpr", "threshold_protocol", "n_members", "n_nonmembers")


@dataclass
class FederatedArrays:
    """A run's records as the attacks read them (`comparison_arrays`): each client's (x [n, ...] float64, one-hot
    y), the test set with its labels, the number of classes and one record's shape."""

    shards: list[tuple[torch.Tensor, torch.Tensor]]
    x_test: torch.Tensor
    y_test: torch.Tensor
    n_classes: int
    image_shape: tuple[int, ...] = ()


def _accuracy(outputs: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Test accuracy, or None for non-finite outputs (a diverged model: its argmax would be an arbitrary class)."""
    if not bool(torch.isfinite(outputs).all()):
        return None
    return float((outputs.argmax(1) == labels).double().mean())


def demasking_report(view: ClientView, attack: Demasked, arrays: FederatedArrays) -> dict[str, Any]:
    """W3 measured: test accuracies of the perturbed outputs as received and of client 0's demasked network (None,
    with a note, where a network's outputs are not finite)."""
    y_hat, _ = view.outputs(arrays.x_test)
    report = {"attack": "adaptive demasking by client 0 (folded transitional layers, least-squares mask from its "
                        "one-hot labels) of the last model it received",
              "perturbed_accuracy": _accuracy(y_hat, arrays.y_test),
              "demasked_accuracy": _accuracy(attack.predict(arrays.x_test, view), arrays.y_test)}
    if report["perturbed_accuracy"] is None or report["demasked_accuracy"] is None:
        report["note"] = "None: that network's outputs are NaN or infinite (the model diverged)"
    return report


def _members(arrays: FederatedArrays, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The clients' training records with integer labels, subsampled (seeded) to the test set's size: the attack
    balances both sides to the smaller one anyway, and this keeps its forward passes to twice the test set."""
    x = torch.cat([s[0] for s in arrays.shards])
    y = torch.cat([s[1] for s in arrays.shards]).argmax(1)
    keep = numpy_generator(seed, Purpose.ATTACK).permutation(len(x))[:len(arrays.y_test)]
    idx = torch.as_tensor(np.sort(keep))
    return x[idx], y[idx]


def membership_report(predict: Callable[[torch.Tensor], torch.Tensor], arrays: FederatedArrays,
                      seed: int) -> dict[str, Any]:
    """The loss, confidence and shadow attacks on `predict` (MSE-on-one-hot scores), and the strongest by AUC. A
    model whose outputs are not finite (a diverged run, or a demasking that overflowed) is recorded as not attacked,
    with the reason, so the run and its other results are kept."""
    try:
        results = run_membership_attacks(predict, _members(arrays, seed), (arrays.x_test, arrays.y_test), seed=seed,
                                         loss="mse_onehot")
    except NonFiniteOutputsError as e:
        return {"skipped": e.skipped, "asr": None, "auc": None}
    attacks = {name: {k: r[k] for k in KEPT_METRICS} for name, r in results.items()}
    best = max(attacks, key=lambda name: attacks[name]["auc"])
    return {"attacks": attacks, "strongest": best, "asr": attacks[best]["asr"], "auc": attacks[best]["auc"]}


def client_attacks(arrays: FederatedArrays, seed: int, *, view: ClientView | None = None,
                   weights: list[torch.Tensor] | None = None, plan: FactorPlan | None = None) -> dict[str, Any]:
    """The privacy.json blocks of the client attacks: with an MP-DP `view`, model_hiding and membership (plain and
    adaptive); otherwise membership on the plaintext `weights`."""
    if view is None:
        if weights is None:
            raise ValueError("client_attacks needs the perturbed view (mpdp*) or the plaintext weights")
        plain = membership_report(lambda x: forward(weights, None, x, plan)[0], arrays, seed)
        return {"membership": {"target": "the plaintext global model after the last round", "plain": plain}}
    attack = demask(view, *arrays.shards[0])
    return {"model_hiding": demasking_report(view, attack, arrays),
            "membership": {"target": "the last perturbed model a client received (plain: its outputs as received; "
                                     "adaptive: client 0's demasked network)",
                           "plain": membership_report(lambda x: view.outputs(x)[0], arrays, seed),
                           "adaptive": membership_report(lambda x: attack.predict(x, view), arrays, seed)}}


def comparison_arrays(data: Any) -> FederatedArrays:
    """A run's FederatedDataset as the attacks read it: each client's records with one-hot labels, the test set."""
    shards = [(c.x_train, torch.nn.functional.one_hot(c.y_train.long(), data.n_classes).to(torch.float64))
              for c in data.clients]
    return FederatedArrays(shards, data.x_test, data.y_test.long(), data.n_classes, tuple(data.input_shape))


def measure_client_attacks(run: Any, result: Any) -> dict[str, Any]:
    """`client_attacks` on a finished run of MP-DP's family (`dpfl.experiment.run_directory.execute`'s `measure`):
    on the last perturbed model the clients received (the server step's state) for mpdp*, else on the final global
    model."""
    from dpfl.algorithms.secure.mpdp.server_steps import client_view

    plan = run.algorithm.local.network
    view = client_view(result.states.server, plan) if run.algorithm.aggregator.encodes_broadcast else None
    arrays = comparison_arrays(run.data)
    if view is not None:
        return client_attacks(arrays, run.seed, view=ClientView(view))
    return client_attacks(arrays, run.seed, weights=list(result.params.values()), plan=plan)
