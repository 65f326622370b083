"""The config's words: algorithm and mechanism names, and what each mechanism protects from whom.

`ALGORITHMS` lists dpfl's own algorithms (the registry, `dpfl.algorithms.registry`, holds each one's params model
and the mechanisms it runs with, the first being the default: `config.algorithm.ALGORITHM_MECHANISMS`);
`MECHANISM_UNIT` / `MECHANISM_OBSERVER` give the unit protected and the observer the guarantee holds
against (the runner's Algorithm.unit / .observer, in config words). `RunConfig` resolves the declared
threat model with these tables.
"""

from __future__ import annotations

from typing import Literal

from dpfl.algorithms.registry import MECHANISMS  # what an algorithm registers it runs with

ALGORITHMS: tuple[str, ...] = (
    "fedavg", "dp_fedavg_local", "dp_fedavg_central", "udp_fedavg", "noisy_fedavg", "noisy_fedprox", "fedprox",
    "weiavg", "min_eps", "max_eps", "oracle", "pfa", "pfa_plus", "robust_hdp", "fedceo", "ppsgd", "centaur",
    "fedsplit", "fedpi", "fedrp", "rdpcfl", "ifca_dp", "clustered_oracle", "clustered_local", "mr_mtl",
    "mpdp", "mpdp_naive", "mp_cdp", "tp_smc", "fedsgd",
)
# Algorithms whose server needs only the (weighted) sum of the uploads: they can run with secure aggregation.
SECURE_ALGORITHMS: tuple[str, ...] = ("fedavg", "fedprox", "dp_fedavg_local", "udp_fedavg", "dp_fedavg_central",
                                      "noisy_fedavg", "noisy_fedprox")

# What each mechanism protects, and from whom (the runner's Algorithm.unit / .observer, in config words).
MECHANISM_UNIT: dict[str, str] = {
    "dpsgd": "sample", "udp": "client", "central": "client", "param_noise": "sample", "mpdp": "sample",
    "mpdp_central": "sample", "none": "none",
}
MECHANISM_OBSERVER: dict[str, str] = {
    "dpsgd": "server", "udp": "server", "central": "aggregate", "param_noise": "server", "mpdp": "server",
    "mpdp_central": "aggregate", "none": "none",
}
_OBSERVER_WHY = {
    "server": "the server sees every individual upload",
    "aggregate": "only the aggregate (global models) is protected; the server is trusted",
    "none": "the run is not private",
}
_NEEDS_CLIP = ("dpsgd", "udp", "central", "param_noise", "mpdp", "mpdp_central")
_ADAPTIVE = ("central", "dpsgd")  # the mechanisms whose clip privacy.adaptive_clipping adapts
_STATED = ("mpdp", "mpdp_central")  # the method states its per-round guarantee (algorithm.params epsilon, delta)
_NOISY = ("noisy_fedavg", "noisy_fedprox")  # Noisy-FedAvg/FedProx: f-DP accounted (spec fdp_accounting.md)
_FDP_FIELDS = ("secure_aggregation", "release", "smoothness_L", "honest_clients")
_NEEDS_BUDGETS = ("dpsgd", "udp", "central")
_CALIBRATED = ("dpsgd", "central", "udp", "param_noise")  # mechanisms whose noise can be calibrated from budgets
_OWN_LOCAL = ("noisy_fedavg", "noisy_fedprox", "ppsgd", "centaur", "mpdp", "mpdp_naive", "mp_cdp", "tp_smc",
              "fedsgd")  # bundles that build their own local program

AlgorithmName = Literal[ALGORITHMS]  # type: ignore[valid-type]
Mechanism = Literal[MECHANISMS]  # type: ignore[valid-type]
