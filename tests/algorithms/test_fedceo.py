"""FedCEO's server stage and round semantics (spec fedceo.md §3, tests R1-R5, R7)."""

from __future__ import annotations

import copy
import io
from dataclasses import replace

import pytest
import torch
from torch import nn

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.client.program import sgd
from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.fedceo import FedCEO
from dpfl.algorithms.server.t_tsvd import fold, svt, threshold
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs
from dpfl.experiment.federated_run import FederatedRun
from dpfl.privacy.budgets import ClientBudget
from untimed import untimed

from .federations import tiny_federation


def toy(n_clients=6, n=40, seed=0):
    return tiny_federation(n_clients, n, features=12, client_test=10, test=100, seed=seed)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))


def algorithm(aggregator, noise=0.5, k=3, selection=None):
    local = sgd(0.1, steps=3, momentum=0.5)
    return Algorithm("fedceo" if isinstance(aggregator, FedCEO) else "udp_fedavg", local,
                     selection or Selection("fixed", k=k), ClippedNoisyUpdate(1.0, noise, cohort=k), aggregator)


def run(aggregator, rounds=6, data=None, **kw):  # noqa: D103
    return FederatedRun(data or toy(), model(), algorithm(aggregator, **kw), rounds=rounds, batch_sizes=8,
                        budgets=ClientBudget(float("inf"), 1e-5), seed=4)


def _strip(history):
    return [{k: v for k, v in row.items() if k != "weights"} for row in untimed(history)]


def stacked(k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"0.weight": torch.randn(k, 8, 12, generator=g), "0.bias": torch.randn(k, 8, generator=g),
            "2.weight": torch.randn(k, 3, 8, generator=g)}


def view(clients):
    k = len(clients)
    return ServerView(torch.as_tensor(clients), torch.full((k,), 10), torch.ones(k, dtype=torch.int64),
                      torch.full((k,), float("inf"), dtype=torch.float64), torch.zeros(k, dtype=torch.float64),
                      float(k))


def test_r1_fedceo_without_a_smoothing_round_is_exactly_udp_fedavg():
    fedceo = run(FedCEO(lam=1.0, theta=1.0, interval=100)).run()
    udp = run(FedAvg("uniform")).run()
    assert _strip(fedceo.history) == _strip(udp.history)
    for n in udp.params:
        assert torch.equal(fedceo.params[n], udp.params[n])


def test_r1_vanishing_threshold_without_personalisation_matches_udp_fedavg_to_float_tolerance():
    fedceo = run(FedCEO(lam=1e30, interval=2, personalize=False)).run()
    udp = run(FedAvg("uniform")).run()
    for n in udp.params:
        torch.testing.assert_close(fedceo.params[n], udp.params[n], rtol=1e-5, atol=1e-6)


def step(agg, state, g, uploads, clients, round_, starts=None):
    """One server round of `agg` from `state`, everyone's start `starts` (None: the global model)."""
    return agg.update(state, g, uploads, RoundInputs(view(clients), 0, round_, starts=starts))


# atol: the float32 models cast back from a float64 prox (1e-6), or a float32 FFT round trip over the 4 clients and
# its SVT (a few float32 ulps of the O(1) entries: measured 1.4e-6; 1e-5)
@pytest.mark.parametrize("prox_dtype, atol", [("float64", 1e-6), ("float32", 1e-5)])
def test_r2_zero_threshold_keeps_each_upload_and_the_next_round_starts_from_it(prox_dtype, atol):
    agg = FedCEO(lam=1e30, interval=2, prox_dtype=prox_dtype)
    g = {n: t[0] for n, t in stacked().items()}
    uploads = stacked(seed=1)
    clients = [3, 0, 5, 1]
    out = step(agg, agg.init(g), g, uploads, clients, round_=1)  # t = 2: smoothing
    new = out.params
    for n in g:
        torch.testing.assert_close(new[n], g[n] + uploads[n].mean(0), rtol=0, atol=atol)  # FedAvg mean
    starts, state = agg.start_points(out.state, new, [5, 2], round_=2)
    assert state is out.state  # handing out start points changes nothing
    for n in g:
        torch.testing.assert_close(starts[n][0], g[n] + uploads[n][2], rtol=0, atol=atol)  # its own upload
        assert torch.equal(starts[n][1], new[n])  # no personal model: w_g


