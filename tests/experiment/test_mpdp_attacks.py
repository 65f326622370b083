"""Client attacks measured at the end of an MP-DP comparison run (spec bidirectional.md §10, §11 "Every run
reports ... MIA ASR (plain and adaptive)")."""

import json
import subprocess
import sys

import pytest
import torch
from mpdp_runs import mlp_weights, mpdp_config, mpdp_run, records

from dpfl.algorithms.secure.mpdp.perturb import FactorPlan
from dpfl.evaluate.mpdp_attacks import FederatedArrays, client_attacks, measure_client_attacks, membership_report
from dpfl.evaluate.mpdp_inversion import ProbeSetting, inversion_report
from dpfl.experiment.run_directory import execute
from dpfl.reproduce.mpdp import comparison_row
from dpfl.results.run_files import read_metrics

C = 4
EXTRACTORS: dict = {}  # the public feature extractors, shared by this file's inversions as a study shares them


def _planted(n_members=400, n_test=300):
    """Column 0 says whether a record is a member, column 1 holds its label: a predict that reads column 0 is a
    perfectly memorising model, one that ignores it leaks nothing."""
    g = torch.Generator().manual_seed(0)
    y_in, y_out = torch.randint(0, C, (n_members,), generator=g), torch.randint(0, C, (n_test,), generator=g)
    x_in = torch.stack([torch.ones(n_members), y_in.double()], 1)
    x_out = torch.stack([torch.zeros(n_test), y_out.double()], 1)
    onehot = torch.nn.functional.one_hot(y_in, C).double()
    return FederatedArrays([(x_in[:200], onehot[:200]), (x_in[200:], onehot[200:])], x_out, y_out, C)


def test_a_memorising_model_is_caught_and_a_blind_one_is_not():
    arrays = _planted()

    def memorising(x):  # right label with certainty on members, a wrong one on non-members
        label = x[:, 1].long()
        return torch.nn.functional.one_hot(torch.where(x[:, 0] > 0, label, (label + 1) % C), C).double()

    caught = membership_report(memorising, arrays, seed=0)
    assert caught["asr"] == 1.0 and caught["auc"] == 1.0
    assert set(caught["attacks"]) == {"loss", "confidence", "shadow"}
    assert caught["attacks"]["loss"]["n_members"] == caught["attacks"]["loss"]["n_nonmembers"] == 150  # held-out half
    g = torch.Generator().manual_seed(1)
    blind = membership_report(lambda x: torch.randn(len(x), C, generator=g, dtype=torch.float64), arrays, seed=0)
    # 150 + 150 held-out records: the balanced accuracy of a fixed threshold has std <= 0.5 / sqrt(300) ~ 0.029;
    # the strongest of three attacks is picked by AUC, so allow ~4 std
    assert abs(blind["asr"] - 0.5) < 0.12 and abs(blind["auc"] - 0.5) < 0.12


def test_a_diverged_model_is_recorded_as_not_attacked_not_a_failed_run():
    """A model whose outputs overflow (a diverged run; seen at nominal eps 3 with the oracle clip) keeps the run:
    the report says why there is no ASR. Outputs finite but with scores that overflow count the same."""
    from dpfl.attacks.membership import NonFiniteOutputsError, run_membership_attacks

    arrays = _planted()
    for bad in (float("nan"), float("inf"), 1e200):  # 1e200: finite outputs, an infinite MSE loss score
        report = membership_report(lambda x, v=bad: torch.full((len(x), C), v, dtype=torch.float64), arrays, seed=0)
        assert report["asr"] is None and report["auc"] is None and "diverged" in report["skipped"], bad
    from dpfl.evaluate.mpdp_attacks import _accuracy

    assert _accuracy(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0])) == 0.5
    assert _accuracy(torch.tensor([[float("nan"), 0.0], [0.0, 1.0]]), torch.tensor([0, 1])) is None  # not "0.5"
    with pytest.raises(NonFiniteOutputsError):  # the attacks themselves still refuse such a model
        run_membership_attacks(lambda x: torch.full((len(x), C), float("nan")), (arrays.x_test, arrays.y_test),
                               (arrays.x_test, arrays.y_test))


