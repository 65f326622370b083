"""The FedCEO paper's comparison (Li et al., arXiv:2402.07002, ICML 2025; spec fedceo.md §4, §6, §9).

Methods (spec §6 and §9 "Configs"), every one with the same DP-SGD clients (sample-level, Poisson batches of
expected size 64, per-sample clip 1, fixed noise multiplier σ_g, lr 0.1, momentum 0.5):

| method | dpfl algorithm | |
|---|---|---|
| udp_fedavg | dp_fedavg_local, uniform weights | DP-SGD clients + FedAvg (the paper's UDP-FedAvg in its dpsgd mode) |
| ppsgd | ppsgd, alpha 1.0 (θ_k = w + u_k, u_k stays on the client) | primary metric acc_personal |
| centaur | centaur, head_epochs 1 (private heads, shared representation) | primary metric acc_personal |
| fedceo_theta1 | fedceo, theta 1.0, the row's lam and interval | ablation: constant threshold |
| fedceo | fedceo, the row's lam / theta / interval, layers all, personalize | |

Settings: `fmnist-mlp-sg1.0`, `fmnist-mlp-sg1.5`, `fmnist-mlp-sg2.0` (privacy.noise_multiplier = σ_g), from
the base configs `configs/fedceo/{fmnist_mlp,reduced_fmnist_mlp,ci_fmnist_mlp}.yaml` (full, reduced, ci). At
full scale `--dataset emnist` / `--dataset cifar10` add the paper's own settings (`emnist-mlp-sg*` with mlp2,
`cifar10-lenet-sg*` with lenet5; base configs `emnist_mlp.yaml`, `cifar10_lenet.yaml`) with its Table 2 values;
they are skipped when the files are missing.

FedCEO's λ, ϑ, I per scale:
- full (Fashion-MNIST): chosen on the clients' validation splits by `--scale full --search` where that search
  has been run (`SEARCHED`: σ_g = 1.5 and 2.0), else the paper's EMNIST/MLP rows (same input shape and
  model), NOT tuned for Fashion-MNIST.
- reduced: chosen on the clients' validation splits by `dpfl reproduce fedceo --scale reduced --search`
  (`SEARCHED`; coordinate search, see `dpfl.reproduce.fedceo_search`).
- ci: the paper's EMNIST/MLP λ and ϑ with I = 5.
`--search-result OUT/search.json` (written by a `--search` at the same scale and length) replaces these with the
search's complete choices, σ_g by σ_g.

Scales:
- `full` is the paper's N = 100, K = 10, T = 300, E = 30, B = 64 with evaluation every 5 rounds (every
  smoothing round and the last round are evaluated).
- `reduced` is `full` with T = 50 rounds and E = 1 local epoch (labelled REDUCED wherever it appears), 3 seeds.
- `ci` is N = 20 (6,000 images), K = 5, T = 20, E = 2, I = 5, evaluation every round: a smoke test, not the
  paper's setting.
Global accuracy is on the full official test split at every scale (the spec's ci uses 2,000 test images).
Each client's share is split 80/10/10 into train / validation / local test (spec §5).

What is not reproduced:
- No non-i.i.d. or `udp` variants, no DLG study, no CIFAR-10/MLP (App. C.2.2).
- Seeds are numbered from 0 as in every dpfl grid, not the authors' seed 2023.
- The noise is fixed, not calibrated: budgets are unlimited and each client's spent ε (δ = 1e-5, RDP) is
  reported; `meets_budgets` is therefore always true and says nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from dpfl.reproduce.jobs import Grid, GridError, Method, Setting, build_grid, config_dir, scale_label

__all__ = ["FEDCEO_PARAMS", "LENET_PARAMS", "PAPER_DATASETS", "METHOD_NAMES", "SIGMAS", "SCALES", "SEARCHED", "SPEC",
           "base_config", "fedceo_override", "searched_params", "fedceo_params", "grid", "methods", "settings",
           "udp_fedavg"]

PAPER = "fedceo"
SCALES = ("ci", "reduced", "full")
SIGMAS = ("1.0", "1.5", "2.0")
# σ_g -> (lam, theta, interval at full scale): the paper's Table 2, EMNIST / MLP-2-layers rows (spec §4)
FEDCEO_PARAMS = {"1.0": (70.0, 1.08, 30), "1.5": (0.5, 1.04, 20), "2.0": (0.03, 1.06, 20)}
LENET_PARAMS = {"1.0": (85.0, 1.03, 15), "1.5": (10.0, 1.07, 10), "2.0": (0.6, 1.04, 10)}  # Table 2, CIFAR-10 / LeNet-5
# the paper's own datasets, at full scale only (days per run; skipped when the files are missing): dataset ->
# (setting prefix, base config, Table 2 rows, shape)
PAPER_DATASETS = {
    "emnist": ("emnist-mlp", "emnist_mlp.yaml", FEDCEO_PARAMS, "EMNIST letters, mlp2, i.i.d., N = 100, K = 10, E = 30"),
    "cifar10": ("cifar10-lenet", "cifar10_lenet.yaml", LENET_PARAMS,
                "CIFAR-10, lenet5, i.i.d., N = 100, K = 10, E = 30"),
}
# σ_g -> (lam, theta, interval) chosen on the validation splits by `dpfl reproduce fedceo --scale reduced --search`
# (search.json; docs/fedceo.md has the whole search). Final val_accuracy of the choice / of udp_fedavg, seed 0:
# σ_g 1.0: 0.7505 / 0.7507; σ_g 1.5: 0.7503 / 0.7503; σ_g 2.0: 0.7412 / 0.7455. Every choice is the weakest
# smoothing on offer (the largest λ or next to it, the smallest ϑ, the longest I): smoothing did not help here.
SEARCHED = {"reduced": {"1.0": (65.0, 1.02, 25), "1.5": (10.0, 1.02, 25), "2.0": (1.0, 1.02, 25)},
            "full": {"1.5": (3.16, 1.04, 20), "2.0": (0.562, 1.04, 20)}}  # full: 1.5 and 2.0 searched (docs/fedceo.md)
CI_INTERVAL = 5
SPEC = {"full": {"rounds": 300, "seeds": 1}, "reduced": {"rounds": 50, "seeds": 3}, "ci": {"rounds": 20, "seeds": 1}}
BASES = {"full": "fmnist_mlp.yaml", "reduced": "reduced_fmnist_mlp.yaml", "ci": "ci_fmnist_mlp.yaml"}
EVAL_EVERY = {"full": 5, "reduced": 5, "ci": 1}  # the base configs' evaluation.every (checked in the tests)
SHAPE = {"full": "N = 100 clients x 600 images, K = 10 per round, E = 30 local epochs",
         "reduced": "N = 100 clients x 600 images, K = 10 per round, E = 1 local epoch (REDUCED from 30)",
         "ci": "N = 20 clients x 300 images, K = 5 per round, E = 2 local epochs"}
METHOD_NAMES = ("udp_fedavg", "ppsgd", "centaur", "fedceo_theta1", "fedceo")
PRIMARY = {"udp_fedavg": "acc_global", "fedceo_theta1": "acc_global", "fedceo": "acc_global",
           "ppsgd": "acc_personal", "centaur": "acc_personal"}  # spec §10.9

UDP_FEDAVG = "DP-SGD clients + FedAvg (the paper's UDP-FedAvg in its dpsgd mode)"
ABLATION = "ablation: constant threshold"


def _check_scale(scale: str) -> None:
    if scale not in SPEC:
        raise GridError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")


def base_config(scale: str) -> Path:
    """configs/fedceo/<base> of a scale, from a source checkout or the current directory."""
    return config_dir("fedceo") / BASES[scale]


Params = tuple[float, float, int, str]  # λ, ϑ, I, where they come from


def searched_params(path: Path, scale: str, rounds: int | None = None) -> dict[str, Params]:
    """σ_g -> (λ, ϑ, I, source) from a `--search` run's OUT/search.json, refused unless it matches this run.

    The search must be at the same scale and length (its label, e.g. ``full``, is compared with the one a
    search with these options would have) and a σ_g's choice must be complete (every run of both stages
    finished): a partial search's best value is not the search's choice.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        label, chosen = data["scale"], data["chosen"]
    except FileNotFoundError:
        raise GridError(f"--search-result: no file {path} (run `dpfl reproduce fedceo --search` first)") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise GridError(f"--search-result: {path} is not a search.json of `dpfl reproduce fedceo --search` "
                        f"({type(err).__name__}: {err})") from None
    _check_scale(scale)
    expected = scale_label(scale, spec_rounds=SPEC[scale]["rounds"], spec_seeds=1, rounds=rounds, seeds=1)
    if label != expected:
        raise GridError(f"--search-result: {path} was searched at scale {label!r}; this comparison's search would be "
                        f"{expected!r} (same --scale and --rounds)")
    out = {}
    for sigma, c in chosen.items():
        if sigma not in SIGMAS:
            raise GridError(f"--search-result: {path} has sigma_g {sigma!r}, not one of {', '.join(SIGMAS)}")
        if c.get("complete") is not True:
            raise GridError(f"--search-result: the search of sigma_g {sigma} in {path} is not complete "
                            f"({c.get('runs')} of {c.get('planned', '?')} runs finished): finish it with the same "
                            "`dpfl reproduce fedceo --search` command (it also rewrites an older search.json)")
        out[sigma] = (float(c["lam"]), float(c["theta"]), int(c["interval"]),
                      f"chosen on the validation splits by the search in {path}")
    return out