def test_r3_personal_state_is_written_overwritten_kept_and_used_only_right_after_a_smoothing():
    agg = FedCEO(lam=0.5, theta=1.1, interval=2)
    g = {n: t[0] for n, t in stacked().items()}
    state = agg.init(g)
    assert agg.start_points(state, g, [0, 1], round_=0)[0] is None  # round 1: nothing stored
    state = step(agg, state, g, stacked(3, seed=1), [0, 1, 2], round_=1).state  # smoothing 1 (t = 2)
    first = {c: {n: t.clone() for n, t in state["personal"][c].items()} for c in (0, 1, 2)}
    assert agg.start_points(state, g, [0, 1], round_=3)[0] is None  # t = 4 does not follow a smoothing
    plain = step(agg, state, g, stacked(3, seed=2), [0, 1, 2], round_=2)  # t = 3: plain mean, no writes
    assert plain.state is state and plain.metrics == {}
    assert all(torch.equal(state["personal"][0][n], first[0][n]) for n in g)
    state = step(agg, state, g, stacked(2, seed=3), [2, 4], round_=3).state  # smoothing 2 (t = 4) overwrites 2, adds 4
    assert set(state["personal"]) == {0, 1, 2, 4}
    assert state["personal_round"] == {0: 1, 1: 1, 2: 3, 4: 3}
    assert not torch.equal(state["personal"][2]["0.weight"], first[2]["0.weight"])
    assert torch.equal(state["personal"][0]["0.weight"], first[0]["0.weight"])  # older entry persists
    starts, _ = agg.start_points(state, g, [0, 4, 5], round_=4)  # t = 5 follows a smoothing
    assert torch.equal(starts["0.weight"][0], first[0]["0.weight"])  # "any": the stale model is used
    assert torch.equal(starts["0.weight"][1], state["personal"][4]["0.weight"])
    assert torch.equal(starts["0.weight"][2], g["0.weight"])  # no model: w_g
    starts, _ = replace(agg, personal_staleness="last").start_points(state, g, [0, 4], round_=4)
    assert torch.equal(starts["0.weight"][0], g["0.weight"])  # stale: w_g under "last"
    assert torch.equal(starts["0.weight"][1], state["personal"][4]["0.weight"])
    assert FedCEO(lam=0.5, interval=2, personalize=False).start_points(state, g, [0], round_=2)[0] is None
    assert agg.personal_models(state, g) == state["personal"]


def test_r4_global_model_at_a_smoothing_round_is_svt_of_the_mean_at_thr_over_k():
    agg = FedCEO(lam=0.2, theta=1.5, interval=3)
    g = {n: torch.zeros_like(t[0]) for n, t in stacked().items()}
    uploads = stacked(5, seed=7)
    out = step(agg, agg.init(g), g, uploads, [0, 1, 2, 3, 4], round_=5)  # t = 6: smoothing j = 2
    new = out.params
    thr = threshold(2, 0.2, 1.5)
    assert out.metrics["threshold"] == pytest.approx(thr) and out.metrics["smoothing"] == 2
    some_zeroed = False
    for n, u in uploads.items():
        mean = fold(u.mean(0, keepdim=True))[:, :, 0].double()
        expect = svt(mean, thr / 5).float()
        torch.testing.assert_close(fold(new[n].unsqueeze(0))[:, :, 0], expect, rtol=0, atol=1e-5)
        s = torch.linalg.svdvals(mean)
        some_zeroed |= bool((s < thr / 5).any() and (s > thr / 5).any())
    assert some_zeroed  # the threshold actually bites (otherwise the test could not tell SVT from the mean)