def test_client_attacks_need_a_target():
    with pytest.raises(ValueError, match="perturbed view"):
        client_attacks(_planted(), 0)


@pytest.fixture(scope="module")
def digits():
    return records(5)


def _attacked(method, **flat):
    """A run of `method` and its privacy.json as `dpfl run` writes it: the stated privacy, then the client attacks
    (`measure_client_attacks`); with the comparison's row of both (`comparison_row`)."""
    cfg = mpdp_config(method, **flat)
    run = mpdp_run(cfg)
    result = run.run()
    privacy = {**result.privacy.to_dict(), **measure_client_attacks(run, result)}
    return privacy, comparison_row(cfg, result.history, privacy, 1.0)


def test_mpdp_runs_report_plain_and_adaptive_membership_baselines_plain_only():
    flat = dict(clients=5, rounds=3, hidden=[32], lr=0.3, epsilon=30.0, clip_mode="oracle_true")
    privacy, row = _attacked("mpdp", **flat)
    m = privacy["membership"]
    assert {"plain", "adaptive"} <= set(m) and "perturbed" in m["target"]
    assert row["mia_asr"] == m["plain"]["asr"] and row["mia_asr_adaptive"] == m["adaptive"]["asr"]
    assert all(0.0 <= m[k]["asr"] <= 1.0 for k in ("plain", "adaptive"))
    fedavg, row = _attacked("fedavg", **flat)
    assert set(fedavg["membership"]) == {"target", "plain"} and "model_hiding" not in fedavg
    assert row["mia_asr"] is not None and row["mia_asr_adaptive"] is None


CONFIG = dict(clients=5, rounds=2, hidden=[32], lr=0.3, epsilon=30.0, clip_mode="oracle_true", eval_every=1)


def test_a_run_without_the_attack_callback_records_no_attack(tmp_path):
    """The run layer imports no attack: the caller supplies them (`execute(..., measure=measure_client_attacks)`, as
    `dpfl run` does), and without it privacy.json holds the mechanism's guarantee alone, no attack block and no
    attack-derived summary field."""
    cfg = mpdp_config("mpdp", **CONFIG)
    execute(cfg, tmp_path / "plain")
    execute(cfg, tmp_path / "attacked", measure=measure_client_attacks)
    plain, attacked = (json.loads((tmp_path / d / "privacy.json").read_text()) for d in ("plain", "attacked"))
    assert "membership" not in plain and "model_hiding" not in plain
    row = comparison_row(cfg, read_metrics(tmp_path / "plain"), plain, 1.0)
    assert row["mia_asr"] is None and row["demasked_accuracy"] is None
    assert {"membership", "model_hiding"} <= set(attacked)
    assert {k: v for k, v in attacked.items() if k not in ("membership", "model_hiding")} == plain
    assert [r["test_accuracy"] for r in read_metrics(tmp_path / "plain")] == [
        r["test_accuracy"] for r in read_metrics(tmp_path / "attacked")]  # the attacks change nothing trained


