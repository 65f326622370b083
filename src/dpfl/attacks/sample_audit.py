"""DRAFT"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from dpfl.attacks.one_run import lower_bound
from dpfl.data.federated import ClientData, FederatedDataset
from dpfl.data.registry import PROVIDED
from dpfl.engine.losses import per_sample_loss
from dpfl.experiment.build import build_data, build_run
from dpfl.experiment.config import RunConfig, config_to_dict
from dpfl.experiment.config.loading import validate_config
from dpfl.seeding import Purpose, numpy_generator


@dataclass
class CanaryRecords:
    x: torch.Tensor
    y: torch.Tensor
    included: np.ndarray
    owner: np.ndarray  # client of each canary
    filler: bool  # replace-one: an excluded canary's slot holds a filler record


def make_canaries(data: FederatedDataset, m: int, seed: int, design: str = "uniform", pixels: int = 4,
                  value: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    rng = numpy_generator(seed, Purpose.AUDIT, 0, 3)
    x0 = data.clients[0].x_train
    lo = float(min(float(c.x_train.min()) for c in data.clients))
    hi = float(max(float(c.x_train.max()) for c in data.clients))
    shape = tuple(data.input_shape)
    d = int(np.prod(shape))
    labels = torch.from_numpy(rng.integers(0, data.n_classes, m)).to(data.clients[0].y_train.dtype)
    if design == "uniform":
        x = torch.from_numpy(rng.uniform(lo, hi, (m, d))).to(x0.dtype)
    elif design == "pixels":
        pool = torch.cat([c.x_train for c in data.clients]).reshape(-1, d)
        x = pool[torch.from_numpy(rng.integers(0, len(pool), m))].clone()
        v = hi if value is None else value
        for i in range(m):
            x[i, torch.from_numpy(rng.choice(d, pixels, replace=False))] = v
    elif design == "signs":
        mid, half = (lo + hi) / 2, (hi - lo) / 2 if value is None else value
        x = torch.from_numpy(mid + half * rng.choice([-1.0, 1.0], (m, d))).to(x0.dtype)
    else:
        raise ValueError(design)
    return x.reshape(m, *shape), labels


def canary_losses(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                  loss: str) -> np.ndarray:
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = functional_call(model, dict(params), (x,))
            return per_sample_loss(loss)(out, y).double().numpy()
    finally:
        model.train(was)


def _insert(data: FederatedDataset, c: CanaryRecords, seed: int) -> FederatedDataset:
    n = data.n_clients
    rng = numpy_generator(seed, Purpose.AUDIT, 0, 4)
    clients = []
    for k, cd in enumerate(data.clients):
        mine = np.flatnonzero(c.owner == k)
        xs, ys = [cd.x_train], [cd.y_train]
        for i in mine:
            if c.included[i]:
                xs.append(c.x[i : i + 1]); ys.append(c.y[i : i + 1])
            elif c.filler:
                j = int(rng.integers(0, cd.n_train))
                xs.append(cd.x_train[j : j + 1]); ys.append(cd.y_train[j : j + 1])
        clients.append(ClientData(torch.cat(xs), torch.cat(ys), cd.x_test, cd.y_test, cd.x_val, cd.y_val))
    return FederatedDataset(clients, data.x_test, data.y_test, data.n_classes, tuple(data.input_shape),
                            {**data.info, "audit_canaries": int(len(c.included))})


def _experiment(cfg: RunConfig, canaries: int = 200, design: str = "uniform", **kw: Any) -> dict[str, Any]:
    data = build_data(cfg)
    n = data.n_clients
    included = numpy_generator(cfg.seed, Purpose.AUDIT, 0, 2).random(canaries) < 0.5
    x, y = make_canaries(data, canaries, cfg.seed, design, **kw)
    filler = cfg.privacy.mechanism == "param_noise" or cfg.privacy.sampling == "fixed"
    c = CanaryRecords(x, y, included, np.arange(canaries) % n, filler)
    aug = _insert(data, c, cfg.seed)
    raw = config_to_dict(cfg)
    raw["data"] = {"dataset": PROVIDED, "clients": n}
    run = build_run(validate_config(raw), data=aug)
    loss = run.algorithm.local.spec.loss
    start = run.initial_state().params
    l0 = canary_losses(run.model, start, x, y, loss)
    result = run.run()
    l1 = canary_losses(run.model, result.params, x, y, loss)
    return dict(l0=l0, l1=l1, included=included, result=result, run=run, owner=c.owner)
