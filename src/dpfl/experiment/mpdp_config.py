"""The config of an MP-DP comparison run (configs/mpdp/*.yaml; spec bidirectional.md §11).

MP-DP has its own FedSGD round (the server perturbs the model, clients return gradients at it), so its runs are
not `RunConfig`s: this model holds exactly what they need, validated field by field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from dpfl.experiment.config.base import _Section
from dpfl.experiment.config.errors import _config_error, _fail
from dpfl.experiment.config.loading import read_config_mapping


class MPDPConfig(_Section):
    """dataset: digits, fashion_mnist, cifar10 or cifar100 (in [0, 1]; file-backed sets are read from local files
    only, never downloaded). model: mlp (ReLU MLP with `hidden` widths, on flattened inputs), cnn
    (conv(8)-maxpool-conv(16)-linear, spec §11's ci_digits_cnn) or resnet (a norm-free ResNet of tied residual blocks,
    `widths` per stage and `blocks` per stage: EXPERIMENTAL, spec §7.4); bias: with biases (spec §7.3).
    clients N, all taking part every round (rho = 1, IID equal shards); FedSGD: one gradient per client per round
    on a batch drawn without replacement from its shard. epsilon: the per-round NOMINAL target of Theorems 10/11
    (graph complete or n_out with n; mode unverified stamps a run outside Theorem 11). sigma_delta_factor: σ_Δ as a
    multiple of its admissible minimum. clip B; sensitivity S = B (add_remove) or 2B (replace).
    dropout: the share of clients that (simulated, seeded) leave each round after key agreement. dropout_policy abort
    (the round is discarded and re-run with fresh secrets; refused with dropout > 0, where every re-run would lose
    clients again) or secagg_recovery (the survivors' Shamir shares of the dropped clients' keys let the server
    remove their Δ: the round is flagged "reduced protection").
    mask_corrections: pairwise zero-sum masks (std 1e3 S) on Ψ_k, Φ_k so the server learns only their sums (W2).
    noise_family gaussian_conditional: Gaussian η and Δ in perturbed coordinates, audited per round (W1).
    method: what `dpfl run` runs (MP-DP, MP-DP-Naive, MP-CDP, FedSGD-FedAvg, or TP-SMC; `dpfl reproduce mpdp` runs
    all but TP-SMC). tpsmc_*: TP-SMC's Paillier key size, decryption threshold, assumed honest clients h (each adds
    1/h of MP-CDP's noise variance), fixed-point fraction bits and packing (several coordinates per ciphertext;
    the sums are the same); TP-SMC is for tiny models (<= 5,000 weights)."""

    scheme: Literal["mpdp"] = "mpdp"  # marks the YAML as an MP-DP config for `dpfl run`
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    seed: int = Field(0, ge=0)
    dataset: Literal["digits", "fashion_mnist", "cifar10", "cifar100"] = "digits"
    train_per_client: int | None = Field(None, ge=1)
    model: Literal["mlp", "cnn", "resnet"] = "mlp"
    hidden: list[int] = Field(default_factory=lambda: [64, 32], min_length=1)
    widths: list[int] = Field(default_factory=lambda: [16, 32, 64], min_length=1)
    blocks: int = Field(3, ge=1)
    bias: bool = False
    clients: int = Field(5, ge=2)
    rounds: int = Field(30, ge=1, le=100_000)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.5, gt=0)
    epsilon: float = Field(3.0, gt=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    graph: Literal["complete", "n_out"] = "complete"
    n: int | None = Field(None, ge=1)
    mode: Literal["verified", "unverified"] = "verified"
    sigma_delta_factor: float = Field(10.0, gt=1)
    clip: float = Field(1.0, gt=0)
    adjacency: Literal["add_remove", "replace"] = "add_remove"
    clip_mode: Literal["perturbed_joint", "none", "oracle_true"] = "perturbed_joint"
    mask_scale: float = Field(1.0, gt=0)
    dropout_policy: Literal["abort", "secagg_recovery"] = "abort"
    dropout: float = Field(0.0, ge=0, lt=1)
    mask_corrections: bool = False
    noise_family: Literal["dn", "gaussian_conditional"] = "dn"
    method: Literal["mpdp", "mpdp_naive", "mp_cdp", "fedavg", "tp_smc"] = "mpdp"  # what `dpfl run` runs
    tpsmc_key_bits: int = Field(1024, ge=64, le=8192)  # TP-SMC: the Paillier modulus n
    tpsmc_threshold: int | None = Field(None, ge=1)  # clients needed to decrypt (None: floor(K/2) + 1)
    tpsmc_honest: int | None = Field(None, ge=1)  # h, the honest clients the noise split assumes (None: K)
    tpsmc_fraction_bits: int = Field(32, ge=1, le=64)
    tpsmc_packing: bool = True  # TP-SMC: many fixed-point coordinates per ciphertext (same sums, far fewer ciphertexts)
    reproducible_secrets: bool = True  # simulation: the server's factors from the run seed (deployment refuses it)
    eval_every: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> MPDPConfig:
        if self.graph == "n_out" and self.n is None:
            _fail("n", "required by graph n_out", None, f"an integer in [1, {self.clients - 1}]")
        if self.graph == "n_out" and self.n is not None and self.n >= self.clients:
            _fail("n", f"must be below the number of clients ({self.clients})", self.n,
                  f"an integer in [1, {self.clients - 1}]")
        if self.graph == "complete" and self.n is not None:
            _fail("n", "only used by graph n_out", self.n, "null")
        if self.dropout and int(self.dropout * self.clients) == 0:
            _fail("dropout", f"drops no client of {self.clients} per round", self.dropout,
                  f"0, or at least {1 / self.clients:.4g}")
        if self.tpsmc_key_bits % 2:
            _fail("tpsmc_key_bits", "must be even (two primes of half the size)", self.tpsmc_key_bits, "e.g. 1024")
        for name in ("tpsmc_threshold", "tpsmc_honest"):
            value = getattr(self, name)
            if value is not None and value > self.clients:
                _fail(name, f"cannot exceed the number of clients ({self.clients})", value,
                      f"an integer in [1, {self.clients}]")
        if self.dropout and self.dropout_policy == "abort":  # every attempt would lose clients again
            _fail("dropout", "with dropout_policy abort every re-run of a round loses floor(dropout x clients) "
                  "clients again, so the run could never finish", self.dropout,
                  "0, or dropout_policy secagg_recovery")
        return self

    @property
    def sensitivity(self) -> float:
        return self.clip * (2.0 if self.adjacency == "replace" else 1.0)


def load_mpdp_config(path: str | Path, **overrides: object) -> MPDPConfig:
    data = dict(read_config_mapping(path))
    data.update(overrides)
    try:
        return MPDPConfig.model_validate(data)
    except ValidationError as exc:  # one line, naming the field, as for every dpfl config
        raise _config_error(exc, MPDPConfig) from None
