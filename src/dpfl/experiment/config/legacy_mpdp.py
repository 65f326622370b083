"""MP-DP's old flat config schema (`scheme: mpdp`; spec bidirectional.md §11), read only to convert it.

MP-DP and its baselines now run on the one round loop and are configured like every run (`RunConfig`: data
partition iid_equal, models mpdp_mlp / mpdp_cnn / mpdp_resnet, algorithm mpdp / mpdp_naive / mp_cdp / tp_smc /
fedsgd with their `algorithm.params`). A file in the old schema is validated field by field as before, then
converted (`convert_legacy_mpdp`), and the loader says so in one line (`legacy_notice`). `--set` overrides use
the run config's spelling; a flat one (`--set method=mpdp`) is refused with the new spelling.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, ValidationError

from dpfl.algorithms.catalog.mpdp import PARAMS, MPDPParams
from dpfl.data.catalog import FILE_BACKED
from dpfl.experiment.config.errors import ConfigError, _config_error

SCHEME = "mpdp"  # the old schema's marker


class MPDPConfig(MPDPParams):
    """The old flat schema: the family's `algorithm.params` (`MPDPParams`: epsilon, delta, graph, n, mode,
    sigma_delta_factor, adjacency, clip_mode, mask_scale, dropout_policy, dropout, mask_corrections, noise_family,
    reproducible_secrets, tpsmc_*) next to the run's own fields: dataset (digits, fashion_mnist, cifar10 or cifar100,
    read from local files only), train_per_client, model (mlp with `hidden`, cnn, or resnet with `widths` and
    `blocks`; `bias`), clients (every one each round), rounds, batch_size, lr, clip (B), method (mpdp, mpdp_naive,
    mp_cdp, fedavg or tp_smc) and eval_every."""

    scheme: Literal["mpdp"] = "mpdp"  # marks the YAML as an old MP-DP config
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
    clip: float = Field(1.0, gt=0)
    method: Literal["mpdp", "mpdp_naive", "mp_cdp", "fedavg", "tp_smc"] = "mpdp"
    eval_every: int = Field(5, ge=1)


def is_legacy_mpdp(data: Mapping[str, Any]) -> bool:
    """Whether a config mapping is in the old flat MP-DP schema (top-level `scheme: mpdp`)."""
    return data.get("scheme") == SCHEME


def legacy_notice(where: str) -> str:
    """The one line the loader prints when it converts an old MP-DP config."""
    return (f"note: {where} is an MP-DP config in the old flat schema (scheme: mpdp); it was converted to a run "
            "config (data, model, training, privacy, algorithm sections), which the run directory's config.yaml "
            "records: write new configs that way")


MODELS = {"mlp": "mpdp_mlp", "cnn": "mpdp_cnn", "resnet": "mpdp_resnet"}
ALGORITHMS = {"fedavg": "fedsgd"}  # the old method names that changed (the others are the algorithm's name)
FLAT_TO_NEW = {  # a flat field -> its run-config spelling (for refused flat --set overrides)
    "name": "name", "seed": "seed", "dataset": "data.dataset", "clients": "data.clients",
    "train_per_client": "data.samples_per_client", "model": "model.name", "hidden": "model.options.hidden",
    "widths": "model.options.widths", "blocks": "model.options.blocks", "bias": "model.options.bias",
    "rounds": "training.rounds", "batch_size": "training.batch_size", "lr": "training.optimizer.lr",
    "clip": "privacy.clip", "method": "algorithm.name", "eval_every": "evaluation.every",
}


def convert_legacy_mpdp(data: Mapping[str, Any]) -> dict[str, Any]:
    """The run-config mapping of an old flat MP-DP config (validated first: a bad field is a one-line ConfigError
    naming it, as before)."""
    try:
        cfg = MPDPConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise _config_error(exc, MPDPConfig) from None
    options: dict[str, Any] = {"bias": cfg.bias}
    if cfg.model == "mlp":
        options["hidden"] = list(cfg.hidden)
    elif cfg.model == "resnet":
        options.update(widths=list(cfg.widths), blocks=cfg.blocks)
    params = {name: getattr(cfg, name) for name in PARAMS}
    return {
        "name": cfg.name, "seed": cfg.seed,
        "data": {"dataset": cfg.dataset, "clients": cfg.clients, "partition": "iid_equal",
                 **({"samples_per_client": cfg.train_per_client} if cfg.train_per_client is not None else {}),
                 # spec §11: MP-DP's loaders read local files only, never download
                 **({"options": {"download": False}} if cfg.dataset in FILE_BACKED else {})},
        "model": {"name": MODELS[cfg.model], "options": options},
        "algorithm": {"name": ALGORITHMS.get(cfg.method, cfg.method), "params": params},
        "training": {"rounds": cfg.rounds, "local_steps": 1, "batch_size": cfg.batch_size,
                     "optimizer": {"lr": cfg.lr}, "selection": {"kind": "all"}},
        "privacy": {"clip": cfg.clip} if cfg.method != "fedavg" else {},  # FedSGD clips nothing
        "evaluation": {"every": cfg.eval_every},
    }


def refuse_flat_overrides(overrides: Sequence[str]) -> None:
    """A flat `--set field=value` of the old schema is refused with the run config's spelling."""
    for text in overrides:
        key = text.partition("=")[0].strip()
        if "." in key:
            continue
        new = FLAT_TO_NEW.get(key, f"algorithm.params.{key}" if key in MPDPConfig.model_fields else None)
        if new is not None and new != key:
            value = text.partition("=")[2]
            if key == "method":  # the algorithm's name, as convert_legacy_mpdp maps it (FedSGD clips nothing)
                value = ALGORITHMS.get(value.strip(), value.strip())
                value += " --set privacy.clip=null" if value == "fedsgd" else ""
            raise ConfigError(f"--set {text}: MP-DP configs are run configs now: write --set {new}={value}", "--set")
