"""The personalised baselines of FedCEO's comparison (spec fedceo.md §6): PPSGD (a personal additive part that
stays on the client) and CENTAUR (private heads on a shared representation)."""

from __future__ import annotations

from pydantic import Field, field_validator

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.bundle import fedavg_bundle
from dpfl.algorithms.catalog.context import AlgorithmError, RunFacts, mechanism_of, validated
from dpfl.algorithms.catalog.validation import MAX_LOCAL_EPOCHS, Params, at_most
from dpfl.algorithms.client.additive_personal import AdditivePersonal
from dpfl.algorithms.client.phased import PhasedProgram
from dpfl.algorithms.client.private_head import PrivateHead
from dpfl.algorithms.server.fedavg import FedAvg

__all__ = ["CentaurParams", "PPSGDParams", "centaur", "ppsgd"]

MECHANISMS = ("dpsgd", "udp")


class PPSGDParams(Params):
    """PPSGD (spec fedceo.md §6.2): θ_k = w + u_k; u_k stays on the client and moves alpha times as fast."""

    alpha: float = Field(1.0, gt=0)


class CentaurParams(Params):
    """CENTAUR (spec fedceo.md §6.3): private heads; each round fits the head for head_epochs with the
    representation frozen, then trains the representation (the only shared part) with the head frozen."""

    head_epochs: float = Field(1.0, gt=0)

    @field_validator("head_epochs")
    @classmethod
    def _epochs_limit(cls, v: float) -> float:
        return at_most(v, MAX_LOCAL_EPOCHS, "local epochs")


def ppsgd(run: RunFacts, *, alpha: float = 1.0) -> Algorithm:
    """PPSGD with DP-SGD clients (run.mechanism dpsgd) or clipped, noised uploads (udp); the personal part's
    learning rate is alpha x run.lr. Reads the local program's settings."""
    params = validated(PPSGDParams, "ppsgd", locals())
    mechanism = mechanism_of(run, "ppsgd", MECHANISMS)
    personal = AdditivePersonal(params.alpha)
    local = run.local_program(private=mechanism == "dpsgd", lr_factor=personal.lr_factor)
    return fedavg_bundle(run, "ppsgd", mechanism, local, FedAvg("uniform"), personal)


def centaur(run: RunFacts, *, head_epochs: float = 1.0) -> Algorithm:
    """CENTAUR: head_epochs on the head (run.head_module's parameters among run.param_names), then the configured
    length on the representation. Reads run.head_module, param_names, model_name and the local program's settings."""
    params = validated(CentaurParams, "centaur", locals())
    mechanism = mechanism_of(run, "centaur", MECHANISMS)
    names, head_module = run.param_names, run.head_module
    if head_module is None or not any(n.startswith(head_module + ".") for n in names):
        raise AlgorithmError(f"model: CENTAUR needs a model with a head (mlp2, lenet5), got {run.model_name!r}",
                             "model")
    head = tuple(n for n in names if n.startswith(head_module + "."))
    body = tuple(n for n in names if n not in head)
    if not body:
        raise AlgorithmError(f"model: CENTAUR needs a representation below the head; {run.model_name!r} is only a "
                             "head", "model")
    private = mechanism == "dpsgd"
    phases = (run.local_program(private=private, trainable=head, epochs=params.head_epochs),
              run.local_program(private=private, trainable=body))
    return fedavg_bundle(run, "centaur", mechanism, PhasedProgram(phases), FedAvg("uniform"), PrivateHead(head))