def test_the_run_layer_imports_no_attack(tmp_path):
    """A run of an MP-DP config into its directory, in a fresh interpreter, loads neither dpfl.attacks nor
    dpfl.evaluate: the attacks are the caller's."""
    code = f"""if True:
        import sys
        from dpfl.experiment.config import validate_config
        from dpfl.experiment.config.legacy_mpdp import convert_legacy_mpdp
        from dpfl.experiment.run_directory import execute
        cfg = validate_config(convert_legacy_mpdp({{"scheme": "mpdp", "name": "t", **{CONFIG!r}, "rounds": 1}}))
        execute(cfg, {str(tmp_path / "run")!r})
        print(sorted(m for m in sys.modules if m.startswith(("dpfl.attacks", "dpfl.evaluate"))))
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert (tmp_path / "run" / "summary.json").is_file()


def test_the_server_view_recovers_each_clients_true_gradient_without_noise(digits):  # Eq. (18) with η = Δ = 0
    from dpfl.algorithms.secure.mpdp.algorithm import perturbed_round, true_gradient
    from dpfl.algorithms.secure.mpdp.perturb import recover, round_generator
    from dpfl.algorithms.secure.mpdp.round_settings import RoundSettings

    plan = FactorPlan((64, 16, 10))
    weights = mlp_weights(plan, 0)
    batches = {k: (digits.shards[k][0][:8], digits.shards[k][1][:8]) for k in range(5)}
    seen = {}
    st = RoundSettings("mpdp", lr=0.3, clip_mode="none", sigma_eta=0.0)
    perturbed_round(weights, plan, batches, st, 0, round_generator(1), dict.fromkeys(batches),
                    on_upload=lambda k, up, psi, phi, sec: seen.setdefault(k, recover(up, psi, phi, sec)))
    assert sorted(seen) == list(range(5))
    for k, (x, y) in batches.items():
        for a, b in zip(seen[k], true_gradient(weights, x, y, plan), strict=True):
            assert torch.allclose(a, b, rtol=0, atol=1e-9)


PROBED = dict(clients=5, rounds=3, hidden=[32], lr=0.3)


def _final_model(**flat):
    """The final true model of a short FedSGD run, and its network's plan."""
    run = mpdp_run(mpdp_config("fedavg", **flat))
    return list(run.run().params.values()), run.algorithm.local.network


def _probe(method, **flat):
    """What the server's probe round of a `method` run needs (its round settings, seed and batch size)."""
    return ProbeSetting.of(mpdp_run(mpdp_config(method, **flat)))


def test_inversion_recovers_an_unprotected_record_and_not_an_mpdp_upload(digits):
    """One record, the final model of a short run: the true gradient gives the image back (> 40 dB), MP-DP's
    recovered noisy gradient at nominal eps 3 per round does not (< 20 dB: noise std 0.34 S per coordinate against
    a gradient of norm <= S); the strongest view is the noise-free Φ (W2)."""
    weights, plan = _final_model(**PROBED)
    clear = inversion_report(_probe("fedavg", **PROBED), weights, plan, digits, steps=60, batches=(1,),
                             extractors=EXTRACTORS)
    noisy = inversion_report(_probe("mpdp", **PROBED, epsilon=3.0), weights, plan, digits, steps=60, batches=(1,),
                             extractors=EXTRACTORS)
    views = noisy["batches"]["1"]["views"]
    recovered = max(a["psnr"] for a in views["recovered"]["attacks"].values())
    assert clear["batches"]["1"]["psnr"] > 40 > 20 > recovered
    assert noisy["batches"]["1"]["psnr"] >= recovered and noisy["batches"]["1"]["strongest"].endswith("on phi")
    assert set(views) == {"recovered", "upload_at_w_hat", "phi"} and "R∘" in views["recovered"]["target"]
    assert set(views["recovered"]["attacks"]) == {"dlg", "inverting_gradients"}
    hardened = inversion_report(_probe("mpdp", **PROBED, epsilon=3.0, mask_corrections=True), weights, plan, digits,
                                steps=20, batches=(1,), extractors=EXTRACTORS)
    assert set(hardened["batches"]["1"]["views"]) == {"upload_at_w_hat"}  # Eq. (18) cannot be formed


def test_the_raw_upload_leaks_under_the_oracle_clip_not_under_the_joint_clip(digits):
    """The noise is calibrated to S on the recovered gradient. Under the oracle clip the perturbed gradient at Ŵ is
    not bounded (the mask terms make it much larger), so matching the raw upload at Ŵ recovers the record; the
    spec's joint clip bounds it by S and the record stays hidden. Measured: 32-61 dB vs 6-8 dB on this data."""
    weights, plan = _final_model(**PROBED)
    psnr = {mode: inversion_report(_probe("mpdp", **PROBED, epsilon=30.0, clip_mode=mode), weights, plan, digits,
                                   steps=60, batches=(1,), extractors=EXTRACTORS)
            ["batches"]["1"]["views"]["upload_at_w_hat"]
            for mode in ("oracle_true", "perturbed_joint")}
    best = {mode: max(a["psnr"] for a in v["attacks"].values()) for mode, v in psnr.items()}
    assert best["oracle_true"] > 25 > 12 > best["perturbed_joint"]