def test_r5_last_n_leaves_other_tensors_at_the_fedavg_mean_for_everyone():
    agg = FedCEO(lam=0.05, interval=1, layers=1)
    assert agg.smoothed_names(["0.weight", "0.bias", "2.weight"]) == ["2.weight"]
    g = {n: torch.zeros_like(t[0]) for n, t in stacked().items()}
    uploads = stacked(4, seed=2)
    out = step(agg, agg.init(g), g, uploads, [0, 1, 2, 3], round_=0)
    new, personal = out.params, agg.personal_models(out.state, g)
    for n in ("0.weight", "0.bias"):
        torch.testing.assert_close(new[n], uploads[n].mean(0), rtol=0, atol=1e-6)
        for c in range(4):
            torch.testing.assert_close(personal[c][n], uploads[n].mean(0), rtol=0, atol=1e-6)
    assert not torch.allclose(personal[0]["2.weight"], uploads["2.weight"].mean(0))
    assert set(out.metrics["zeroed_fraction"]) == {"2.weight"}


def test_update_depends_only_on_the_state_passed_in_and_leaves_it_unchanged():
    """Replaying round 2 (a smoothing from personal starts) from its state after round 3 ran gives round 2 again,
    and neither `update` nor `start_points` writes to the state they are given."""
    agg = FedCEO(lam=0.5, theta=1.1, interval=1)
    g = {n: t[0] for n, t in stacked().items()}
    first = step(agg, agg.init(g), g, stacked(3, seed=1), [0, 1, 2], round_=0)

    def round_2(state):
        starts, state = agg.start_points(state, first.params, [1, 2, 4], round_=1)
        return step(agg, state, first.params, stacked(3, seed=2), [1, 2, 4], round_=1, starts=starts)

    before = copy.deepcopy(first.state)
    second = round_2(first.state)
    assert agg.personal_models(first.state, g).keys() == {0, 1, 2}  # the state passed in did not gain client 4
    third = step(agg, second.state, second.params, stacked(2, seed=3), [0, 1], round_=2)
    again = round_2(first.state)
    assert _same(first.state, before) and not _same(second.state, third.state)
    assert _same(again.params, second.params) and _same(again.state, second.state)
    assert untimed(again.metrics) == untimed(second.metrics)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_r7_same_seed_same_logs_and_smoothing_diagnostics_and_personal_accuracy_are_logged():
    a = run(FedCEO(lam=0.5, theta=1.05, interval=2)).run()
    b = run(FedCEO(lam=0.5, theta=1.05, interval=2)).run()
    assert _strip(a.history) == _strip(b.history)
    smoothing_rows = [row for row in a.history if "threshold" in row]
    assert [row["round"] for row in smoothing_rows] == [2, 4, 6]
    assert [row["threshold"] for row in smoothing_rows] == pytest.approx([1.05**j / 1.0 for j in (1, 2, 3)])
    for row in smoothing_rows:
        assert 0.0 <= min(row["zeroed_fraction"].values()) <= 1.0 and row["prox_seconds"] >= 0
        assert 0.0 <= row["acc_personal"] <= 1.0 and row["acc_personal_clients"] >= 3
    assert "acc_personal" not in a.history[0]


def test_personal_start_changes_the_next_round_and_checkpoints_resume_exactly():
    personal = run(FedCEO(lam=0.5, theta=1.05, interval=2)).run()
    shared = run(FedCEO(lam=0.5, theta=1.05, interval=2, personalize=False)).run()
    assert personal.history[1]["test_accuracy"] == shared.history[1]["test_accuracy"]  # identical up to round 2
    assert not torch.equal(personal.params["0.weight"], shared.params["0.weight"])
    states = []
    full = run(FedCEO(lam=0.5, theta=1.05, interval=2)).run(on_checkpoint=states.append)
    resumed_from = next(s for s in states if s.round == 3)  # after smoothing 1 + one round
    again = run(FedCEO(lam=0.5, theta=1.05, interval=2)).run(state=resumed_from)
    assert _strip(again.history) == _strip(full.history)
    for n in full.params:
        assert torch.equal(again.params[n], full.params[n])


