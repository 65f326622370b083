"""MP-DP and its baselines (spec bidirectional.md): mpdp, mpdp_naive, mp_cdp, tp_smc and fedsgd, FedSGD rounds in
float64 on the run's network (an nn.Sequential MP-DP can perturb, trained with MSE on one-hot targets, `mse_onehot`),
every client every round.

    run = RunFacts(lr=0.5, clients=5, clip=1.0, rounds=30, model=net, input_shape=(64,), loss="mse_onehot")
    algorithm = dpfl.algorithms.mpdp(run, epsilon=3.0)

MP-DP's and MP-DP-Naive's per-round guarantee is NOMINAL, stated in privacy.json's `stage` block and never entered in
the ledger; MP-CDP's and TP-SMC's Gaussian rounds are composed by dpfl's RDP accountant there.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, model_validator
from torch import nn

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.context import AlgorithmError, RunFacts, validated
from dpfl.algorithms.catalog.validation import Params
from dpfl.algorithms.secure.mpdp.client_programs import PerturbedGradient, TrueGradient
from dpfl.algorithms.secure.mpdp.perturb import FactorPlan, UnsupportedModelError
from dpfl.algorithms.secure.mpdp.server_steps import GradientMeanServer, PerturbedModelServer, ThresholdPaillierServer
from dpfl.algorithms.secure.mpdp.settings import method_settings
from dpfl.algorithms.secure.mpdp.uploads import ClearGradients, EncryptedGradients, PerturbedUploadNoise
from dpfl.algorithms.secure.threshold_paillier import keygen
from dpfl.privacy.calibration import MIN_NOISE_MULTIPLIER
from dpfl.algorithms.selection import Selection
from dpfl.engine.local_training import LocalSpec
from dpfl.models.mpdp_networks import TiedResidual

__all__ = ["METHODS", "PARAMS", "MPDPParams", "fedsgd", "mp_cdp", "mpdp", "mpdp_naive", "tp_smc"]

METHODS = ("mpdp", "mpdp_naive", "mp_cdp", "tp_smc", "fedsgd")
LOSS = "mse_onehot"  # MP-DP's recovery is exact for the MSE on one-hot targets only


class MPDPParams(Params):
    """epsilon, delta: the per-round target (NOMINAL for mpdp / mpdp_naive: Theorems 10/11; graph complete or n_out
    with n; mode unverified stamps a run outside Theorem 11). sigma_delta_factor: σ_Δ as a multiple of its admissible
    minimum. adjacency: S = B (add_remove) or 2B (replace), B = privacy.clip. clip_mode: perturbed_joint (clip g, Ψ,
    Φ together at Ŵ), none, or oracle_true (simulation only). dropout: the share of clients that (simulated, seeded)
    leave each round after key agreement; dropout_policy abort (the round is discarded and run again with fresh
    secrets) or secagg_recovery (the survivors' key shares remove the dropped clients' Δ: "reduced protection").
    mask_corrections: pairwise zero-sum masks on Ψ_k, Φ_k (W2). noise_family gaussian_conditional: Gaussian η and Δ,
    audited per round (W1). reproducible_secrets: the server's factors from the run seed (a simulation). tpsmc_*:
    TP-SMC's Paillier key size, decryption threshold, assumed honest clients h, fixed-point bits and packing."""

    epsilon: float = Field(3.0, gt=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    graph: Literal["complete", "n_out"] = "complete"
    n: int | None = Field(None, ge=1)
    mode: Literal["verified", "unverified"] = "verified"
    sigma_delta_factor: float = Field(10.0, gt=1)
    adjacency: Literal["add_remove", "replace"] = "add_remove"
    clip_mode: Literal["perturbed_joint", "none", "oracle_true"] = "perturbed_joint"
    mask_scale: float = Field(1.0, gt=0)
    dropout_policy: Literal["abort", "secagg_recovery"] = "abort"
    dropout: float = Field(0.0, ge=0, lt=1)
    mask_corrections: bool = False
    noise_family: Literal["dn", "gaussian_conditional"] = "dn"
    reproducible_secrets: bool = True
    tpsmc_key_bits: int = Field(1024, ge=64, le=8192)
    tpsmc_threshold: int | None = Field(None, ge=1)
    tpsmc_honest: int | None = Field(None, ge=1)
    tpsmc_fraction_bits: int = Field(32, ge=1, le=64)
    tpsmc_packing: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> MPDPParams:
        if self.graph == "n_out" and self.n is None:
            raise ValueError("n is required by graph n_out")
        if self.graph == "complete" and self.n is not None:
            raise ValueError("n is only used by graph n_out (give null)")
        if self.tpsmc_key_bits % 2:
            raise ValueError("tpsmc_key_bits must be even (two primes of half the size)")
        if self.dropout and self.dropout_policy == "abort":  # every attempt would lose clients again
            raise ValueError("dropout: with dropout_policy abort every re-run of a round loses floor(dropout x "
                             "clients) clients again, so the run could never finish (0, or dropout_policy "
                             "secagg_recovery)")
        return self


PARAMS = tuple(MPDPParams.model_fields)


def _check_run(run: RunFacts, name: str, p: MPDPParams) -> FactorPlan:
    """The run's network as a FactorPlan, after checking the run facts the method needs."""
    K = run.clients
    if run.selection.kind != "all":
        raise AlgorithmError(f"training.selection: {name} runs FedSGD with every client every round (kind all)",
                             "training.selection")
    if run.local_steps != 1:
        raise AlgorithmError(f"training.local_steps: {name} takes one gradient per round (FedSGD); set local_steps 1",
                             "training.local_steps")
    if run.momentum or run.micro_batch is not None:
        raise AlgorithmError(f"training.optimizer: {name}'s FedSGD step is plain (no momentum, no micro_batch)",
                             "training.optimizer")
    if run.loss != LOSS:
        raise AlgorithmError(f"model: {name} trains with the MSE on one-hot targets ({LOSS}), the loss MP-DP's "
                             f"recovery is exact for; the model's loss is {run.loss!r}", "model")
    if p.graph == "n_out" and p.n is not None and p.n >= K:
        raise AlgorithmError(f"algorithm.params.n: must be below the number of clients ({K})", "algorithm.params.n")
    if p.dropout and int(p.dropout * K) == 0:
        raise AlgorithmError(f"algorithm.params.dropout: {p.dropout} drops no client of {K} per round (0, or at least "
                             f"{1 / K:.4g})", "algorithm.params.dropout")
    for field in ("tpsmc_threshold", "tpsmc_honest"):
        value = getattr(p, field)
        if value is not None and value > K:
            raise AlgorithmError(f"algorithm.params.{field}: cannot exceed the number of clients ({K})",
                                 f"algorithm.params.{field}")
    if run.clip is None and name != "fedsgd":
        raise AlgorithmError(f"privacy.clip: {name} clips each client's gradient to B = privacy.clip", "privacy.clip")
    if not isinstance(run.model, nn.Module) or run.input_shape is None:
        raise AlgorithmError(f"model: {name} perturbs the run's network: build it with the model and its input shape",
                             "model")
    residual = any(isinstance(m, TiedResidual) for m in run.model.modules())  # the model is the opt-in (§7.4)
    try:
        return FactorPlan.from_module(run.model, tuple(run.input_shape), allow_residual=residual)
    except UnsupportedModelError as err:
        raise AlgorithmError(f"model: {err}", "model") from None


def _build(run: RunFacts, name: str, arguments: dict[str, Any]) -> Algorithm:
    p = validated(MPDPParams, name, arguments)
    plan = _check_run(run, name, p)
    method = {"fedsgd": "fedavg"}.get(name, name)  # the spec's name of the reference run
    clip = run.clip if run.clip is not None else 1.0  # FedSGD clips nothing: its B is never read
    st, info = method_settings(method, p, clients=run.clients, lr=run.lr, clip=clip, rounds=run.rounds,
                               run_id=f"dpfl/mpdp/{run.run_name}/{run.seed}".encode())
    multiplier = st.sigma_eta or st.sigma_naive or st.sigma_cdp  # the method's noise, in units of the sensitivity
    if name != "fedsgd" and multiplier <= MIN_NOISE_MULTIPLIER * (1 + 1e-6):  # the budgets' limit (config/limits)
        raise AlgorithmError(f"algorithm.params.epsilon: a per-round epsilon of {p.epsilon:g} (delta {p.delta:g}) is "
                             f"met only by a noise multiplier below {MIN_NOISE_MULTIPLIER:g}; such a target gives no "
                             "meaningful protection, lower it", "algorithm.params.epsilon")
    spec = LocalSpec(lr=run.lr, loss=LOSS)
    common = dict(settings=st, info=info, epsilon=p.epsilon, clients=run.clients)
    if name in ("mpdp", "mpdp_naive"):
        local: Any = PerturbedGradient(spec, steps=1, network=plan, settings=st)
        upload: Any = PerturbedUploadNoise(settings=st, plan=plan, dropout=p.dropout)
        server: Any = PerturbedModelServer(**common, plan=plan, reproducible_secrets=p.reproducible_secrets)
    elif name == "tp_smc":  # a dealer's threshold keys, once per run; the shares go to the clients
        keys = keygen(p.tpsmc_key_bits, run.clients, info["threshold"])
        local = TrueGradient(spec, steps=1, network=plan, settings=st)
        upload = EncryptedGradients(settings=st, keys=keys, fraction_bits=p.tpsmc_fraction_bits,
                                    honest=info["honest"], packing=p.tpsmc_packing)
        server = ThresholdPaillierServer(**common, keys=keys)
    else:
        local = TrueGradient(spec, steps=1, network=plan, settings=st)
        upload = ClearGradients(private=name == "mp_cdp")
        server = GradientMeanServer(**common, seed=run.seed)
    return Algorithm(name, local, Selection("all"), upload, server)


def mpdp(run: RunFacts, *, epsilon: float = 3.0, delta: float = 1e-5, graph: str = "complete", n: int | None = None,
         mode: str = "verified", sigma_delta_factor: float = 10.0, adjacency: str = "add_remove",
         clip_mode: str = "perturbed_joint", mask_scale: float = 1.0, dropout_policy: str = "abort",
         dropout: float = 0.0, mask_corrections: bool = False, noise_family: str = "dn",
         reproducible_secrets: bool = True, tpsmc_key_bits: int = 1024, tpsmc_threshold: int | None = None,
         tpsmc_honest: int | None = None, tpsmc_fraction_bits: int = 32, tpsmc_packing: bool = True) -> Algorithm:
    """MP-DP (bidirectional privacy): the clients see only perturbed models; their uploads carry DDP noise whose
    pairwise parts cancel in the sum. The params (`MPDPParams`) are the family's: each method reads its own, so one
    config runs every method. Reads run.lr, clip, clients, rounds, local_steps (1), seed, run_name, model,
    input_shape, loss (mse_onehot) and selection (all)."""
    return _build(run, "mpdp", {k: v for k, v in locals().items() if k != "run"})


def _family(name: str, doc: str) -> Callable[..., Algorithm]:
    """A factory of the family with `mpdp`'s signature (one params schema for the family)."""
    def factory(run: RunFacts, **params: Any) -> Algorithm:
        return _build(run, name, params)

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = doc
    factory.__signature__ = inspect.signature(mpdp)  # type: ignore[attr-defined]
    return factory


mpdp_naive = _family("mpdp_naive", """MP-DP-Naive: MP-DP's perturbed model, each upload with one Gaussian calibrated as
    (ε, δ)-LDP, no pairwise noise. Params and run facts: as `mpdp`.""")
mp_cdp = _family("mp_cdp", """MP-CDP: a trusted server averages the clipped true gradients and adds N(0, (S σ / K)^2), σ
    calibrated to the per-round (epsilon, delta). Params (epsilon, delta, adjacency) and run facts: as `mpdp`.""")
tp_smc = _family("tp_smc", """TP-SMC (Truex et al. 2019): clipped gradients plus a share of MP-CDP's Gaussian, encrypted
    under threshold Paillier; only the sum is decrypted. For tiny models. Params (epsilon, delta, adjacency,
    tpsmc_*) and run facts: as `mpdp`.""")
fedsgd = _family("fedsgd", """FedSGD without privacy, in float64 with the MSE on one-hot targets: the reference MP-DP is
    compared with (the spec's `fedavg`). Run facts: as `mpdp`.""")