def fedceo_params(scale: str, sigma: str, searched: dict[str, Params] | None = None) -> Params:
    """(λ, ϑ, I, where they come from) for a scale and σ_g; `searched` (from `searched_params`) comes first."""
    if searched and sigma in searched:
        return searched[sigma]
    if sigma in SEARCHED.get(scale, {}):  # a scale's search may cover only some σ_g (full: one at a time)
        lam, theta, interval = SEARCHED[scale][sigma]
        return lam, theta, interval, f"chosen on the validation splits by `--scale {scale} --search`"
    lam, theta, interval = FEDCEO_PARAMS[sigma]
    if scale == "ci":
        return lam, theta, CI_INTERVAL, "the paper's EMNIST/MLP row, I reduced for ci; NOT tuned for Fashion-MNIST"
    return lam, theta, interval, "the paper's EMNIST/MLP row; NOT tuned for Fashion-MNIST"


def fedceo_override(lam: float, theta: float, interval: int) -> str:
    """The `--set` string of a FedCEO method with these parameters."""
    return (f"algorithm={{name: fedceo, params: {{lam: {lam!r}, theta: {theta!r}, interval: {interval}, "
            "layers: all, personalize: true}}")


def udp_fedavg() -> Method:
    """The baseline: the same DP-SGD clients with plain FedAvg (also the search's reference)."""
    return Method("udp_fedavg", "dp_fedavg_local", ("algorithm={name: dp_fedavg_local, params: {weighting: uniform}}",),
                  UDP_FEDAVG)


