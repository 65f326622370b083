"""MP-DP rounds and runs (spec bidirectional.md §5.5, §6, §8.6, §9, §11; T21, T28, T29, T33, G2)."""

import math

import numpy as np
import pytest
import torch
from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
from mpdp_runs import mlp_weights, mpdp_config, mpdp_result, mpdp_run, records, stage

from dpfl.algorithms.secure.mpdp.algorithm import perturbed_round, plain_round
from dpfl.algorithms.secure.mpdp.ddp import MissingPeersError
from dpfl.algorithms.secure.mpdp.perturb import FactorPlan, round_generator
from dpfl.algorithms.secure.mpdp.round_settings import RoundSettings
from dpfl.evaluate.mpdp_attacks import measure_client_attacks
from dpfl.experiment.build import build_run
from dpfl.experiment.config import ConfigError, config_to_dict, validate_config
from dpfl.experiment.config.overrides import apply_overrides
from dpfl.models import build_model
from dpfl.privacy.accountant import epsilon as accountant_epsilon
from dpfl.reproduce.mpdp import comparison_row

PLAN = FactorPlan((64, 16, 12, 10))


@pytest.fixture(scope="module")
def arrays():
    return records(5)


def _batches(arrays, k=5, b=16):
    return {c: (arrays.shards[c][0][:b], arrays.shards[c][1][:b]) for c in range(k)}


def test_noise_free_mpdp_round_is_exactly_fedsgd(arrays):
    weights = mlp_weights(PLAN, 0)
    batches = _batches(arrays)
    plain = plain_round(weights, batches, RoundSettings("fedavg", lr=0.3), torch.Generator())
    st = RoundSettings("mpdp", lr=0.3, clip_mode="none", sigma_eta=0.0, sigma_delta=1e3)
    private = perturbed_round(weights, PLAN, batches, st, 0, round_generator(1), dict.fromkeys(batches))
    for a, b in zip(plain.weights, private.weights, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-9)  # the Δ of 10 edges at σ_Δ = 1e3 cancel to ~1e-12


def test_noise_free_mpdp_round_on_a_tied_residual_resnet_is_exactly_fedsgd():  # T16 through the round
    images = records(3, flatten=False)
    net = build_model("mpdp_resnet", tuple(images.shards[0][0].shape[1:]), images.n_classes, seed=0, widths=[3, 4],
                      blocks=1, bias=True)
    plan = FactorPlan.from_module(net, images.image_shape, allow_residual=True)
    weights = [p.detach() for p in net.parameters()]
    ends = [i for i, (layer, kind) in enumerate(plan.params()) if kind == "weight" and layer in {2, 5}]
    assert [sk.target for sk in plan.skips] == [2, 5] and all(not weights[i].any() for i in ends)  # Fixup: zero
    g = torch.Generator().manual_seed(0)
    weights = [w + 0.1 * torch.randn(w.shape, generator=g, dtype=torch.float64) for w in weights]
    batches = {c: (images.shards[c][0][:8], images.shards[c][1][:8]) for c in range(3)}
    plain = plain_round(weights, batches, RoundSettings("fedavg", lr=0.3), torch.Generator(), plan)
    st = RoundSettings("mpdp", lr=0.3, clip_mode="none", sigma_eta=0.0, sigma_delta=1e3)
    private = perturbed_round(weights, plan, batches, st, 0, round_generator(1), dict.fromkeys(batches))
    for a, b in zip(plain.weights, private.weights, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-9)


def test_missing_peer_discards_the_round_with_no_update(arrays):  # T21
    weights = mlp_weights(PLAN, 0)
    before = [w.clone() for w in weights]
    st = RoundSettings("mpdp", lr=0.3, sigma_eta=0.5, sigma_delta=10.0)
    with pytest.raises(MissingPeersError) as err:
        perturbed_round(weights, PLAN, _batches(arrays), st, 3, round_generator(2), {}, drop={2})
    assert err.value.missing == [2] and err.value.affected == [0, 1, 3, 4] and err.value.round == 3
    assert all(torch.equal(a, b) for a, b in zip(before, weights, strict=True))


