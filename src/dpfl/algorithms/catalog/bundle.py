"""The FedAvg-shaped bundle most algorithms share: the run's local program, the upload its mechanism needs (the full
update, or a clipped and noised one under `udp`), the algorithm's aggregator unless the user's replaces it, and the
secure-aggregation protocol around it when the run has one."""

from __future__ import annotations

from typing import Any

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.client.program import LocalProgram
from dpfl.algorithms.catalog.context import AlgorithmError, RunFacts
from dpfl.algorithms.secure.aggregator import SecureFedAvg

__all__ = ["fedavg_bundle"]


def fedavg_bundle(run: RunFacts, name: str, mechanism: str, local: LocalProgram, aggregator: Any,
                  personal: Any = None) -> Algorithm:
    """`Algorithm(name, local, run.selection, upload, aggregator, personal)` with the upload of `mechanism`."""
    selection = run.selection
    if mechanism == "udp":
        # FedCEO Algorithm 1: the noise is split over the expected cohort (the sum carries σC)
        cohort = max(1.0, selection.expected_count(run.clients))
        scale = run.lr if run.paper_eta_scaling else 1.0
        if run.per_upload_amplification and selection.kind != "poisson":
            raise AlgorithmError("privacy.per_upload_amplification: needs Poisson client selection "
                                 f"(training.selection.kind: poisson), got {selection.kind!r}",
                                 "privacy.per_upload_amplification")
        if run.secure is not None:  # distributed noise: split over the protocol's threshold t
            planned = run.planned_cohort
            if planned is None:
                raise AlgorithmError("training.selection: secure aggregation needs a fixed cohort",
                                     "training.selection")
            cohort = run.secure.threshold_for(planned)
        if run.clip is None:
            raise AlgorithmError("privacy.clip: a clipped, noised upload needs a clip norm", "privacy.clip")
        upload: Any = ClippedNoisyUpdate(run.clip, run.noise_multiplier, cohort, upload_scale=scale,
                                         hidden_sampling=run.per_upload_amplification,
                                         secure_sum=run.secure is not None)
    elif run.paper_eta_scaling or run.per_upload_amplification:
        option = "paper_eta_scaling" if run.paper_eta_scaling else "per_upload_amplification"
        raise AlgorithmError(f"privacy.{option}: applies to mechanism udp only", f"privacy.{option}")
    else:
        upload = FullUpdate()
    if run.aggregator is not None:  # the config allows it only where aggregation is post-processing
        aggregator = run.aggregator
    if run.secure is not None:  # the config allows it only with plain FedAvg aggregation
        aggregator = SecureFedAvg(run.secure, aggregator.weighting, aggregator.server_lr)
    return Algorithm(name, local, selection, upload, aggregator, personal)
