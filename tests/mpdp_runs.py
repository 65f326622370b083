"""MP-DP runs for tests: a run config from the spec's flat settings (the old MP-DP schema's field names, converted as
`dpfl run` converts an old config), the run of the one loop it builds, and the records the round-level tests use.

    cfg = mpdp_config("mpdp", clients=5, rounds=3, hidden=[16, 12])
    result = mpdp_result(cfg, drop=lambda r, attempt: {2} if (r, attempt) == (1, 0) else set())
    result.privacy.to_dict()["stage"]          # the method's privacy statement (nominal for mpdp)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from dpfl.algorithms.secure.mpdp.perturb import FactorPlan
from dpfl.evaluate.mpdp_attacks import FederatedArrays, comparison_arrays
from dpfl.experiment.build import build_data, build_run
from dpfl.experiment.config import RunConfig, validate_config
from dpfl.experiment.config.legacy_mpdp import convert_legacy_mpdp
from dpfl.experiment.federated_run import FederatedRun, RunResult
from dpfl.models import build_model


def mpdp_config(method: str = "mpdp", **flat: Any) -> RunConfig:
    """The run config of `method` (mpdp, mpdp_naive, mp_cdp, tp_smc, or fedavg: FedSGD) with the flat settings
    `flat` (name defaults to "t"; every other field to the old schema's default)."""
    return validate_config(convert_legacy_mpdp({"scheme": "mpdp", "name": "t", **flat, "method": method}))


def mpdp_run(cfg: RunConfig, *, drop: Callable[[int, int], set[int]] | None = None,
             on_broadcast: Callable[..., Any] | None = None) -> FederatedRun:
    """The run `cfg` builds; `drop(round, attempt)`: the clients that leave after key agreement; `on_broadcast(payload,
    true weights)`: sees what the clients receive each round (mpdp, mpdp_naive)."""
    run = build_run(cfg)
    if drop is not None:
        run.algorithm = replace(run.algorithm, upload=replace(run.algorithm.upload, drop=drop))
    if on_broadcast is not None:
        run.algorithm = replace(run.algorithm, aggregator=replace(run.algorithm.aggregator, on_broadcast=on_broadcast))
    return run


def mpdp_result(cfg: RunConfig, **hooks: Any) -> RunResult:
    return mpdp_run(cfg, **hooks).run()


def stage(result: RunResult) -> dict[str, Any]:
    """The method's privacy statement (privacy.json's `stage` block)."""
    return result.privacy.to_dict()["stage"]


def records(clients: int = 5, *, flatten: bool = True, **flat: Any) -> FederatedArrays:
    """The clients' shards (float64 records, one-hot labels) and the test set of an MP-DP config's split; `flatten`:
    each record as one vector (for a FactorPlan of an MLP without a Flatten)."""
    arrays = comparison_arrays(build_data(mpdp_config(clients=clients, **flat)).with_feature_dtype(torch.float64))
    if not flatten:
        return arrays
    return FederatedArrays([(x.reshape(len(x), -1), y) for x, y in arrays.shards],
                           arrays.x_test.reshape(len(arrays.x_test), -1), arrays.y_test, arrays.n_classes,
                           arrays.image_shape)


def mlp_weights(plan: FactorPlan, seed: int = 0) -> list[torch.Tensor]:
    """MP-DP's initial weights of the MLP `FactorPlan((inputs, *hidden, classes), bias)`: the registered mpdp_mlp's
    at `seed` (what a run of that network starts from), in the plan's order."""
    sizes = plan.sizes
    net = build_model("mpdp_mlp", (sizes[0],), sizes[-1], seed=seed, hidden=list(sizes[1:-1]), bias=plan.bias)
    weights = [p.detach().clone() for p in net.parameters()]
    assert [tuple(w.shape) for w in weights] == [tuple(s) for s in plan.shapes()], "not the plan's network"
    return weights