def test_run_reruns_a_discarded_round_and_still_charges_who_uploaded():  # T21, abort policy
    cfg = mpdp_config("mpdp", clients=5, rounds=3, hidden=[16, 12])
    result = mpdp_result(cfg, drop=lambda r, attempt: {2} if (r, attempt) == (1, 0) else set())
    assert stage(result)["discarded_rounds"] == 1 and len(result.history) == 3
    assert result.history[1]["discarded_attempts"] == [[0, 1, 3, 4]]  # round 2's first attempt: who uploaded
    parts = [c["participations"] for c in stage(result)["per_client"]]
    assert parts == [4, 4, 3, 4, 4]  # the discarded attempt is charged to the clients whose uploads arrived


@pytest.mark.parametrize("corrections", [False, True])
def test_secagg_recovery_removes_the_dropped_clients_noise_exactly(arrays, corrections):  # T21, secagg_recovery
    weights = mlp_weights(PLAN, 0)
    batches = _batches(arrays)
    kept = {k: v for k, v in batches.items() if k != 2}
    plain = plain_round(weights, kept, RoundSettings("fedavg", lr=0.3), torch.Generator())
    st = RoundSettings("mpdp", lr=0.3, clip_mode="none", sigma_eta=0.0, sigma_delta=1e3,
                       mask_corrections=corrections, dropout_policy="secagg_recovery")
    out = perturbed_round(weights, PLAN, batches, st, 0, round_generator(6), dict.fromkeys(batches), drop={2})
    assert out.reduced_protection == [2] and out.uploads == 4
    for a, b in zip(plain.weights, out.weights, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-8)  # the mean of the 4 survivors, no Δ left


def test_secagg_recovery_needs_threshold_survivors(arrays):
    st = RoundSettings("mpdp", lr=0.3, sigma_eta=0.5, sigma_delta=10.0, dropout_policy="secagg_recovery")
    with pytest.raises(MissingPeersError):  # 2 of 5 survive, the threshold is 3
        perturbed_round(mlp_weights(PLAN, 0), PLAN, _batches(arrays), st, 0, round_generator(7), {},
                        drop={0, 1, 3})


def test_run_with_simulated_dropouts_and_recovery_flags_the_rounds():
    cfg = mpdp_config("mpdp", clients=5, rounds=3, hidden=[16, 12], dropout=0.2, dropout_policy="secagg_recovery")
    result = mpdp_result(cfg)
    assert stage(result)["reduced_protection_rounds"] == [1, 2, 3] and stage(result)["discarded_rounds"] == 0
    assert all(len(row["reduced_protection"]) == 1 for row in result.history)  # floor(0.2 x 5) = 1 client a round
    recovering = config_to_dict(mpdp_config("mpdp", clients=5, dropout_policy="secagg_recovery"))
    with pytest.raises(ConfigError, match="^algorithm.params.dropout: 0.1 drops no client of 5"):
        build_run(validate_config(apply_overrides(recovering, ["algorithm.params.dropout=0.1"])))
    aborting = config_to_dict(mpdp_config("mpdp", clients=5))
    with pytest.raises(ConfigError, match="could never finish"):  # abort would discard every attempt of every round
        validate_config(apply_overrides(aborting, ["algorithm.params.dropout=0.2"]))


def test_the_server_never_broadcasts_the_true_model():  # G2, over every round
    seen = []

    def check(payload, weights):
        seen.append(payload.round_id)
        for hat, w in zip(payload.odd, weights, strict=True):
            assert float((hat - w).abs().max()) > 1e-3 * float(w.abs().max())
        assert len(payload.odd) == len(weights) and len(payload.transitional) == len(weights) - 1

    cfg = mpdp_config("mpdp", clients=5, rounds=6, hidden=[16, 12], eval_every=3)
    mpdp_result(cfg, on_broadcast=check)
    assert seen == list(range(6))


