"""Client-level adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021) in central DP-FedAvg and its
distributed version under secure aggregation: Theorem 1's update noise, the clip's geometric step, the noise it
adds, the secure count, the config's refusals, and runs (bit-identical without it, resumable with it)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.client.program import sgd
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.secure.aggregator import DistributedDPFedAvg, SecureAggregation
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.central_dp_fedavg import CentralDPFedAvg
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs, ServerStep
from dpfl.engine import params as P
from dpfl.experiment.config import ConfigError, config_to_yaml, load_config, validate_config
from dpfl.experiment.federated_run import FederatedRun
from dpfl.experiment.run_directory import execute
from dpfl.privacy.adaptive_clipping import AdaptiveClipping, update_noise_multiplier
from dpfl.privacy.budgets import ClientBudget
from dpfl.seeding import Purpose, numpy_generator, torch_generator
from stopped_run import stop_in_round
from untimed import untimed

from tests.experiment.test_federated_run import linear_model, toy_federation

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "mechanisms" / "adaptive_central.yaml"
KEY = "privacy.adaptive_clipping.count_noise"


def _with_norms(norms, dim=6, seed=0):
    """Updates `[K, dim]` in random directions with exactly the given norms."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(norms), dim, generator=g, dtype=torch.float64)
    x = x / x.norm(dim=1, keepdim=True) * torch.tensor(norms, dtype=torch.float64)[:, None]
    return {"w": x.to(torch.float32)}


def _zeros(dim=6):
    return {"w": torch.zeros(dim)}


def _trajectory(step, norms_per_round, seed=0, expected=None):
    """Run `step` over rounds whose update norms are given; the clips it used and its fractions."""
    state, clips, fractions = step.init(_zeros()), [], []
    for r, norms in enumerate(norms_per_round):
        view = ServerView.simple([1] * len(norms), expected_clients=expected or float(len(norms)))
        out = step.update(state, _zeros(), _with_norms(norms, seed=r), RoundInputs(view, seed, r))
        clips.append(out.metrics["adaptive_clip"])
        fractions.append(out.metrics["adaptive_clip_fraction"])
        assert step.clip_of(out.state) == pytest.approx(
            clips[-1] * math.exp(-step.adaptive_clipping.learning_rate
                                 * (fractions[-1] - step.adaptive_clipping.target_quantile)), rel=1e-12)
        state = out.state
    return clips, fractions, state


# ---- Theorem 1 -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("z,sigma_b,want", [
    (1.0, 1.0, 1 / math.sqrt(1 - 1 / 4)),  # z^-2 - (2 sigma_b)^-2 = 3/4
    (0.5, 5.0, 1 / math.sqrt(4 - 1 / 100)),
    (2.0, 1.25, 1 / math.sqrt(1 / 4 - 1 / 6.25)),  # 0.25 - 0.16 = 0.09: z_Delta = 1/0.3
    (0.0, 1.0, 0.0),  # a non-private run stays non-private
])
def test_update_noise_multiplier_is_theorem_1s_closed_form(z, sigma_b, want):
    got = update_noise_multiplier(z, sigma_b)
    assert got == pytest.approx(want, rel=1e-12)
    if z > 0:  # the count and the sum compose to exactly z: z^-2 = z_Delta^-2 + (2 sigma_b)^-2
        assert got ** -2 + (2 * sigma_b) ** -2 == pytest.approx(z ** -2, rel=1e-12)
        assert got > z


@pytest.mark.parametrize("sigma_b", [0.5, 0.4999, 0.1])
def test_a_count_noise_that_leaves_the_sum_no_budget_is_refused(sigma_b):
    with pytest.raises(ValueError, match="no budget"):
        update_noise_multiplier(1.0, sigma_b)  # 2 sigma_b <= z
    ac = AdaptiveClipping(count_noise=sigma_b)
    with pytest.raises(ValueError, match=KEY):
        CentralDPFedAvg(0.1, 1.0, adaptive_clipping=ac)  # the noise is known: refused when built
    uncalibrated = DistributedDPFedAvg(0.1, None, adaptive_clipping=ac)  # not known yet: built
    with pytest.raises(ValueError, match=KEY) as info:
        uncalibrated.with_noise(1.0)  # ... and refused when the run calibrates it
    assert len(str(info.value).splitlines()) == 1


