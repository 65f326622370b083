"""Adaptive clipping and server optimizers against DP-FedAvg's fixed clip (issue 68; Andrew, Thakkar, McMahan,
Ramaswamy, NeurIPS 2021; Reddi et al., ICLR 2021): `dpfl reproduce mechanisms`.

One budget, many clients, few per round: central DP-FedAvg (client-level DP, noise calibrated so the run spends
epsilon 4 at delta 1e-5, RDP accountant) on Fashion-MNIST, logistic regression, Poisson client selection.

| method | clip | server |
|---|---|---|
| fixed_c0.03, fixed_c0.1, fixed_c0.3 | fixed clip, the sweep a user would tune over | plain average |
| fixed_c1 | fixed clip 1.0 (the configs' default: the untuned choice) | plain average |
| adaptive | adaptive, target quantile 0.5, eta 0.2, initial clip 0.1, sigma_b = expected cohort / 20 | plain average |
| fixed_c0.1_fedadam, fixed_c1_fedadam, adaptive_fedadam | as above | FedAdam (lr 0.1, b1 0.9, b2 0.99, tau 1e-3) |
| fixed_c0.1_fedadam_lr0.03, _lr0.01; adaptive_fedadam_lr0.03, _lr0.01 | as above | FedAdam at server lr 0.03, 0.01 |

Reddi et al. tune the server learning rate per task; the FedAdam runs at clip 0.1 and with the adaptive clip sweep it
over 0.1 (Flower's default), 0.03 and 0.01 (at ci scale 0.3 and 1.0 were worse than 0.1: docs/papers/mechanisms.md).

The tuned fixed clip is the best of the sweep by mean final accuracy, chosen with the test accuracy itself (what a
user tuning on held-out data approximates; its privacy cost is not accounted). Settings: `ci` is
configs/mechanisms/adaptive_central.yaml as it is (500 clients of 40 images, about 20 per round, 50 rounds, 3 seeds,
a few minutes on 2 cores); `full` has 3,000 clients of 20 images (the 60,000 training images), about 100 per round
and 200 rounds.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpfl.reproduce.jobs import Grid, GridError, Method, Setting, build_grid, config_dir

__all__ = ["CLIPS", "SERVER_LRS", "SPEC", "grid", "methods", "settings"]

PAPER = "mechanisms"
SPEC = {"full": {"rounds": 200, "seeds": 3}, "ci": {"rounds": 50, "seeds": 3}}
CLIPS = (0.03, 0.1, 0.3, 1.0)  # the fixed clips swept; 1.0 is the untuned default of dpfl's central configs
SERVER_LRS = (0.03, 0.01)  # FedAdam's server learning rates swept beside Flower's default 0.1


def _fedadam(lr: float = 0.1) -> str:
    return f"algorithm.server_optimizer={{name: fedadam, lr: {lr:g}}}"


ADAPTIVE = "privacy.adaptive_clipping={target_quantile: 0.5, learning_rate: 0.2, initial_clip: 0.1}"


def _fixed(clip: float) -> tuple[str, ...]:
    return ("privacy.adaptive_clipping=null", f"privacy.clip={clip:g}")


def methods() -> tuple[Method, ...]:
    """The fixed-clip sweep, adaptive clipping, three of them under FedAdam, and FedAdam's server-lr sweep at clip
    0.1 and with the adaptive clip (module docstring)."""
    out = [Method(f"fixed_c{c:g}", "dp_fedavg_central", _fixed(c)) for c in CLIPS]
    out.append(Method("adaptive", "dp_fedavg_central", (ADAPTIVE,)))
    for clip in (0.1, 1.0):
        out.append(Method(f"fixed_c{clip:g}_fedadam", "dp_fedavg_central", (*_fixed(clip), _fedadam())))
    out.append(Method("adaptive_fedadam", "dp_fedavg_central", (ADAPTIVE, _fedadam())))
    for lr in SERVER_LRS:
        out.append(Method(f"fixed_c0.1_fedadam_lr{lr:g}", "dp_fedavg_central", (*_fixed(0.1), _fedadam(lr))))
        out.append(Method(f"adaptive_fedadam_lr{lr:g}", "dp_fedavg_central", (ADAPTIVE, _fedadam(lr))))
    return tuple(out)


def settings(scale: str, datasets: Sequence[str] = ("fashion_mnist",)) -> list[Setting]:
    """One setting per scale, on Fashion-MNIST."""
    if scale not in SPEC:
        raise GridError(f"--scale must be 'ci' or 'full', got {scale!r}")
    if list(datasets) != ["fashion_mnist"]:
        raise GridError("--dataset: the mechanisms comparison runs on fashion_mnist only")
    base = config_dir("mechanisms") / "adaptive_central.yaml"
    if scale == "ci":
        return [Setting("fmnist-500", base, (), methods(), "fashion_mnist",
                        describe="Fashion-MNIST, logr, 500 clients x 40 images, Poisson rate 0.04 (about 20 per "
                                 "round), epsilon 4 at delta 1e-5 (RDP), central DP-FedAvg")]
    overrides = ("data.clients=3000", "data.max_train_samples=null", "training.rounds=200",
                 "training.selection={kind: poisson, rate: "
                 "0.0333333}", "evaluation.every=20")
    return [Setting("fmnist-3000", base, overrides, methods(), "fashion_mnist",
                    describe="Fashion-MNIST, logr, 3,000 clients x 20 images, Poisson rate 1/30 (about 100 per "
                             "round), epsilon 4 at delta 1e-5 (RDP), central DP-FedAvg")]


def grid(scale: str, *, datasets: Sequence[str] = ("fashion_mnist",), seeds: int | None = None,
         rounds: int | None = None, settings_pattern: str | None = None, methods: Sequence[str] | None = None,
         extra: Sequence[str] = ()) -> Grid:
    """The jobs of `dpfl reproduce mechanisms` (see the module docstring)."""
    return build_grid(PAPER, scale, settings(scale, datasets), spec_rounds=SPEC[scale]["rounds"],
                      spec_seeds=SPEC[scale]["seeds"], seeds=seeds, rounds=rounds, settings_pattern=settings_pattern,
                      methods=methods, extra=extra)