def test_privacy_reports_nominal_mpdp_outside_the_ledger_and_accounts_mp_cdp():  # T28
    flat = dict(clients=5, rounds=4, hidden=[16, 12], epsilon=2.0)
    mpdp = stage(mpdp_result(mpdp_config("mpdp", **flat)))
    assert mpdp["in_ledger"] is False and mpdp["accountant"] is None and mpdp["label"].startswith("nominal")
    assert all(c["composed"]["label"].startswith("T-fold composed (nominal") for c in mpdp["per_client"])
    assert mpdp["composed_epsilon_max"] == pytest.approx(min(8.0, mpdp["per_client"][0]["advanced"]["epsilon"]))
    cdp = stage(mpdp_result(mpdp_config("mp_cdp", **flat)))
    assert cdp["in_ledger"] is False and cdp["accountant"] == "rdp" and "accounted_by" in cdp
    expected = accountant_epsilon(SelfComposedDpEvent(GaussianDpEvent(cdp["sigma_cdp"]), 4), 1e-5, "rdp")
    assert cdp["epsilon_total"] == pytest.approx(expected)


def test_naive_recovered_noise_has_variance_one_and_a_half_sigma_squared(arrays):  # T29
    # With fresh factors per repetition, the recovered noise R∘η has E[R²] = 3/2 in every odd layer; 40 repetitions x
    # 1,100 coordinates leave the variance estimate within a few percent (factors are shared along rows: +-8%).
    weights = mlp_weights(PLAN, 0)
    batches = _batches(arrays)
    sigma, lr, K = 0.2, 1.0, 5
    diffs = []
    for rep in range(40):
        seeds = {c: 1000 * rep + c for c in batches}
        base = RoundSettings("mpdp_naive", lr=lr, clip_mode="none", sigma_naive=0.0)
        noisy = RoundSettings("mpdp_naive", lr=lr, clip_mode="none", sigma_naive=sigma)
        a = perturbed_round(weights, PLAN, batches, base, 0, round_generator(rep), seeds)
        b = perturbed_round(weights, PLAN, batches, noisy, 0, round_generator(rep), seeds)
        diffs.append(torch.cat([(x - y).reshape(-1) for x, y in zip(a.weights, b.weights, strict=True)]))
    d = torch.cat(diffs) / lr  # the mean over K clients of R∘η_k
    assert float(d.var()) * K == pytest.approx(1.5 * sigma**2, rel=0.08)


def test_mp_cdp_noise_matches_its_calibration(arrays):  # T29
    weights = mlp_weights(PLAN, 0)
    batches = _batches(arrays)
    a = plain_round(weights, batches, RoundSettings("mp_cdp", lr=1.0, sigma_cdp=0.0), torch.Generator().manual_seed(0))
    b = plain_round(weights, batches, RoundSettings("mp_cdp", lr=1.0, sigma_cdp=2.0, S=1.5),
                    torch.Generator().manual_seed(0))
    d = torch.cat([(x - y).reshape(-1) for x, y in zip(a.weights, b.weights, strict=True)])
    assert float(d.std()) == pytest.approx(1.5 * 2.0 / 5, rel=0.05)  # S σ_cdp / K on 1,100 coordinates


CI = dict(name="ci", clients=5, rounds=30, hidden=[64, 32], lr=0.3, epsilon=300.0, clip_mode="oracle_true")


def test_ci_config_learns_with_the_oracle_clip_and_reports_everything():  # T33
    """The comparison's row of the run (`comparison_row`, what results.csv holds)."""
    cfg = mpdp_config("mpdp", **CI)
    result = mpdp_result(cfg)
    s = comparison_row(cfg, result.history, result.privacy.to_dict(), 1.0)
    assert s["accuracy"] > 0.5  # chance is 0.1; the noise at 300 per round is small
    for key in ("round_seconds", "server_seconds", "client_seconds", "upload_bytes", "violation_rate",
                "epsilon_composed", "epsilon_label"):
        assert s[key] is not None
    assert s["upload_bytes"] == 8 * PLAN_DIM * 12
    assert "nominal" in s["epsilon_label"]
    assert "does NOT hold towards the server" in s["epsilon_label"]  # the oracle clip does not bound the upload
    assert "uploaded without noise (W2)" in s["epsilon_label"]  # Φ leaks unless mask_corrections
    hardened = mpdp_config("mpdp", **{**CI, "rounds": 1, "mask_corrections": True})
    done = mpdp_result(hardened)
    assert "uploaded without noise" not in comparison_row(hardened, done.history, done.privacy.to_dict(),
                                                          1.0)["epsilon_label"]