def test_the_step_charges_z_and_noises_the_sum_with_z_delta():
    ac = AdaptiveClipping(count_noise=2.0)
    step = CentralDPFedAvg(0.1, None, adaptive_clipping=ac).with_noise(1.5)
    assert step.noise == 1.5  # what the accountant charges and calibration sets: unchanged
    assert step.update_noise_multiplier == pytest.approx(update_noise_multiplier(1.5, 2.0))
    assert step.adaptive_clipping is ac and ServerStep.adaptive_clipping is None
    assert CentralDPFedAvg(0.1, 1.5).update_noise_multiplier == 1.5 and CentralDPFedAvg(0.1, 1.5).init({}) is None
    with pytest.raises(ValueError, match="count noise sigma_b resolved"):
        CentralDPFedAvg(0.1, 1.0, adaptive_clipping=AdaptiveClipping())


# ---- the clip's trajectory ---------------------------------------------------------------------------------------
def test_the_clip_follows_the_geometric_recurrence_on_fixed_norms():
    # count noise 1e-12 (switched off for all purposes): the count is exact. Norms 0.5, 1, 2, 4 and gamma 0.5:
    # from C = 0.1 nothing is unclipped (b = 0) and C grows by e^{0.1} a round until it passes 0.5, ...; at C = 1
    # exactly half the norms are <= C and the clip stays.
    gamma, eta, m = 0.5, 0.2, 4
    ac = AdaptiveClipping(gamma, eta, initial_clip=0.1, count_noise=1e-12)
    norms = [0.5, 1.0, 2.0, 4.0]
    clips, fractions, _ = _trajectory(CentralDPFedAvg(0.1, 0.0, adaptive_clipping=ac), [norms] * 40)
    want, c = [], 0.1
    for _ in range(40):  # the recurrence, computed here (4 drawn of 4 expected: the plain fraction)
        want.append(c)
        b = sum(n <= c for n in norms) / m
        c = c * math.exp(-eta * (b - gamma))
    assert clips == pytest.approx(want, rel=1e-9)
    assert clips[1] == pytest.approx(0.1 * math.exp(0.1), rel=1e-12)  # b = 0: one step up by e^{eta gamma}
    assert fractions[0] == pytest.approx(0.0, abs=1e-11)
    # past 0.5 one norm in four is unclipped (steps of e^{0.05}); at the first C >= 1, two are and C stays there
    assert fractions[-1] == pytest.approx(0.5, abs=1e-11) and 1.0 <= clips[-1] < math.exp(0.05)
    settled = CentralDPFedAvg(0.1, 0.0, adaptive_clipping=AdaptiveClipping(gamma, eta, 1.0, 1e-12))
    assert _trajectory(settled, [norms] * 3)[0] == pytest.approx([1.0] * 3, rel=1e-9)  # b = gamma: C stays


@pytest.mark.parametrize("secure", [False, True])
def test_the_noised_count_is_the_seeded_recurrence(secure):
    # sigma_b 1.5 with a fixed seed: the test draws the same count noise (the server's stream, or each client's
    # share sigma_b / sqrt(t) under secure aggregation) and runs the recurrence on the noised fractions itself.
    gamma, eta, sigma_b, z, seed = 0.3, 0.5, 1.5, 1.0, 7
    ac = AdaptiveClipping(gamma, eta, initial_clip=0.8, count_noise=sigma_b)
    step = (DistributedDPFedAvg(0.8, z, adaptive_clipping=ac) if secure
            else CentralDPFedAvg(0.8, z, adaptive_clipping=ac))
    rng = np.random.default_rng(3)
    rounds = [rng.uniform(0.2, 2.0, size=8).tolist() for _ in range(12)]
    clips, fractions, _ = _trajectory(step, rounds, seed=seed, expected=10.0)
    c, t = 0.8, 5  # t = floor(8/2) + 1
    for r, norms in enumerate(rounds):
        assert clips[r] == pytest.approx(c, rel=1e-7)
        assert min(abs(n - c) for n in norms) > 1e-4 * c  # no norm within float32 rounding of the clip
        count = sum(n <= c for n in norms)
        if secure:
            noise = sum(sigma_b / math.sqrt(t) * numpy_generator(seed, Purpose.CLIP_COUNT, r, k).standard_normal()
                        for k in range(8))
        else:
            noise = sigma_b * numpy_generator(seed, Purpose.CLIP_COUNT, r).standard_normal()
        b = (count - 8 / 2 + noise) / 10.0 + 0.5  # centred indicators; m = the EXPECTED cohort, not the 8 drawn
        assert fractions[r] == pytest.approx(b, abs=1e-8)  # secure: fixed-point sums, error <= 8 * 2^-33
        c = c * math.exp(-eta * (b - gamma))


