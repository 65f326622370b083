"""A tiny seeded federation for round-semantics tests: linear labels, each client with its own test split."""

from __future__ import annotations

from types import SimpleNamespace

import torch


def tiny_federation(n_clients: int = 3, n: int = 30, features: int = 6, client_test: int = 8, test: int = 50,
                    seed: int = 0) -> SimpleNamespace:
    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(features, 3, generator=g)
    clients = []
    for _ in range(n_clients):
        x, xt = torch.randn(n, features, generator=g), torch.randn(client_test, features, generator=g)
        clients.append(SimpleNamespace(x_train=x, y_train=(x @ w_true).argmax(1), x_test=xt,
                                       y_test=(xt @ w_true).argmax(1)))
    xt = torch.randn(test, features, generator=g)
    return SimpleNamespace(clients=clients, x_test=xt, y_test=(xt @ w_true).argmax(1))