def test_invalid_settings_are_refused():
    for kw in (dict(lam=0.0), dict(lam=1.0, theta=0.9), dict(lam=1.0, interval=0), dict(lam=1.0, layers=0),
               dict(lam=1.0, personal_staleness="old"), dict(lam=1.0, prox_dtype="float16")):
        with pytest.raises(ValueError):
            FedCEO(**kw)


def test_config_builds_fedceo_with_both_mechanisms():
    from dpfl.experiment.build import build_algorithm
    from dpfl.experiment.config import ConfigError, load_config

    base = ["algorithm.name=fedceo", "algorithm.params={lam: 0.5, theta: 1.04, interval: 2}",
            "privacy.budgets=.inf", "privacy.noise_multiplier=1.0"]
    for mech in ("dpsgd", "udp"):
        udp = ["privacy.unit=client", "privacy.sampling=null"] if mech == "udp" else []
        cfg = load_config("configs/demo.yaml", [*base, f"privacy.mechanism={mech}", *udp])
        alg = build_algorithm(cfg)
        assert isinstance(alg.aggregator, FedCEO) and alg.aggregator.interval == 2
        assert alg.unit == ("sample" if mech == "dpsgd" else "client")
    with pytest.raises(ConfigError, match="lam"):
        load_config("configs/demo.yaml", ["algorithm.name=fedceo", "algorithm.params={theta: 1.04}"])
    with pytest.raises(ConfigError, match="layers"):
        load_config("configs/demo.yaml", [*base, "algorithm.params={lam: 0.5, layers: 0}"])


def test_fedceo_checkpoint_state_round_trips():
    agg = FedCEO(lam=0.5, interval=1)
    g = {n: t[0] for n, t in stacked().items()}
    state = step(agg, agg.init(g), g, stacked(2), [1, 3], round_=0).state
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)  # as a checkpoint is read back
    other = FedCEO(lam=0.5, interval=1)
    assert loaded["personal_round"] == {1: 0, 3: 0}
    assert all(torch.equal(other.personal_models(loaded, g)[3][n], state["personal"][3][n]) for n in g)
    starts, _ = other.start_points(loaded, g, [3, 0], round_=1)
    assert torch.equal(starts["0.weight"][0], state["personal"][3]["0.weight"])
    assert other.init(g) == {"personal": {}, "personal_round": {}} and other.personal_models(other.init(g), g) == {}


def test_m1_udp_noise_is_split_over_the_cohort_and_clipping_holds():
    up = ClippedNoisyUpdate(clip=1.0, noise_multiplier=2.0, cohort=4)
    deltas = {"w": torch.randn(3, 50_000) * 10}
    quiet = ClippedNoisyUpdate(clip=1.0, noise_multiplier=0.0, cohort=4).apply(deltas, [0, 1, 2], 0, 0)
    assert (quiet["w"].norm(dim=1) <= 1.0 * (1 + 1e-6)).all()
    noisy = up.apply(deltas, [0, 1, 2], 0, 0)
    std = (noisy["w"] - quiet["w"]).std().item()
    assert std == pytest.approx(2.0 / 2, rel=0.01)  # σC/√K; 150,000 draws: the std's rel. error is ~0.2%
    assert up.event(0, 0, 10).noise_multiplier == pytest.approx(1.0)


def test_m1_paper_eta_scaling_scales_the_whole_privatised_update_and_not_the_guarantee():
    deltas = {"w": torch.randn(3, 1000) * 10, "b": torch.randn(3, 4)}
    plain = ClippedNoisyUpdate(clip=1.0, noise_multiplier=2.0, cohort=4)
    scaled = ClippedNoisyUpdate(clip=1.0, noise_multiplier=2.0, cohort=4, upload_scale=0.1)
    a, b = plain.apply(deltas, [0, 1, 2], 5, 1), scaled.apply(deltas, [0, 1, 2], 5, 1)
    assert all(torch.allclose(b[k], 0.1 * a[k]) for k in deltas)  # w' - w_0 = η(Δ̃ + ξ), same draw of ξ
    assert scaled.event(0, 0, 10) == plain.event(0, 0, 10)
    with pytest.raises(ValueError, match="upload_scale must be > 0"):
        ClippedNoisyUpdate(1.0, 1.0, upload_scale=0.0)