PLAN_DIM = 64 * 64 + 64 * 32 + 32 * 10


def test_mask_corrections_keep_recovery_exact_and_mask_each_upload(arrays):  # T24
    weights = mlp_weights(PLAN, 0)
    batches = _batches(arrays)
    plain = plain_round(weights, batches, RoundSettings("fedavg", lr=0.3), torch.Generator())
    st = RoundSettings("mpdp", lr=0.3, clip_mode="none", sigma_eta=0.0, mask_corrections=True)
    masked = perturbed_round(weights, PLAN, batches, st, 0, round_generator(3), dict.fromkeys(batches))
    for a, b in zip(plain.weights, masked.weights, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-9)
    # what one client uploads as Ψ is dominated by the mask (std 1e3 S), not by its Ψ
    from dpfl.algorithms.secure.mpdp.ddp import CORRECTION_MASK_STREAM, DDPClient
    a, b = DDPClient(0), DDPClient(1)
    m = a.pairwise({1: b.public}, 10_000, 1e3, b"r", 0, "gaussian", CORRECTION_MASK_STREAM)
    assert float(np.std(m)) == pytest.approx(1e3, rel=0.03)
    assert np.allclose(m + b.pairwise({0: a.public}, 10_000, 1e3, b"r", 0, "gaussian", CORRECTION_MASK_STREAM), 0)


def test_gaussian_conditional_noise_cancels_and_the_audit_is_finite(arrays):  # T24
    weights = mlp_weights(PLAN, 0)
    batches = _batches(arrays)
    plain = plain_round(weights, batches, RoundSettings("fedavg", lr=0.3), torch.Generator())
    st = RoundSettings("mpdp", lr=0.3, clip_mode="none", sigma_eta=0.0, sigma_delta=1e3,
                       noise_family="gaussian_conditional")
    out = perturbed_round(weights, PLAN, batches, st, 0, round_generator(4), dict.fromkeys(batches))
    for a, b in zip(plain.weights, out.weights, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-9)
    st = RoundSettings("mpdp", lr=0.3, sigma_eta=0.75, sigma_delta=10.0, noise_family="gaussian_conditional")
    audit = perturbed_round(weights, PLAN, batches, st, 0, round_generator(5), dict.fromkeys(batches)).audit
    q = audit["R_quantiles"]
    assert 0 < q["min"] <= q["q01"] <= q["median"] <= q["q99"] <= q["max"] < math.inf
    assert math.isfinite(audit["epsilon_conditional"]) and audit["effective_sensitivity_factor"] >= 1 / q["median"]


def test_runs_report_what_demasking_recovers_from_the_last_received_model():  # W3 measured
    flat = {**CI, "name": "t"}
    cfg = mpdp_config("mpdp", **flat)
    run = mpdp_run(cfg)
    result = run.run()
    privacy = {**result.privacy.to_dict(), **measure_client_attacks(run, result)}  # what `dpfl run` writes
    hiding = privacy["model_hiding"]
    assert hiding["perturbed_accuracy"] < 0.3 < 0.5 < hiding["demasked_accuracy"]  # hidden as received, not after
    assert comparison_row(cfg, result.history, privacy, 1.0)["demasked_accuracy"] == hiding["demasked_accuracy"]
    fedavg = mpdp_run(mpdp_config("fedavg", **{**flat, "rounds": 2}))
    measured = measure_client_attacks(fedavg, fedavg.run())
    assert "model_hiding" not in measured and "membership" in measured