def test_the_fallback_network_has_the_clients_lmt_gradient(digits):
    """With Ψ, Φ masked the server matches the upload at Ŵ: the PerturbedNetwork's gradient of the MSE loss is
    exactly the g of the client's LMT, so a noise-free upload would be matched exactly."""
    from dpfl.algorithms.secure.mpdp.lmt import lmt
    from dpfl.algorithms.secure.mpdp.perturb import mp_server, round_generator
    from dpfl.attacks.inversion import observed_gradient
    from dpfl.evaluate.mpdp_inversion import AlphaNetwork, PerturbedNetwork

    plan = FactorPlan((64, 16, 12, 10))
    payload, _ = mp_server(mlp_weights(plan, 0), plan, round_generator(2), 0, 1.0)
    x, y = digits.shards[0][0][:4], digits.shards[0][1][:4]
    got = observed_gradient(PerturbedNetwork(payload, flatten=True), x.reshape(4, 1, 8, 8), y.argmax(1), "mse_onehot")
    terms = lmt(payload, x, y)
    for a, b in zip(got, terms.grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    # and the W2 probe's network has Φ (label 0 turns the MSE on [α + 1, 0] into ½α²)
    phi = observed_gradient(AlphaNetwork(payload, flatten=True), x.reshape(4, 1, 8, 8),
                            torch.zeros(4, dtype=torch.long), "mse_onehot")
    for a, b in zip(phi, terms.phi, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_the_noise_free_correction_term_gives_the_record_back_under_the_spec_clip(digits):
    """W2 measured: Φ_k is uploaded without noise, so even the joint clip (which hides the record in the noisy
    views) leaves it readable from Φ_k."""
    weights, plan = _final_model(**PROBED)
    report = inversion_report(_probe("mpdp", **PROBED, epsilon=3.0), weights, plan, digits, steps=60, batches=(1,),
                              extractors=EXTRACTORS)
    views = report["batches"]["1"]["views"]
    best = {v: max(a["psnr"] for a in r["attacks"].values()) for v, r in views.items()}
    assert best["phi"] > 25 > 12 > max(best["recovered"], best["upload_at_w_hat"])


def test_inversion_skips_what_cannot_be_probed_and_says_why(digits):
    run = mpdp_run(mpdp_config("fedavg", clients=5, hidden=[32]))
    plan = run.algorithm.local.network
    dead = [torch.zeros_like(w) for w in run.model.parameters()]  # bias-free and all zero: the gradient is 0
    report = inversion_report(ProbeSetting.of(run), dead, plan, digits, steps=5, batches=(1, 10**4),
                              extractors=EXTRACTORS)
    assert "exactly zero" in report["batches"]["1"]["views"]["clear"]["skipped"]
    assert "psnr" not in report["batches"]["1"]
    assert "fewer than 10000" in report["batches"]["10000"]["skipped"]


def test_a_study_trains_one_extractor_per_public_records_and_seed(digits):
    """The cache gives the same extractor for the same public records and seed (equal to a fresh training), and a
    new one for another seed or other records."""
    from dpfl.evaluate.probe import Probe, public_extractor, shared_extractor

    images, labels = digits.x_test.reshape(-1, 1, 8, 8), digits.y_test

    def probe(x, y):
        return Probe(torch.nn.Identity(), [], x[:1], y[:1], "mse_onehot", None, "the server", (x, y), 10)

    cache: dict = {}
    first = shared_extractor(probe(images, labels), 0, cache)
    assert shared_extractor(probe(images.clone(), labels.clone()), 0, cache) is first
    assert shared_extractor(probe(images, labels), 1, cache) is not first
    assert shared_extractor(probe(images[1:], labels[1:]), 0, cache) is not first
    assert len(cache) == 3
    fresh = public_extractor(probe(images, labels), 0)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), fresh.state_dict().values(), strict=True))
