"""The model a finished run released, as the membership attacker sees it (the adapter between run directories and
`dpfl.attacks.membership`).

Every client receives the global model, so a curious client (or anyone the model is published to) can query it. The
run directory holds the final global parameters in checkpoint.pt (written when the run ends) and its config; the
data split is rebuilt from the config's seed, so members (the clients' training records) and non-members (the global
test set, never trained on) are exactly the run's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpfl.attacks.membership import run_membership_attacks
from dpfl.data.federated import FederatedDataset
from dpfl.data.registry import PROVIDED
from dpfl.engine import params as P
from dpfl.engine.evaluation import outputs
from dpfl.experiment.build import build_data
from dpfl.experiment.config import PROVIDED_MODEL, RunConfig, load_config
from dpfl.experiment.run_directory import CHECKPOINT, CONFIG, SUMMARY, load_checkpoint
from dpfl.models.registry import build_model


@dataclass
class ReleasedModel:
    cfg: RunConfig
    data: FederatedDataset
    model: nn.Module
    params: P.Params
    loss: str

    def predict(self, x: Any) -> torch.Tensor:
        """The released model's outputs (logits, or scores for MSE-trained models), evaluation mode, no gradients."""
        return outputs(self.model, self.params, torch.as_tensor(x))

    def members(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.cat([c.x_train for c in self.data.clients]), torch.cat([c.y_train for c in self.data.clients]))

    def nonmembers(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.x_test, self.data.y_test


def released_model(run_dir: str | Path) -> ReleasedModel:
    """The final global model of a finished run directory (`dpfl run`), with the run's data split."""
    run_dir = Path(run_dir)
    if not (run_dir / SUMMARY).is_file():
        raise FileNotFoundError(f"{run_dir}: not a finished dpfl run directory (no {SUMMARY})")
    if json.loads((run_dir / SUMMARY).read_text()).get("scheme") == "mpdp":
        raise ValueError(f"{run_dir}: an MP-DP run keeps no model (the attacks on MP-DP, clients' demasking and "
                         "membership inference and the server's gradient inversion, run inside `dpfl reproduce mpdp`)")
    if not (run_dir / CHECKPOINT).is_file():
        raise FileNotFoundError(f"{run_dir}: has no {CHECKPOINT}, so the released model was not kept")
    cfg = load_config(run_dir / CONFIG)
    if cfg.data.dataset == PROVIDED or cfg.model.name == PROVIDED_MODEL:
        raise ValueError(f"{run_dir}: the run's data or model was passed as an object; attack it from Python")
    state = load_checkpoint(run_dir / CHECKPOINT)  # checked like a resume reads it: a damaged file is one line
    if state.get("stop_reason") is None:
        raise ValueError(f"{run_dir}: {CHECKPOINT} is not the final state of the run")
    data = build_data(cfg)
    model = build_model(cfg.model.name, tuple(data.input_shape), data.n_classes, seed=cfg.seed, **cfg.model.options)
    params = {name: t.to(next(model.parameters()).dtype) for name, t in state["params"].items()}
    return ReleasedModel(cfg, data, model, params, getattr(model, "loss_kind", "cross_entropy"))


def attack_released_model(run_dir: str | Path, seed: int = 0) -> dict[str, Any]:
    """Loss, confidence and shadow attacks on the released model (members: the clients' training records;
    non-members: the test set; balanced, half known to the attacker, half held out for the metrics)."""
    released = released_model(run_dir)
    if released.data.n_classes < 2:
        raise ValueError("membership inference needs a classification dataset")
    results = run_membership_attacks(released.predict, released.members(), released.nonmembers(), seed=seed,
                                     loss=released.loss)
    return {"run": str(run_dir), "name": released.cfg.name, "loss": released.loss, "attacks": results}


MIA_METRICS = ("asr", "auc", "tpr_at_1fpr", "threshold_protocol", "n_members", "n_nonmembers")


def write_membership_files(result: dict[str, Any], out: Path) -> None:
    """`dpfl attack mia`'s files of `attack_released_model`'s result: OUT/roc.png (every attack's ROC curve) and
    OUT/mia.json (the result with each attack's `MIA_METRICS`, without its curve)."""
    from dpfl.attacks.membership import plot_roc
    from dpfl.results.run_files import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    attacks = result["attacks"]
    plot_roc({k: (v["fpr"], v["tpr"]) for k, v in attacks.items()}, out / "roc.png",
             title=f"membership inference: {result['name']}")
    write_json_atomic(out / "mia.json", {**result, "attacks": {k: {m: v.get(m) for m in MIA_METRICS}
                                                                for k, v in attacks.items()}})
