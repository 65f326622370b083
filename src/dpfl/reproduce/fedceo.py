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
  has been run (`SEARCHED`: every σ_g), else the paper's EMNIST/MLP rows (same input shape and model), NOT tuned
  for Fashion-MNIST.
- reduced: chosen on the clients' validation splits by `dpfl reproduce fedceo --scale reduced --search`
  (`SEARCHED`; coordinate search, see `dpfl.reproduce.fedceo_search`).
- ci: the paper's EMNIST/MLP λ and ϑ with I = 5.
`--search-result OUT/search.json` (written by a `--search` at the same scale, length and `--set`) replaces these with
the search's complete choices, σ_g by σ_g.

Scales:
- `full` is the paper's N = 100, K = 10, T = 300, E = 30, B = 64 with evaluation every 5 rounds (every
  smoothing round and the last round are evaluated).
- `reduced` is `full` with T = 50 rounds and E = 1 local epoch (labelled REDUCED wherever it appears), 3 seeds.
- `ci` is N = 20 (6,000 images), K = 5, T = 20, E = 2, I = 5, evaluation every round: a smoke test, not the
  paper's setting.
Global accuracy is on the full official test split at every scale (the spec's ci uses 2,000 test images).
Each client's share is split 80/10/10 into train / validation / local test (spec §5).

Variants (spec §9 "Configs"; Fashion-MNIST only, every scale): `--partition shards` (the McMahan et al.
non-i.i.d. split of spec §5: 2N label-sorted shards, 2 per client; the paper's App. C.2.2 remark is that non-i.i.d.
data wants a larger λ) and `--mechanism udp` (the paper's Algorithm 1: non-private local SGD, the whole update
clipped to C and N(0, σ²C²/K) added per upload; client-level DP, so the baseline is dpfl's `udp_fedavg`). Their
setting names carry the variant (`fmnist-mlp-shards-sg1.5`, `fmnist-mlp-udp-sg1.5`, `fmnist-mlp-shards-udp-sg1.5`).
FedCEO's λ, ϑ, I for a variant are the paper's EMNIST/MLP rows (NOT tuned; for `udp` they are meaningless, spec
§3.1) unless `--search-result` gives a search of that variant (`--search --partition/--mechanism`).

What is not reproduced:
- No CIFAR-10/MLP (App. C.2.2; no CIFAR-10 files here); the DLG study is `--dlg` (`dpfl.reproduce.fedceo_dlg`).
- Seeds are numbered from 0 as in every dpfl grid, not the authors' seed 2023.
- The noise is fixed, not calibrated: budgets are unlimited and each client's spent ε (δ = 1e-5, RDP) is
  reported; `meets_budgets` is therefore always true and says nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from dpfl.reproduce.jobs import (Grid, GridError, Method, Setting, build_grid, config_dir, scale_label,
                                 select_settings)

__all__ = ["FEDCEO_PARAMS", "LENET_PARAMS", "PAPER_DATASETS", "METHOD_NAMES", "SIGMAS", "SCALES", "SEARCHED", "SPEC",
           "DEFAULT", "Variant", "base_config", "fedceo_override", "searched_params", "fedceo_params", "grid",
           "methods", "settings", "udp_fedavg"]

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
# (search.json; docs/papers/fedceo.md has the whole search). Final val_accuracy of the choice / of udp_fedavg, seed 0:
# σ_g 1.0: 0.7505 / 0.7507; σ_g 1.5: 0.7503 / 0.7503; σ_g 2.0: 0.7412 / 0.7455. Every choice is the weakest
# smoothing on offer (the largest λ or next to it, the smallest ϑ, the longest I): smoothing did not help here
# (docs/papers/fedceo.md).
SEARCHED = {"reduced": {"1.0": (65.0, 1.02, 25), "1.5": (10.0, 1.02, 25), "2.0": (1.0, 1.02, 25)},
            "full": {"1.0": (60.0, 1.02, 30), "1.5": (3.16, 1.04, 20), "2.0": (0.562, 1.04, 20)}}
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
UDP_FEDAVG_UDP = ("clipped client updates + Gaussian noise per upload, FedAvg (the paper's Algorithm 1 without "
                  "smoothing)")
ABLATION = "ablation: constant threshold"
PARTITIONS = ("iid", "shards")
MECHANISMS = ("dpsgd", "udp")


@dataclass(frozen=True)
class Variant:
    """How the clients' data are split and privatised (spec §9's variants); the default is the paper's main setting.

    `shards`: spec §5's non-i.i.d. split (2 label-sorted shards per client). `udp`: spec §3.1(b), client-level DP
    (the update clipped to C, noise split over the expected cohort), accounted per upload without amplification.
    """

    partition: str = "iid"
    mechanism: str = "dpsgd"

    def __post_init__(self) -> None:
        if self.partition not in PARTITIONS:
            raise GridError(f"--partition must be one of {', '.join(PARTITIONS)}, got {self.partition!r}")
        if self.mechanism not in MECHANISMS:
            raise GridError(f"--mechanism must be one of {', '.join(MECHANISMS)}, got {self.mechanism!r}")

    @classmethod
    def of(cls, partition: str | None, mechanism: str | None) -> Variant:
        """The variant of the CLI's --partition / --mechanism (None: the default's)."""
        return cls(partition or cls.partition, mechanism or cls.mechanism)

    @property
    def is_default(self) -> bool:
        return self == DEFAULT

    @property
    def suffix(self) -> str:
        """What a setting's name carries, e.g. ``-shards-udp`` (nothing for the default)."""
        return "".join(f"-{v}" for v, d in ((self.partition, "iid"), (self.mechanism, "dpsgd")) if v != d)

    @property
    def overrides(self) -> tuple[str, ...]:
        out = () if self.partition == "iid" else (f"data.partition={self.partition}",)
        if self.mechanism == "udp":  # client-level: the server sees each upload and picks the clients
            out += ("privacy.mechanism=udp", "privacy.unit=client", "privacy.sampling=null")
        return out

    @property
    def split(self) -> str:
        return "i.i.d." if self.partition == "iid" else "label shards (2 per client, non-i.i.d.)"

    def noise(self, sigma: str) -> str:
        if self.mechanism == "udp":
            return f"client-level UDP σ_g = {sigma} (update clip C = 1, noise σ_g·C/√K per upload, δ = 1e-5)"
        return f"DP-SGD σ_g = {sigma} (B = 64, C = 1, δ = 1e-5)"

    def as_dict(self) -> dict[str, str]:
        return {"partition": self.partition, "mechanism": self.mechanism}


DEFAULT = Variant()


def _check_scale(scale: str) -> None:
    if scale not in SPEC:
        raise GridError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")


def base_config(scale: str) -> Path:
    """configs/fedceo/<base> of a scale, from a source checkout or the current directory."""
    return config_dir("fedceo") / BASES[scale]


class Params(NamedTuple):
    """FedCEO's λ, ϑ, I for a setting and where they come from; `ablation_lam`: the ϑ = 1 ablation's own λ when a
    `--search --tune-ablation` chose one (spec §4 Option `tune_ablation`), else None (the ablation takes `lam`)."""

    lam: float
    theta: float
    interval: int
    source: str
    ablation_lam: float | None = None


def searched_params(path: Path, scale: str, rounds: int | None = None, variant: Variant = DEFAULT,
                    sigmas: Sequence[str] | None = None, extra: Sequence[str] = ()) -> dict[str, Params]:
    """σ_g -> (λ, ϑ, I, source) from a `--search` run's OUT/search.json, refused unless it matches this run.

    The search must be at the same scale and length, with the same --set overrides `extra` (its label, e.g.
    ``full``, is compared with the one a search with these options would have: λ chosen under other
    hyperparameters is not this comparison's choice), of the same variant (a search.json without one is the default's),
    and the choice of each σ_g the comparison runs (`sigmas`; None: every σ_g in the file) must be complete
    (every run of both stages finished): a partial search's best value is not the search's choice. An incomplete
    σ_g the comparison does not run is left out (its search may still be running); complete ones are all returned,
    so the other σ_g's finished runs are still recognised.
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
    expected = scale_label(scale, spec_rounds=SPEC[scale]["rounds"], spec_seeds=1, rounds=rounds, seeds=1,
                           extra=extra)
    if label != expected:
        raise GridError(f"--search-result: {path} was searched at scale {label!r}; this comparison's search would be "
                        f"{expected!r} (same --scale, --rounds and --set)")
    searched_variant = data.get("variant", DEFAULT.as_dict())
    if searched_variant != variant.as_dict():
        raise GridError(f"--search-result: {path} searched the variant {searched_variant}; this comparison is "
                        f"{variant.as_dict()} (same --partition and --mechanism)")
    out = {}
    for sigma, c in chosen.items():
        if sigma not in SIGMAS:
            raise GridError(f"--search-result: {path} has sigma_g {sigma!r}, not one of {', '.join(SIGMAS)}")
        if c.get("complete") is not True:
            if sigmas is not None and sigma not in sigmas:
                continue  # still searching, and this comparison does not run it: not used
            raise GridError(f"--search-result: the search of sigma_g {sigma} in {path} is not complete "
                            f"({c.get('runs')} of {c.get('planned', '?')} runs finished): finish it with the same "
                            "`dpfl reproduce fedceo --search` command (it also rewrites an older search.json)")
        ablation = c.get("ablation_lam")
        out[sigma] = Params(float(c["lam"]), float(c["theta"]), int(c["interval"]),
                            f"chosen on the validation splits by the search in {path}",
                            None if ablation is None else float(ablation))
    return out


def fedceo_params(scale: str, sigma: str, searched: dict[str, Params] | None = None,
                  variant: Variant = DEFAULT) -> Params:
    """(λ, ϑ, I, where they come from) for a scale and σ_g; `searched` (from `searched_params`) comes first.

    `SEARCHED` holds the default variant's searches only: another variant takes the paper's rows unless searched.
    """
    if searched and sigma in searched:
        return searched[sigma]
    if variant.is_default and sigma in SEARCHED.get(scale, {}):  # a scale's search may cover only some σ_g
        lam, theta, interval = SEARCHED[scale][sigma]
        return Params(lam, theta, interval, f"chosen on the validation splits by `--scale {scale} --search`")
    lam, theta, interval = FEDCEO_PARAMS[sigma]
    untuned = "NOT tuned for Fashion-MNIST" + ("" if variant.is_default
                                               else f" nor for {variant.split} {variant.mechanism}")
    if scale == "ci":
        return Params(lam, theta, CI_INTERVAL, f"the paper's EMNIST/MLP row, I reduced for ci; {untuned}")
    return Params(lam, theta, interval, f"the paper's EMNIST/MLP row; {untuned}")


def fedceo_override(lam: float, theta: float, interval: int) -> str:
    """The `--set` string of a FedCEO method with these parameters. The T-tSVD runs in float64, as it did when the
    published numbers were made (the default became float32 in issue 67)."""
    return (f"algorithm={{name: fedceo, params: {{lam: {lam!r}, theta: {theta!r}, interval: {interval}, "
            "layers: all, personalize: true, prox_dtype: float64}}")


def udp_fedavg(variant: Variant = DEFAULT) -> Method:
    """The baseline: the same clients with plain FedAvg (also the search's reference).

    Under DP-SGD that is dpfl's `dp_fedavg_local` (the paper keeps the name UDP-FedAvg); under `udp` it is
    dpfl's `udp_fedavg`, the paper's Algorithm 1 itself.
    """
    if variant.mechanism == "udp":
        return Method("udp_fedavg", "udp_fedavg", ("algorithm={name: udp_fedavg, params: {weighting: uniform}}",),
                      UDP_FEDAVG_UDP)
    return Method("udp_fedavg", "dp_fedavg_local", ("algorithm={name: dp_fedavg_local, params: {weighting: uniform}}",),
                  UDP_FEDAVG)


def methods(lam: float, theta: float, interval: int, variant: Variant = DEFAULT,
            ablation_lam: float | None = None) -> tuple[Method, ...]:
    """The five compared methods; only FedCEO's parameters and the baseline's algorithm depend on the setting.

    The ϑ = 1 ablation takes `lam` and `interval` (spec §4), or `ablation_lam` when it was searched separately.
    """
    return (
        udp_fedavg(variant),
        Method("ppsgd", "ppsgd", ("algorithm={name: ppsgd, params: {alpha: 1.0}}",)),
        Method("centaur", "centaur", ("algorithm={name: centaur, params: {head_epochs: 1}}",)),
        Method("fedceo_theta1", "fedceo", (fedceo_override(lam if ablation_lam is None else ablation_lam, 1.0,
                                                          interval),), ABLATION),
        Method("fedceo", "fedceo", (fedceo_override(lam, theta, interval),)),
    )


def settings(scale: str, datasets: Sequence[str] = ("fashion_mnist",),
             searched: dict[str, Params] | None = None, variant: Variant = DEFAULT) -> list[Setting]:
    """One setting per dataset and σ_g, e.g. ``fmnist-mlp-sg1.5`` (``emnist-mlp-*``, ``cifar10-lenet-*`` at full).

    `searched` (see `searched_params`) sets FedCEO's parameters of the Fashion-MNIST settings it covers;
    `variant` (Fashion-MNIST only) chooses the partition and the client mechanism.
    """
    _check_scale(scale)
    for dataset in datasets:
        if dataset != "fashion_mnist" and dataset not in PAPER_DATASETS:
            raise GridError(f"--dataset: the FedCEO grid ships fashion_mnist, emnist and cifar10 (got {dataset!r})")
        if dataset in PAPER_DATASETS and scale != "full":
            raise GridError(f"--dataset {dataset} is defined at --scale full only (the paper's own setting)")
        if dataset in PAPER_DATASETS and not variant.is_default:
            raise GridError(f"--partition/--mechanism apply to fashion_mnist only ({dataset} runs the paper's own "
                            "Table 2 setting: i.i.d., DP-SGD)")
    out = []
    for dataset in datasets:
        if dataset in PAPER_DATASETS:
            out += _paper_settings(dataset)
            continue
        base = base_config(scale)
        for sigma in SIGMAS:
            lam, theta, interval, source, ablation_lam = fedceo_params(scale, sigma, searched, variant)
            if interval % EVAL_EVERY[scale]:  # pragma: no cover - a guard for edits of the table
                raise GridError(f"FedCEO interval {interval} is not a multiple of evaluation.every {EVAL_EVERY[scale]}")
            rounds = "" if scale != "reduced" else f", T = {SPEC[scale]['rounds']} (REDUCED from 300)"
            out.append(Setting(
                name=f"fmnist-mlp{variant.suffix}-sg{sigma}", base=base,
                overrides=(*variant.overrides, f"privacy.noise_multiplier={sigma}"),
                methods=methods(lam, theta, interval, variant, ablation_lam), dataset="fashion_mnist",
                describe=(f"fashion_mnist, mlp2, {variant.split}, {SHAPE[scale]}{rounds}, {variant.noise(sigma)}; "
                          f"FedCEO λ = {lam:g}, ϑ = {theta:g}, I = {interval}{_ablation(ablation_lam)} ({source})"),
                meta=_meta(sigma, lam, theta, interval, source, ablation_lam)))
    return out


def _ablation(ablation_lam: float | None) -> str:
    return "" if ablation_lam is None else f"; the ϑ = 1 ablation's own λ = {ablation_lam:g}"


def _meta(sigma: str, lam: float, theta: float, interval: int, source: str,
          ablation_lam: float | None = None) -> dict[str, str]:
    """What the tables show of a setting's FedCEO parameters, and where they come from."""
    meta = {"sigma": sigma, "lam": f"{lam:g}", "theta": f"{theta:g}", "interval": str(interval), "source": source}
    if ablation_lam is not None:
        meta["ablation_lam"] = f"{ablation_lam:g}"
    return meta


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
         extra: Sequence[str] = (), search_result: Path | None = None, partition: str | None = None,
         mechanism: str | None = None) -> Grid:
    """The jobs of `dpfl reproduce fedceo` (see the module docstring); `extra` overrides apply to every job.

    `search_result`: a `--search`'s OUT/search.json whose complete choices set FedCEO's λ, ϑ, I.
    `partition`, `mechanism`: the variant (None: the paper's main setting, i.i.d. and DP-SGD).
    """
    variant = Variant.of(partition, mechanism)
    searched = None
    if search_result is not None:  # only the σ_g this comparison runs must have a complete search
        try:
            running = select_settings(settings(scale, ("fashion_mnist",), None, variant), settings_pattern)
        except GridError:  # --settings picks no Fashion-MNIST setting (build_grid says so if it picks nothing)
            running = []
        searched = searched_params(search_result, scale, rounds, variant, sorted({s.meta["sigma"] for s in running}),
                                   extra)
    chosen = settings(scale, datasets, searched, variant)
    sigmas: dict[tuple[str, str], list[str]] = {}  # (dataset, source) -> the σ_g it applies to
    for s in chosen:
        sigmas.setdefault((s.dataset, s.meta["source"]), []).append(s.meta["sigma"])
    sources = [f"FedCEO λ/ϑ/I on {dataset}, σ_g {', '.join(sig)}: {source}"
               for (dataset, source), sig in sigmas.items()]
    return build_grid(PAPER, scale, chosen, spec_rounds=SPEC[scale]["rounds"], spec_seeds=SPEC[scale]["seeds"],
                      seeds=seeds, rounds=rounds, settings_pattern=settings_pattern, methods=methods, extra=extra,
                      selection=sources)
