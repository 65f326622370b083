"""The Robust-HDP thesis comparison (ICML 2024 / thesis ch. 3; spec heterogeneous_dp.md §7.3, §6 and §7.4).

Methods (spec §7.3 "Seeds and methods"):

| method | dpfl algorithm | |
|---|---|---|
| robust_hdp | robust_hdp (p' = 200,000: one block for cnn_rhdp; constant PCP mu, as the thesis code) | |
| weiavg | weiavg | |
| pfa | pfa, split gmm, k = 1 (the RHDP code's PFA baseline) | |
| fedavg | dp_fedavg_local, uniform weights (the thesis's DPFedAvg) | |
| min_eps | min_eps, observed (everyone at the smallest reported epsilon) | |
| oracle | oracle (weights from the true noise variance) | privileged reference |
| np_fedavg | fedavg (no clipping, no noise) | non-private reference |

Settings: `full` is the main grid {dataset} x Dist1..Dist9 with the code's fixed 20-client lists
(`<ds>-Dist1` .. `<ds>-Dist9`), plus the falsified-budget setting `<ds>-Dist5-misreport` (client 0
reports 10x its epsilon; weiavg, pfa, robust_hdp, fedavg, oracle), whose honest counterpart is the main
`<ds>-Dist5` setting: the same data, budgets and seeds, so those runs are not repeated. At `full` scale also
`<ds>-Dist5-misreport-c10` (weiavg only; not in the spec): client 10, whose true epsilon (0.95), batch size (32)
and IID data share are those of client 0, tells the same lie, to test whether WeiAvg's accuracy gain under
client 0's lie at this scale (docs/papers/robust_hdp_falsified.md) comes from client 0's data or from the lie
itself. Two controls split that lie in its two effects (`CONTROLS`, weiavg only, full scale, not in the spec):
`<ds>-Dist5-noise-only` is honest with every Dist5 budget scaled by 0.733, so WeiAvg keeps its honest weights
(proportional to epsilon,
unchanged by a common factor) while every client's noise grows until the round-1 noise statistic is the lie's
(1.74x the honest one); `<ds>-Dist5-weights-only` has client 10 lie with every budget scaled by 1.372, so WeiAvg
gives client 10 the lie's 36.9% weight at the honest round-1 noise statistic. The factors were found by bisection
on the analytic statistic (tests/reproduce/test_robust_hdp_controls.py checks them). `ci` is spec
§7.4: 6 clients, Dist5[0:6], rhdp20[0:6] batch sizes, 300 examples per client, 3 rounds, all methods
and the falsified-budget scenario. CIFAR-10 is not in the grid: the spec's CIFAR/ResNet-18 study is
replaced by the weight-precision study on Fashion-MNIST (§7.3.4), not part of this comparison.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpfl.privacy.budget_distributions import RHDP_EPS20
from dpfl.reproduce.jobs import Grid, GridError, Method, Setting, build_grid, config_dir, dataset_short

__all__ = ["CONTROLS", "DISTS", "LIES", "MISREPORT", "MISREPORT_C10", "MISREPORT_C10_METHODS", "MISREPORT_METHODS",
           "SPEC", "grid", "methods", "settings"]

PAPER = "robust-hdp"
DISTS = tuple(f"Dist{i}" for i in range(1, 10))
SPEC = {"full": {"rounds": 200, "seeds": 3}, "ci": {"rounds": 3, "seeds": 1}}
MISREPORT = "{client: 0, factor: 10}"  # spec §6 / §9.14: client 0 (true epsilon 0.95 in Dist5) reports 10x
MISREPORT_DIST = "Dist5"
MISREPORT_METHODS = ("weiavg", "pfa", "robust_hdp", "fedavg", "oracle")
MISREPORT_C10 = "{client: 10, factor: 10}"  # client 10: client 0's epsilon (0.95) and batch size (32) in Dist5/rhdp20
MISREPORT_C10_METHODS = ("weiavg",)
# the falsified-budget settings: name suffix, the lie, its methods, who lies, the scales that have the liar
LIES = (("misreport", MISREPORT, MISREPORT_METHODS, "client 0", ("ci", "full")),
        ("misreport-c10", MISREPORT_C10, MISREPORT_C10_METHODS, "client 10 (client 0's epsilon and batch size)",
         ("full",)))  # the ci setting has 6 clients: no client 10
# controls of client 10's lie (full scale, weiavg): name suffix, factor on every Dist5 budget, the lie or None, what
# it keeps of the lie; the factors equate WeiAvg's round-1 noise statistic to the lie's / the honest one (docstring)
CONTROLS = (("noise-only", 0.733, None, "the honest weights with the lie's noise (round-1 noise statistic 1.74x)"),
            ("weights-only", 1.372, MISREPORT_C10, "the lie's weights (36.9% on client 10) with the honest noise"))

ORACLE = "privileged reference (reads the true noise)"
NON_PRIVATE = "non-private reference (no DP)"


def methods() -> tuple[Method, ...]:
    """The thesis's seven methods."""
    return (
        Method("robust_hdp", "robust_hdp",  # constant mu, as the thesis code ran its PCP (spec §4.4)
               ("algorithm={name: robust_hdp, params: {p_prime: 200000, mu_growth: 1.0}}",)),
        Method("weiavg", "weiavg", ("algorithm={name: weiavg}",)),
        Method("pfa", "pfa", ("algorithm={name: pfa, params: {split: gmm, k: 1}}",)),
        Method("fedavg", "dp_fedavg_local", ("algorithm={name: dp_fedavg_local, params: {weighting: uniform}}",)),
        Method("min_eps", "min_eps", ("algorithm={name: min_eps, params: {epsilon: observed}}",)),
        Method("oracle", "oracle", ("algorithm={name: oracle}",), ORACLE),
        Method("np_fedavg", "fedavg", ("algorithm={name: fedavg}", "privacy={}"), NON_PRIVATE),
    )