def test_paper_eta_scaling_from_a_config_uses_the_learning_rate_and_only_for_udp():
    from dpfl.experiment.build import build_algorithm
    from dpfl.experiment.config import ConfigError, load_config

    cfg = load_config("configs/digits_udp.yaml", ["privacy.paper_eta_scaling=true", "training.optimizer.lr=0.05"])
    assert build_algorithm(cfg).upload.upload_scale == 0.05
    assert build_algorithm(load_config("configs/digits_udp.yaml")).upload.upload_scale == 1.0
    with pytest.raises(ConfigError, match="paper_eta_scaling: applies to mechanism udp only"):
        build_algorithm(load_config("configs/demo.yaml", ["privacy.paper_eta_scaling=true"]))


def test_p1_p2_fedceo_and_udp_fedavg_report_the_same_guarantees_and_per_upload_is_the_weaker_view():
    poisson = Selection("poisson", rate=0.5)  # add/remove in both views, so the epsilons are comparable
    reports = [run(agg, noise=3.0, selection=poisson).run().privacy.to_dict()
               for agg in (FedCEO(lam=0.5, interval=2), FedAvg("uniform"))]
    for key in ("clients", "aggregate_view", "unit", "observer"):
        assert reports[0][key] == reports[1][key]
    spent = [c["epsilon_spent"] for c in reports[0]["clients"]]
    agg = reports[0]["aggregate_view"]
    assert agg["rounds"] == 6 and agg["noise_multiplier"] == 3.0 and agg["sample_rate"] == pytest.approx(0.5)
    assert max(spent) > agg["epsilon"] > 0  # one upload at σ/√K without amplification is far weaker
    assert "NOT the run's server" in agg["valid_for"]
    assert agg["relation"] == "add_remove"
    longer = run(FedAvg("uniform"), noise=3.0, rounds=8, selection=poisson).run().privacy.extra["aggregate_view"]
    noisier = run(FedAvg("uniform"), noise=4.0, selection=poisson).run().privacy.extra["aggregate_view"]
    longer, noisier = longer["epsilon"], noisier["epsilon"]
    assert noisier < agg["epsilon"] < longer
    fixed = run(FedAvg("uniform"), noise=3.0).run().privacy.extra["aggregate_view"]
    assert fixed["relation"] == "replace_one"  # the exact event of the fixed-size sampling that ran
    assert "population" not in fixed  # nobody retired: the planned population is the one that ran


def test_the_aggregate_view_after_retirements_is_charged_at_the_smaller_population():
    """Fixed K = 3: once two of six clients retire, the others are drawn at 3/4, not 3/6; the view must not be
    computed at the planned rate (it would understate epsilon)."""
    from dpfl.privacy.accountant import guarantee

    budgets = [ClientBudget(float("inf"), 1e-5)] * 4 + [ClientBudget(30.0, 1e-5)] * 2  # 30: one participation
    result = FederatedRun(toy(), model(), algorithm(FedAvg("uniform")), rounds=6, batch_sizes=8, budgets=budgets,
                          seed=4).run()
    assert not {4, 5} & {i for row in result.history[2:] for i in row["selected"]}  # retired after their first rounds
    view = result.privacy.extra["aggregate_view"]
    up, sel = ClippedNoisyUpdate(1.0, 0.5, cohort=3), Selection("fixed", k=3)
    at = {n: guarantee(up.aggregate_event(sel, n, 6), 1e-5, "rdp", unit="client").epsilon for n in (4, 6)}
    assert view["sample_rate"] == 0.75 and view["epsilon"] == pytest.approx(at[4], rel=1e-12)
    assert view["epsilon"] > at[6]  # the planned population's value is smaller: it would understate the cost
    assert view["population"].startswith("2 of 6 clients retired")