def methods(lam: float, theta: float, interval: int) -> tuple[Method, ...]:
    """The five compared methods; only FedCEO's parameters depend on the setting."""
    return (
        udp_fedavg(),
        Method("ppsgd", "ppsgd", ("algorithm={name: ppsgd, params: {alpha: 1.0}}",)),
        Method("centaur", "centaur", ("algorithm={name: centaur, params: {head_epochs: 1}}",)),
        Method("fedceo_theta1", "fedceo", (fedceo_override(lam, 1.0, interval),), ABLATION),
        Method("fedceo", "fedceo", (fedceo_override(lam, theta, interval),)),
    )


def settings(scale: str, datasets: Sequence[str] = ("fashion_mnist",),
             searched: dict[str, Params] | None = None) -> list[Setting]:
    """One setting per dataset and σ_g, e.g. ``fmnist-mlp-sg1.5`` (``emnist-mlp-*``, ``cifar10-lenet-*`` at full).

    `searched` (see `searched_params`) sets FedCEO's parameters of the Fashion-MNIST settings it covers.
    """
    _check_scale(scale)
    for dataset in datasets:
        if dataset != "fashion_mnist" and dataset not in PAPER_DATASETS:
            raise GridError(f"--dataset: the FedCEO grid ships fashion_mnist, emnist and cifar10 (got {dataset!r})")
        if dataset in PAPER_DATASETS and scale != "full":
            raise GridError(f"--dataset {dataset} is defined at --scale full only (the paper's own setting)")
    out = []
    for dataset in datasets:
        if dataset in PAPER_DATASETS:
            out += _paper_settings(dataset)
            continue
        base = base_config(scale)
        for sigma in SIGMAS:
            lam, theta, interval, source = fedceo_params(scale, sigma, searched)
            if interval % EVAL_EVERY[scale]:  # pragma: no cover - a guard for edits of the table
                raise GridError(f"FedCEO interval {interval} is not a multiple of evaluation.every {EVAL_EVERY[scale]}")
            rounds = "" if scale != "reduced" else f", T = {SPEC[scale]['rounds']} (REDUCED from 300)"
            out.append(Setting(
                name=f"fmnist-mlp-sg{sigma}", base=base, overrides=(f"privacy.noise_multiplier={sigma}",),
                methods=methods(lam, theta, interval), dataset="fashion_mnist",
                describe=(f"fashion_mnist, mlp2, i.i.d., {SHAPE[scale]}{rounds}, DP-SGD σ_g = {sigma} (B = 64, C = 1, "
                          f"δ = 1e-5); FedCEO λ = {lam:g}, ϑ = {theta:g}, I = {interval} ({source})"),
                meta=_meta(sigma, lam, theta, interval, source)))
    return out