def settings(scale: str, datasets: Sequence[str] = ("fashion_mnist",)) -> list[Setting]:
    """The main settings (one per budget distribution) and the falsified-budget setting, per dataset."""
    if scale not in SPEC:
        raise GridError(f"--scale must be 'ci' or 'full', got {scale!r}")
    all_methods = methods()
    out = []
    for dataset in datasets:
        short = dataset_short(dataset, scale, "Robust-HDP")
        if scale == "ci":
            base = config_dir() / "rhdp" / "ci_fmnist.yaml"
            what = f"{dataset}, cnn_rhdp, 6 clients x 300 examples (80/20 own test split), budgets Dist5[0:6] " \
                   "(fixed list), batch sizes rhdp20[0:6]"
            dist_overrides = {MISREPORT_DIST: ()}  # the base config holds the Dist5[0:6] list
        else:
            base = config_dir() / "rhdp" / f"{short}.yaml"
            what = f"{dataset}, cnn_rhdp, 20 clients x 3,000 examples (80/20 own test split), batch sizes rhdp20"
            dist_overrides = {d: (f"privacy.budgets={{distribution: rhdp20, dist: {d}}}",) for d in DISTS}
        for dist, overrides in dist_overrides.items():
            out.append(Setting(f"{short}-{dist}", base, overrides, all_methods, dataset,
                               describe=f"{what}, budgets {dist}" if scale == "full" else what,
                               meta={"dist": dist, "kind": "main"}))
        honest = f"{short}-{MISREPORT_DIST}"
        for suffix, lie, names, who, scales in LIES:
            if scale in scales:
                out.append(Setting(
                    f"{honest}-{suffix}", base, (*dist_overrides[MISREPORT_DIST], f"privacy.misreport={lie}"),
                    tuple(m for m in all_methods if m.name in names), dataset,
                    describe=f"{what}; {who} calibrates to its true epsilon but reports 10x it",
                    meta={"dist": MISREPORT_DIST, "kind": "misreport", "honest": honest}))
        if scale == "full":
            weiavg = tuple(m for m in all_methods if m.name == "weiavg")
            for suffix, factor, lie, keeps in CONTROLS:
                budgets = ", ".join(f"{e * factor:.6g}" for e in RHDP_EPS20[MISREPORT_DIST])
                lie_override = (f"privacy.misreport={lie}",) if lie else ()
                out.append(Setting(
                    f"{honest}-{suffix}", base, (f"privacy.budgets=[{budgets}]", *lie_override), weiavg, dataset,
                    describe=f"{what}; every {MISREPORT_DIST} budget x {factor}"
                             + ("; client 10 reports 10x its epsilon" if lie else "") + f": {keeps}",
                    meta={"dist": MISREPORT_DIST, "kind": "control", "honest": honest, "factor": f"{factor}"}))
    return out


def grid(scale: str, *, datasets: Sequence[str] = ("fashion_mnist",), seeds: int | None = None,
         rounds: int | None = None, settings_pattern: str | None = None, methods: Sequence[str] | None = None,
         extra: Sequence[str] = ()) -> Grid:
    """The jobs of `dpfl reproduce robust-hdp` (see the module docstring)."""
    return build_grid(PAPER, scale, settings(scale, datasets), spec_rounds=SPEC[scale]["rounds"],
                      spec_seeds=SPEC[scale]["seeds"], seeds=seeds, rounds=rounds, settings_pattern=settings_pattern,
                      methods=methods, extra=extra)
