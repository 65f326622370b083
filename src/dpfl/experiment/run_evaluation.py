"""How a run's models are scored in its metrics rows: the global model on the test set, the clients' validation
union and each client's own held-out split, and the personal models (a cluster's, PPSGD's w + u_k, FedCEO's) on
their clients' splits.

Evaluation releases nothing to the server's training and touches no randomness of the run: these read the data and
the models only. Apart from the round loop so that what a row's accuracies mean is stated in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from dpfl.algorithms.algorithm import Algorithm
from dpfl.data.federated import PooledClients
from dpfl.engine import params as P
from dpfl.engine.evaluation import evaluate
from dpfl.privacy.ledger import PrivacyLedger

# Above PER_CLIENT_LIMIT clients privacy.json lists each class of alike clients, not each client; above
# PER_CLIENT_ROW_LIMIT a metrics row gives each distinct epsilon with its count of clients, not each client's (a row
# is written every round and kept in the history: a list per round would grow with population x rounds). At or below
# them, per-client lists as always (docs/scale.md).
PER_CLIENT_LIMIT = 100_000
PER_CLIENT_ROW_LIMIT = 10_000


def epsilon_columns(ledger: PrivacyLedger) -> dict[str, Any]:
    """A metrics row's epsilons: `epsilon`, every client's spent epsilon (clients 0..n-1), and `epsilon_max`; above
    PER_CLIENT_ROW_LIMIT clients `epsilon_classes`, [[epsilon, clients], ...] by increasing epsilon, instead of
    `epsilon` (the same values, counted from the ledger's history classes: no per-client list each round)."""
    if len(ledger.client_ids_array) <= PER_CLIENT_ROW_LIMIT:
        eps = ledger.spent_array().tolist()
        return {"epsilon": eps, "epsilon_max": max(eps)}
    values, counts = ledger.spent_counts()
    return {"epsilon_classes": [[v, c] for v, c in zip(values.tolist(), counts.tolist(), strict=True)],
            "epsilon_max": float(values[-1])}


def global_model_metrics(model: nn.Module, data: Any, val_data: tuple[torch.Tensor, torch.Tensor] | None,
                         w: P.Params, loss: str) -> dict[str, Any]:
    """The global model `w` on the test set, on the clients' validation union and on each client's held-out split;
    `model` is in eval mode meanwhile and back in train mode after."""
    model.eval()
    row: dict[str, Any] = {}
    acc, test_loss = evaluate(model, w, data.x_test, data.y_test, loss)
    row["test_accuracy"], row["test_loss"] = acc, test_loss
    row.update(validation_accuracy(model, val_data, w, loss))
    row.update(client_accuracy(model, data.clients, w, loss))
    model.train()
    return row


def validation_accuracy(model: nn.Module, val_data: tuple[torch.Tensor, torch.Tensor] | None, w: P.Params,
                        loss: str) -> dict[str, Any]:
    """The global model on the union of the clients' validation splits: what tuning selects on, never the test
    set."""
    if val_data is None:
        return {}
    acc, val_loss = evaluate(model, w, *val_data, loss)
    return {"val_accuracy": acc, "val_loss": val_loss}


def accuracy_on_client(model: nn.Module, clients: Sequence[Any], params: P.Params, client: int,
                       loss: str) -> float | None:
    """Accuracy of `params` on a client's own held-out split (None if it has none); model in eval mode."""
    c = clients[client]
    if getattr(c, "x_test", None) is None or len(c.x_test) == 0:
        return None
    return evaluate(model, params, c.x_test, c.y_test, loss)[0]


def client_accuracy(model: nn.Module, clients: Sequence[Any], w: P.Params, loss: str) -> dict[str, Any]:
    """The global model's accuracy on each client's held-out split (the RHDP protocol), if clients have one."""
    if isinstance(clients, PooledClients) and (not len(clients) or (clients.sizes("test") == 0).any()):
        return {}  # some client has no held-out split: nothing to report (and no Python per client to find it)
    accs = [accuracy_on_client(model, clients, w, c, loss) for c in range(len(clients))]
    if not accs or any(a is None for a in accs):
        return {}
    return {"test_acc_clients": accs, "test_acc_clients_mean": float(np.mean(accs))}


def personal_models(algorithm: Algorithm, w: P.Params, server_state: Any) -> dict[int, P.Params]:
    """client -> the personal model it uses given the global model `w`, for the clients that hold one now: those of
    the client-side stage (PPSGD's w + u_k) or of the server step's state (FedCEO's, its cluster's); {} for methods
    without personal models."""
    if algorithm.personal is not None:
        return algorithm.personal.personal_models(w)
    return algorithm.aggregator.personal_models(server_state, w)


def personal_accuracy(model: nn.Module, data: Any, personal: dict[int, P.Params], loss: str) -> dict[str, Any]:
    """acc_personal: mean over clients holding a personal model (`personal`, client -> its model) of its accuracy on
    their own test split; with planted clusters, the minority cluster's mean too."""
    if not personal:
        return {}
    model.eval()
    accs = [accuracy_on_client(model, data.clients, p, c, loss) for c, p in sorted(personal.items())]
    model.train()
    if any(a is None for a in accs):
        return {}
    out = {"acc_personal": float(np.mean(accs)), "acc_personal_clients": len(accs)}
    info = getattr(data, "info", None) or {}
    truth, minority = info.get("true_cluster"), info.get("minority_cluster")
    if truth is not None and minority is not None:  # planted clusters (clustered_split): the parity metric
        mine = [a for c, a in zip(sorted(personal), accs, strict=True) if truth[c] == minority]
        if mine:
            out["acc_personal_minority"] = float(np.mean(mine))
    return out