def test_r6_poisson_rounds_of_zero_or_one_client_are_handled():
    sizes = set()
    result = FederatedRun(toy(), model(),
                          algorithm(FedCEO(lam=0.5, interval=1), selection=Selection("poisson", rate=0.2)),
                          rounds=12, batch_sizes=8, budgets=ClientBudget(float("inf"), 1e-5), seed=4).run()
    for row in result.history:
        sizes.add(len(row["selected"]))
        assert ("threshold" in row) == (len(row["selected"]) > 0)  # nobody drawn: no smoothing, no update
    assert {0, 1} <= sizes and max(sizes) > 1
    assert all(torch.isfinite(t).all() for t in result.params.values())


def test_p4_dpsgd_mode_reports_per_participation_and_composed_epsilons_and_no_user_level_guarantee():
    from dpfl.algorithms.client.program import dpsgd
    from dpfl.algorithms.client.upload import FullUpdate

    alg = Algorithm("fedceo", dpsgd(0.1, 1.0, steps=3, momentum=0.5), Selection("fixed", k=3), FullUpdate(),
                    FedCEO(lam=0.5, interval=2))
    privacy = FederatedRun(toy(), model(), alg, rounds=4, batch_sizes=8, budgets=ClientBudget(float("inf"), 1e-5),
                           noise_multipliers=1.2, seed=4).run().privacy.to_dict()
    spent = [c["epsilon_spent"] for c in privacy["clients"]]
    assert privacy["user_level"] is None and "sample-level" in privacy["user_level_note"]
    assert (privacy["eps_total_max"] == max(spent)
            and privacy["eps_total_mean"] == pytest.approx(sum(spent) / len(spent)))
    assert 0 < privacy["eps_per_participation"] < privacy["eps_total_max"]  # composition over participations
    assert "aggregate_view" not in privacy  # no client-level view for a sample-level mechanism


def test_per_upload_amplification_charges_everyone_every_round_and_is_labelled_an_assumption():
    """Spec §7 Option: each round every client pays one upload at σ/√K amplified by q (not its participations)."""
    from dp_accounting import SelfComposedDpEvent

    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import ConfigError, load_config
    from dpfl.privacy.accountant import epsilon
    from dpfl.privacy.events import sampled_gaussian_event

    poisson = ["training.selection={kind: poisson, rate: 0.25}", "training.rounds=4", "privacy.budgets=.inf"]
    amplified = build_run(load_config("configs/digits_udp.yaml", [*poisson, "privacy.per_upload_amplification=true"]))
    result = amplified.run()
    upload = amplified.algorithm.upload
    per_round = sampled_gaussian_event(upload.upload_multiplier, sampling="poisson", sample_rate=0.25)
    expected = epsilon(SelfComposedDpEvent(per_round, 4), 1e-5)
    assert all(e == pytest.approx(expected, rel=1e-9) for e in result.spent().values())  # participants or not
    assert "ASSUMED" in result.privacy.per_upload_amplification
    assert "amplified by client sampling under an ASSUMPTION" in result.privacy.guarantee.source
    from dpfl.results.report import _privacy_lines

    assert any("Per-upload amplification (the epsilons below depend on it):** ASSUMED" in line
               for line in _privacy_lines(result.privacy.to_dict(), result.history, complete=True))
    plain = build_run(load_config("configs/digits_udp.yaml", poisson)).run()
    assert "ASSUMPTION" not in plain.privacy.guarantee.source
    took_part = [i for i, e in plain.spent().items() if e > 0]
    assert took_part and all(plain.spent()[i] > expected for i in took_part)  # no amplification: weaker
    assert "per_upload_amplification" not in plain.privacy.key_order
    with pytest.raises(ConfigError, match="per_upload_amplification: needs Poisson client selection"):
        build_run(load_config("configs/digits_udp.yaml", ["privacy.per_upload_amplification=true"]))