@pytest.mark.parametrize("secure", [False, True])
def test_one_client_more_moves_the_released_count_by_one_half(secure):
    # Theorem 1 charges the count at sensitivity 1/2: adding a client (unclipped or clipped) to the cohort must move
    # the released count by exactly +-1/2 before its noise, though the server divides by the same expected m.
    # (The plain count would move by 1 or 0.) Same seed, same noise: the difference is the indicator's.
    ac = AdaptiveClipping(initial_clip=1.0, count_noise=2.0)
    step = (DistributedDPFedAvg(1.0, 1.0, adaptive_clipping=ac, protocol=SecureAggregation(threshold=4)) if secure
            else CentralDPFedAvg(1.0, 1.0, adaptive_clipping=ac))
    base = [0.3, 2.0, 0.7, 5.0]

    def centred(norms):
        view = ServerView.simple([1] * len(norms), expected_clients=6.0)
        out = step.update({"clip": 1.0}, _zeros(), _with_norms(norms), RoundInputs(view, 9, 3))
        return (out.metrics["adaptive_clip_fraction"] - 0.5) * 6.0

    # secure: the added client (id 4) also adds its own share of the count noise (t = 4 fixed), taken out here
    share = 2.0 / math.sqrt(4) * numpy_generator(9, Purpose.CLIP_COUNT, 3, 4).standard_normal() if secure else 0.0
    for extra, moves in ((0.5, 0.5), (3.0, -0.5)):  # the added client's norm, under and over the clip
        assert centred([*base, extra]) - centred(base) - share == pytest.approx(moves, abs=1e-7)


def test_the_clip_settles_near_the_target_quantile_of_stationary_norms():
    # 100 updates a round, norms uniform on [1, 3]: the gamma-quantile is 1 + 2 gamma. With eta 0.2 and
    # sigma_b = 100/20 = 5 the noised fraction has std 0.05, so C wanders by a few percent around the quantile
    # (Andrew et al. Fig. 1); the mean of the last 100 of 400 rounds is checked to 5%.
    rng = np.random.default_rng(0)
    rounds = [rng.uniform(1.0, 3.0, size=100).tolist() for _ in range(400)]
    for gamma in (0.5, 0.9):
        ac = AdaptiveClipping(gamma, 0.2, initial_clip=0.1, count_noise=5.0)
        clips, _, _ = _trajectory(CentralDPFedAvg(0.1, 1.0, adaptive_clipping=ac), rounds)
        assert np.mean(clips[-100:]) == pytest.approx(1 + 2 * gamma, rel=0.05)


# ---- the noise -------------------------------------------------------------------------------------------------
def test_the_sum_carries_z_delta_times_the_rounds_clip():
    # zero updates, d = 40 000 coordinates: the sample variance has relative std sqrt(2/d) = 0.7%, so +-3% is > 4
    # std. The clip in round 0 is C_0 = 0.25: the sum's std must be z_Delta * C_0 (not z * C_0, not z_Delta * 0.1).
    d, z, sigma_b = 40_000, 1.0, 1.0
    ac = AdaptiveClipping(initial_clip=0.25, count_noise=sigma_b)
    zd = update_noise_multiplier(z, sigma_b)
    view = ServerView.simple([1] * 10, expected_clients=10.0)
    for step in (CentralDPFedAvg(0.25, z, adaptive_clipping=ac),
                 DistributedDPFedAvg(0.25, z, adaptive_clipping=ac, protocol=SecureAggregation(threshold=10))):
        out = step.update(step.init({"w": torch.zeros(d)}), {"w": torch.zeros(d)}, {"w": torch.zeros(10, d)},
                          RoundInputs(view, 1, 0))
        total = out.params["w"].double() * 10  # the noised sum (t = 10 = K: exactly the central variance)
        assert float(total.std()) == pytest.approx(zd * 0.25, rel=0.03)
    assert zd == pytest.approx(1.1547, rel=1e-4)
    g = torch_generator(1, Purpose.SERVER_NOISE, 0)  # central: the server's stream, as for a fixed clip
    central = CentralDPFedAvg(0.25, z, adaptive_clipping=ac).update(
        {"clip": 0.25}, {"w": torch.zeros(d)}, {"w": torch.zeros(10, d)}, RoundInputs(view, 1, 0))
    assert torch.equal(central.params["w"], (zd * 0.25 * torch.randn(d, generator=g)) / 10.0)


