"""`dpfl attack`: the attacks that measure what a run's mechanism stops in practice: gradient inversion of one
client's upload (`dpfl.evaluate.probe`) and membership inference against a run's released model
(`dpfl.evaluate.released`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dpfl.cli.common import UserError, console, fail, say, user_errors

attack_app = typer.Typer(no_args_is_help=True, help="Attacks that measure what a run's mechanism stops in practice.")


def _config_of(run_or_config: Path, sets: list[str]):
    """A config file, or a run directory's config.yaml."""
    from dpfl.experiment.config import load_config

    path = run_or_config / "config.yaml" if run_or_config.is_dir() else run_or_config
    return load_config(path, sets)


def _fresh_out(out: Path, names: tuple[str, ...]) -> None:
    taken = [n for n in names if (out / n).exists()]
    if taken:
        raise UserError(f"{out / taken[0]} already exists (choose another --out)")


@attack_app.command("invert")
def attack_invert(
    run_or_config: Annotated[Path, typer.Argument(help="A config, or a run directory (its config.yaml).")],
    out: Annotated[Path, typer.Option(help="Writes OUT/inversion.json and OUT/inversion.png.")],
    batch: Annotated[int, typer.Option(help="Records in the probed client's one-step upload (1 or 8 in "
                                            "the spec).")] = 1,
    steps: Annotated[int, typer.Option(help="Optimiser steps of each attack.")] = 200,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a field (repeatable).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the attacks' dummies and the feature extractor.")] = 0,
    after_smoothing: Annotated[Optional[int], typer.Option(
        "--after-smoothing", help="FedCEO only: attack client 0's smoothed model after the J-th smoothing (its round's "
                                  "K clients train, the server's T-tSVD smooths at that threshold; spec fedceo §8) "
                                  "instead of its upload.")] = None,
) -> None:
    """Gradient inversion (DLG, Inverting Gradients) of one client's upload, as the server receives it."""
    from dpfl.evaluate.probe import invert_probe, probe_round, write_inversion

    try:
        if steps < 1:
            raise UserError(f"--steps must be >= 1, got {steps}")
        _fresh_out(out, ("inversion.json", "inversion.png"))
        cfg = _config_of(run_or_config, list(set_ or []))
        probe = probe_round(cfg, batch, after_smoothing)
        result = invert_probe(probe, steps, seed)
    except user_errors() as e:
        fail(str(e).splitlines()[0])
    report = write_inversion(out, cfg.name, probe, result, batch=batch, steps=steps, after_smoothing=after_smoothing)
    for name, r in report["attacks"].items():
        console.print(f"{name}: PSNR {r['psnr']:.1f} dB, image MSE {r['image_mse']:.4f}, feature MSE "
                      f"{r['feature_mse']:.4f}", highlight=False)
    what = "client 0's upload" if after_smoothing is None else "client 0's smoothed model"
    say(f"what was inverted: {what} as seen by {probe.observer}; wrote {out}/inversion.png")


@attack_app.command("mia")
def attack_mia(
    run: Annotated[Path, typer.Argument(help="A finished run directory (dpfl run).")],
    out: Annotated[Path, typer.Option(help="Writes OUT/mia.json and OUT/roc.png.")],
    seed: Annotated[int, typer.Option(help="Seed of the attacker's half and the shadow classifier.")] = 0,
) -> None:
    """Membership inference against the run's released model (loss, confidence and shadow attacks)."""
    from dpfl.evaluate.released import attack_released_model, write_membership_files

    try:
        _fresh_out(out, ("mia.json", "roc.png"))
        result = attack_released_model(run, seed)
    except user_errors() as e:
        fail(str(e).splitlines()[0])
    write_membership_files(result, out)
    for name, v in result["attacks"].items():
        console.print(f"{name}: ASR {v['asr']:.3f}, AUC {v['auc']:.3f}, TPR at 1% FPR {v['tpr_at_1fpr']:.3f}",
                      highlight=False)
    say(f"wrote {out}/mia.json and {out}/roc.png (ASR 0.5 = guessing)")
