"""TP-SMC (spec bidirectional.md §9): the encrypted round equals its plaintext arithmetic, and a run is accounted
like MP-CDP under its stated honest-majority assumption."""

import pytest
import torch
from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
from mpdp_runs import mlp_weights, mpdp_config, mpdp_result, mpdp_run, records, stage

from dpfl.algorithms.secure.mpdp.algorithm import clipped, plain_round, true_gradient
from dpfl.algorithms.secure.mpdp.perturb import FactorPlan
from dpfl.algorithms.secure.mpdp.round_settings import RoundSettings
from dpfl.algorithms.secure.threshold_paillier import keygen
from dpfl.algorithms.secure.tpsmc import tpsmc_round
from dpfl.experiment.build import build_run
from dpfl.experiment.config import ConfigError, config_to_dict, validate_config
from dpfl.experiment.config.overrides import apply_overrides
from dpfl.privacy.accountant import epsilon as accountant_epsilon

PLAN = FactorPlan((64, 6, 10))  # 444 weights: every one is encrypted by every client


@pytest.fixture(scope="module")
def setup():
    arrays = records(3)
    batches = {c: (arrays.shards[c][0][:16], arrays.shards[c][1][:16]) for c in range(3)}
    return arrays, batches, keygen(256, 3, 2)


@pytest.mark.parametrize("packing, ciphertexts", [(False, 444), (True, 74)])
def test_without_noise_the_encrypted_round_is_mp_cdps_clipped_mean(setup, packing, ciphertexts):
    _, batches, keys = setup
    weights = mlp_weights(PLAN, 0)
    st = RoundSettings("tp_smc", lr=0.5, clip=0.05, sigma_cdp=0.0)  # a clip that binds
    plain = plain_round(weights, batches, RoundSettings("mp_cdp", lr=0.5, clip=0.05, sigma_cdp=0.0),
                        torch.Generator(), PLAN)
    enc = tpsmc_round(weights, batches, st, keys, 40, 3, {}, PLAN, packing=packing)
    for a, b in zip(plain.weights, enc.weights, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=0.5 * 2**-40)  # fixed-point rounding, 3 values summed, x lr / K
    # 512-bit ciphertexts: one per weight, or 6 weights per plaintext when packed (slots of 37 + 2 bits below
    # 2^254: |v| <= 0.05 takes 36 bits at 2^-40, plus the sign's offset, plus 2 bits for 3 summands)
    assert enc.upload_bytes == ciphertexts * 64


@pytest.mark.parametrize("packing", [False, True])
def test_with_noise_the_decrypted_sum_is_the_clients_noisy_sum(setup, packing):
    _, batches, keys = setup
    weights = mlp_weights(PLAN, 0)
    st = RoundSettings("tp_smc", lr=1.0, clip=1.0, S=1.0, sigma_cdp=2.0)
    gens = {k: torch.Generator().manual_seed(10 + k) for k in batches}
    out = tpsmc_round(weights, batches, st, keys, 40, 2, gens, PLAN, packing=packing)
    expected = torch.zeros(444, dtype=torch.float64)
    for k, (x, y) in batches.items():  # each client's own noise, 1/h of the CDP variance: std S σ / sqrt(h)
        g = torch.cat([t.reshape(-1) for t in clipped(true_gradient(weights, x, y, PLAN), 1.0)])
        expected += g + torch.randn(444, generator=torch.Generator().manual_seed(10 + k),
                                    dtype=torch.float64) * 2.0 / 2**0.5
    got = torch.cat([(w - n).reshape(-1) for w, n in zip(weights, out.weights, strict=True)]) * 3  # lr 1, K = 3
    assert torch.allclose(got, expected, rtol=0, atol=1e-10)


def test_a_run_is_accounted_like_mp_cdp_and_states_its_assumption():
    flat = dict(clients=3, rounds=2, hidden=[6], epsilon=2.0, tpsmc_key_bits=192, eval_every=1)
    run = mpdp_run(mpdp_config("tp_smc", **flat))
    assert run.algorithm.upload.keys.public.n.bit_length() in (191, 192)  # the config's key size
    result = run.run()
    p = stage(result)
    assert p["in_ledger"] is False and p["accountant"] == "rdp" and p["honest"] == 3 and p["threshold"] == 2
    assert "ASSUMING at least h = 3" in p["guarantee"] and "not_simulated" in p
    expected = accountant_epsilon(SelfComposedDpEvent(GaussianDpEvent(p["sigma_cdp"]), 2), 1e-5, "rdp")
    assert p["epsilon_total"] == pytest.approx(expected)
    assert p["epsilon_total"] == pytest.approx(stage(mpdp_result(mpdp_config("mp_cdp", **flat)))["epsilon_total"])
    assert len(result.history) == 2 and 0 <= result.history[-1]["test_accuracy"] <= 1


def test_bad_tpsmc_settings_are_config_errors():
    raw = config_to_dict(mpdp_config("tp_smc", clients=3))
    with pytest.raises(ConfigError, match=r"^algorithm.params.tpsmc_threshold: cannot exceed the number of clients"):
        build_run(validate_config(apply_overrides(raw, ["algorithm.params.tpsmc_threshold=4"])))
    with pytest.raises(ConfigError, match=r"^algorithm.params: tpsmc_key_bits must be even"):
        validate_config(apply_overrides(raw, ["algorithm.params.tpsmc_key_bits=1025"]))


def test_packing_gives_the_same_round_bit_for_bit(setup):
    """Both encodings sum the same rounded integers, so the models are equal exactly, with noise."""
    _, batches, keys = setup
    weights = mlp_weights(PLAN, 0)
    st = RoundSettings("tp_smc", lr=1.0, clip=1.0, S=1.0, sigma_cdp=2.0)
    runs = [tpsmc_round(weights, batches, st, keys, 32, 3, {k: torch.Generator().manual_seed(k) for k in batches},
                        PLAN, packing=p) for p in (False, True)]
    for a, b in zip(runs[0].weights, runs[1].weights, strict=True):
        assert torch.equal(a, b)
    assert runs[1].upload_bytes * 4 < runs[0].upload_bytes