@pytest.mark.parametrize("secure", [False, True])
def test_the_count_carries_sigma_b(secure):
    # 600 rounds of 6 zero updates (all unclipped: count 6): the noised count minus 6 is the count noise. Its
    # sample std has relative std 1/sqrt(2 * 600) = 2.9%, so +-12% is > 4 std. Secure: 6 shares of sigma_b^2 / t
    # with t = 6 sum to exactly sigma_b^2.
    sigma_b, n, k = 2.0, 600, 6
    ac = AdaptiveClipping(learning_rate=0.0, count_noise=sigma_b)
    step = (DistributedDPFedAvg(0.1, 1.0, adaptive_clipping=ac, protocol=SecureAggregation(threshold=k)) if secure
            else CentralDPFedAvg(0.1, 1.0, adaptive_clipping=ac))
    view = ServerView.simple([1] * k, expected_clients=float(k))
    noise = []
    for r in range(n if not secure else n // 3):  # the real protocol is slower: 200 rounds, 5% relative std
        out = step.update({"clip": 0.1}, _zeros(1), {"w": torch.zeros(k, 1)}, RoundInputs(view, 5, r))
        noise.append(out.metrics["adaptive_clip_fraction"] * k - k)
        assert out.state == {"clip": 0.1}  # learning rate 0: the clip stays
    assert float(np.std(noise)) == pytest.approx(sigma_b, rel=0.12 if not secure else 0.2)
    assert abs(float(np.mean(noise))) < 4 * sigma_b / math.sqrt(len(noise))


def test_secure_count_equals_the_central_count_plus_the_shares():
    # the revealed count is the centred indicators' sum plus the clients' count-noise shares (each from its own
    # stream), i.e. the central count's distribution N(count - K/2, K/t sigma_b^2) with K/t >= 1; the server never
    # sees an indicator alone. With a dropout the survivors' count is revealed.
    norms = [0.05, 0.2, 0.3, 0.09, 1.0, 0.08, 0.5, 0.01]
    ac = AdaptiveClipping(initial_clip=0.1, count_noise=1.0)
    view = ServerView.simple([1] * 8, expected_clients=8.0)
    for dropout in (0.0, 0.25):
        protocol = SecureAggregation(dropout=dropout)
        step = DistributedDPFedAvg(0.1, 1.0, adaptive_clipping=ac, protocol=protocol)
        out = step.update(step.init(_zeros()), _zeros(), _with_norms(norms), RoundInputs(view, 2, 4))
        keep = [k for k in range(8) if k not in protocol.dropped(list(range(8)), 2, 4)]
        t = protocol.threshold_for(8)
        shares = sum(1.0 / math.sqrt(t) * numpy_generator(2, Purpose.CLIP_COUNT, 4, k).standard_normal() for k in keep)
        count = sum(norms[k] <= 0.1 for k in keep)
        centred = (out.metrics["adaptive_clip_fraction"] - 0.5) * 8  # b~ = centred / m + 1/2, m = 8 expected
        assert centred == pytest.approx(count - len(keep) / 2 + shares, abs=1e-7)
        assert out.metrics["secagg_noise_share_std"] == pytest.approx(update_noise_multiplier(1.0, 1.0) * 0.1
                                                                      / math.sqrt(t))


# ---- without adaptive clipping: unchanged ----------------------------------------------------------------------
def test_a_fixed_clip_computes_what_it_computed_before():
    # the formula of central DP-FedAvg before adaptive clipping, written out: the same bits
    uploads, view = _with_norms([0.3, 1.0, 2.0, 0.7, 5.0]), ServerView.simple([1] * 5, expected_clients=4.0)
    clip, z = 0.9, 1.3
    flat = P.flatten(uploads)
    total = (flat * (clip / (flat.norm(dim=1) + 1e-12)).clamp(max=1.0)[:, None]).sum(0)
    total = total + z * clip * torch.randn(total.shape[0], generator=torch_generator(3, Purpose.SERVER_NOISE, 2))
    want = P.axpy(0.5, P.unflatten(total / 4.0, _zeros(), leading=0), _zeros())
    step = CentralDPFedAvg(clip, z, 0.5)
    out = step.update(step.init(_zeros()), _zeros(), uploads, RoundInputs(view, 3, 2))
    assert torch.equal(out.params["w"], want["w"]) and out.state is None and out.metrics == {}


# ---- config ----------------------------------------------------------------------------------------------------
def _cfg(**privacy):
    return {"data": {"dataset": "digits", "clients": 20}, "model": {"name": "logr"},
            "algorithm": {"name": "dp_fedavg_central"},
            "training": {"rounds": 2, "local_epochs": 1, "batch_size": 16, "optimizer": {"lr": 0.1},
                         "selection": {"kind": "poisson", "rate": 0.5}},
            "privacy": {"mechanism": "central", "budgets": 40.0,
                        "adaptive_clipping": {"target_quantile": 0.7}, **privacy}}


def test_the_config_round_trips_and_the_example_validates(tmp_path):
    cfg = validate_config(_cfg())
    assert cfg.privacy.adaptive_clipping.target_quantile == 0.7 and cfg.privacy.clip is None
    dumped = tmp_path / "config.yaml"
    dumped.write_text(config_to_yaml(cfg))
    assert load_config(dumped) == cfg
    example = load_config(CONFIG)
    assert example.privacy.adaptive_clipping.count_noise is None and example.privacy.mechanism == "central"
    dumped.write_text(config_to_yaml(example))
    assert load_config(dumped) == example


@pytest.mark.parametrize("change,key", [
    ({"clip": 1.0}, "privacy.clip"),
    ({"mechanism": "udp", "noise_multiplier": 1.0}, "privacy.adaptive_clipping"),  # not central: refused
    ({"mechanism": "none", "budgets": None, "unit": None}, "privacy.adaptive_clipping"),
])
def test_the_config_refuses_what_adaptive_clipping_cannot_honour(change, key):
    cfg = _cfg(**change)
    if change.get("mechanism") in ("udp", "none"):
        cfg["algorithm"] = {"name": {"udp": "udp_fedavg", "none": "fedavg"}[change["mechanism"]]}
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    assert str(info.value).startswith(key) and len(str(info.value).splitlines()) == 1


def test_a_run_refuses_a_count_noise_that_leaves_no_budget(tmp_path):
    from dpfl.experiment.build import build_run

    given = _cfg(noise_multiplier=3.0, adaptive_clipping={"count_noise": 1.0})
    with pytest.raises(ConfigError) as info:  # the noise is in the config: refused when the algorithm is built
        build_run(validate_config(given))
    assert info.value.path == KEY and len(str(info.value).splitlines()) == 1
    calibrated = _cfg(budgets=0.05, adaptive_clipping={"count_noise": 0.05})  # a small budget needs z > 0.1
    with pytest.raises(ConfigError, match=KEY) as info:  # ... or when the run calibrates it
        build_run(validate_config(calibrated))
    assert len(str(info.value).splitlines()) == 1


def test_the_catalog_resolves_the_default_count_noise_from_the_expected_cohort():
    from dpfl.experiment.build import build_run

    run = build_run(validate_config(_cfg()))  # 20 clients at rate 0.5: 10 expected, sigma_b = 10 / 20
    step = run.algorithm.aggregator
    assert isinstance(step, CentralDPFedAvg) and step.count_noise == pytest.approx(0.5)
    assert step.adaptive_clipping.target_quantile == 0.7 and step.noise is not None
    assert step.update_noise_multiplier == pytest.approx(update_noise_multiplier(step.noise, 0.5))


# ---- runs ------------------------------------------------------------------------------------------------------
def test_a_run_adapts_the_clip_towards_the_update_norms_median():
    # toy federation, 8 clients all every round, C_0 = 0.01 far below every update norm: the clip rises
    # geometrically, then tracks the median of the round's norms (recorded through the run's update hook).
    data = toy_federation(n_clients=8)
    ac = AdaptiveClipping(0.5, 0.5, initial_clip=0.01, count_noise=0.4)
    alg = Algorithm("dp_fedavg_central", sgd(0.1, steps=3), Selection("all"), FullUpdate(),
                    CentralDPFedAvg(0.01, 0.5, adaptive_clipping=ac))
    run = FederatedRun(data, linear_model(), alg, rounds=40, batch_sizes=10, budgets=ClientBudget(1e6, 1e-5))
    medians = {}

    def hook(ids, updates, r):
        medians[r] = float(P.flatten(updates).norm(dim=1).median())
        return updates

    run.update_hook = hook
    result = run.run()
    clips = [row["adaptive_clip"] for row in result.history]
    assert clips[0] == 0.01 and clips[1] > clips[0]
    late = [clips[r] / medians[r] for r in range(30, 40)]
    assert 0.7 < float(np.mean(late)) < 1.4, late  # within the noise: sigma_b / m = 0.05 in the fraction
    assert result.privacy.extra["adaptive_clipping"]["update_noise_multiplier"] == pytest.approx(
        update_noise_multiplier(0.5, 0.4))


def _rows(out: Path):
    """metrics.jsonl without its wall-clock fields (the protocol's `secagg_client_seconds_max` too)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "secagg_client_seconds_max"} for row in rows]


@pytest.mark.parametrize("secure", [False, True])
def test_a_stopped_adaptive_run_resumes_to_the_uninterrupted_result(tmp_path, secure):
    cfg = _cfg()
    cfg["training"]["rounds"] = 4
    cfg["checkpoint"] = {"every": 1}
    if secure:  # distributed noise needs every client each round (no amplification by client sampling claimed)
        cfg["secure_aggregation"] = {}
        cfg["training"]["selection"] = {"kind": "all"}
    execute(validate_config(cfg), tmp_path / "whole")
    stop_in_round(validate_config(cfg), tmp_path / "stopped", 3)
    state = torch.load(tmp_path / "stopped" / "checkpoint.pt", weights_only=True)  # what resume reads
    assert state["round"] == 2 and set(state["aggregator_state"]) == {"clip"}
    execute(validate_config(cfg), tmp_path / "stopped", resume=True)
    rows = _rows(tmp_path / "whole")
    assert untimed(_rows(tmp_path / "stopped")) == untimed(rows)
    assert len({row["adaptive_clip"] for row in rows}) == 4 and all("adaptive_clip_fraction" in r for r in rows)
    for name in ("summary.json", "privacy.json"):
        assert untimed(json.loads((tmp_path / "stopped" / name).read_text())) == untimed(
            json.loads((tmp_path / "whole" / name).read_text()))
    privacy = json.loads((tmp_path / "whole" / "privacy.json").read_text())
    block = privacy["adaptive_clipping"]
    assert block["clip_last"] == rows[-1]["adaptive_clip"] and block["count_noise"] == pytest.approx(
        (20 if secure else 10) / 20)
    assert ("secure_aggregation" in block) == secure and "Theorem 1" in block["accounting"]
    assert (tmp_path / "whole" / "plots" / "clip.png").is_file()
    assert "plots/clip.png" in (tmp_path / "whole" / "report.md").read_text()


def test_per_client_budgets_calibrate_the_same_z_as_a_fixed_clip():
    # central DP: one noise, the smallest budget's, whether the clip is fixed or adaptive; the adaptive run reports
    # its clip in privacy.json and the fixed one does not
    from dpfl.experiment.build import build_run

    budgets = [20.0, 40.0, 80.0, 160.0] * 5
    adaptive = build_run(validate_config(_cfg(budgets=budgets)))
    fixed_cfg = _cfg(budgets=budgets, clip=0.1)
    del fixed_cfg["privacy"]["adaptive_clipping"]
    fixed = build_run(validate_config(fixed_cfg))
    assert adaptive.algorithm.aggregator.noise == fixed.algorithm.aggregator.noise > 0
    assert adaptive.calibrated.summary() == fixed.calibrated.summary()
    results = adaptive.run(), fixed.run()
    assert results[0].spent() == results[1].spent()  # the same ledger, round by round
    assert "adaptive_clipping" in results[0].privacy.extra and "adaptive_clipping" not in results[1].privacy.extra
    assert "the clip is adaptive" in results[0].privacy.mechanism