def _meta(sigma: str, lam: float, theta: float, interval: int, source: str) -> dict[str, str]:
    """What the tables show of a setting's FedCEO parameters, and where they come from."""
    return {"sigma": sigma, "lam": f"{lam:g}", "theta": f"{theta:g}", "interval": str(interval), "source": source}


def _paper_settings(dataset: str) -> list[Setting]:
    prefix, base, rows, shape = PAPER_DATASETS[dataset]
    out = []
    for sigma in SIGMAS:
        lam, theta, interval = rows[sigma]
        out.append(Setting(
            name=f"{prefix}-sg{sigma}", base=config_dir("fedceo") / base,
            overrides=(f"privacy.noise_multiplier={sigma}",), methods=methods(lam, theta, interval), dataset=dataset,
            describe=(f"{shape}, T = 300, DP-SGD σ_g = {sigma} (B = 64, C = 1, δ = 1e-5); FedCEO λ = {lam:g}, "
                      f"ϑ = {theta:g}, I = {interval} (the paper's Table 2 row for this dataset)"),
            meta=_meta(sigma, lam, theta, interval, "the paper's Table 2 row for this dataset")))
    return out


def grid(scale: str, *, datasets: Sequence[str] = ("fashion_mnist",), seeds: int | None = None,
         rounds: int | None = None, settings_pattern: str | None = None, methods: Sequence[str] | None = None,
         extra: Sequence[str] = (), search_result: Path | None = None) -> Grid:
    """The jobs of `dpfl reproduce fedceo` (see the module docstring); `extra` overrides apply to every job.

    `search_result`: a `--search`'s OUT/search.json whose complete choices set FedCEO's λ, ϑ, I.
    """
    searched = searched_params(search_result, scale, rounds) if search_result is not None else None
    chosen = settings(scale, datasets, searched)
    sigmas: dict[tuple[str, str], list[str]] = {}  # (dataset, source) -> the σ_g it applies to
    for s in chosen:
        sigmas.setdefault((s.dataset, s.meta["source"]), []).append(s.meta["sigma"])
    sources = [f"FedCEO λ/ϑ/I on {dataset}, σ_g {', '.join(sig)}: {source}" for (dataset, source), sig in sigmas.items()]
    return build_grid(PAPER, scale, chosen, spec_rounds=SPEC[scale]["rounds"], spec_seeds=SPEC[scale]["seeds"],
                      seeds=seeds, rounds=rounds, settings_pattern=settings_pattern, methods=methods, extra=extra,
                      selection=sources)
