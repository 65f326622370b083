"""The inversion probe (what the server receives from one client) and `dpfl attack invert` / `dpfl attack mia`."""

import json

import pytest
import torch
from cli_runner import cli

from dpfl.attacks.inversion import observed_gradient
from dpfl.evaluate.probe import invert_probe, matched, probe_round
from dpfl.experiment.config import config_to_yaml, validate_config
from dpfl.reproduce.jobs import config_dir

BASE = {"name": "probe", "seed": 0, "data": {"dataset": "digits", "clients": 10}, "model": {"name": "cnn_digits"},
        "training": {"rounds": 3, "local_epochs": 1, "batch_size": 16, "optimizer": {"lr": 0.1}},
        "evaluation": {"every": 3}}
FEDAVG = {**BASE, "algorithm": {"name": "fedavg"}}
DPSGD = {**BASE, "algorithm": {"name": "dp_fedavg_local"},
         "privacy": {"mechanism": "dpsgd", "clip": 1.0, "budgets": 8.0, "delta": 1e-5}}


def test_a_fedavg_probe_is_the_exact_gradient_of_the_clients_records():
    probe = probe_round(validate_config(FEDAVG), 4)
    assert probe.unit is None and len(set(probe.y.tolist())) == 4  # distinct labels, all from the private classes
    assert int(probe.y.max()) < 5 and int(probe.public[1].min()) >= 5
    want = observed_gradient(probe.model, probe.x, probe.y, "cross_entropy")
    for g, w in zip(probe.gradient, want, strict=True):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-6)  # float32 one-step update, divided by lr


def test_dp_sgd_uploads_leak_far_less_than_fedavg_uploads():
    # measured: FedAvg batch 1, Inverting Gradients 19.1 dB (DLG 11.1 on this ReLU CNN); DP-SGD at eps 8: ~4-6 dB
    plain = invert_probe(probe_round(validate_config(FEDAVG), 1), steps=200)
    private = invert_probe(probe_round(validate_config(DPSGD), 1), steps=200)
    assert plain["inverting_gradients"]["psnr"] > 15
    assert private["inverting_gradients"]["psnr"] < plain["inverting_gradients"]["psnr"] - 8
    # not asserted: feature MSE, which at batch 1 here was LOWER for the DP run's noise image (0.0053 vs 0.0091):
    # the extractor (trained on the other classes) maps both far from the record's features in a similar way


def test_matching_undoes_a_permutation_only():
    truth = torch.rand(4, 1, 3, 3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(matched(truth[[2, 0, 3, 1]], truth), truth)


@pytest.mark.parametrize("change,match", [
    ({"data": {"dataset": "synthetic", "clients": 4}, "model": {"name": "logr"}}, "image classification dataset"),
    ({"training": {**BASE["training"], "batch_size": 16}}, None),
])
def test_bad_probes_are_refused(change, match):
    cfg = validate_config({**FEDAVG, **change})
    if match is None:
        with pytest.raises(ValueError, match="larger than client 0's"):
            probe_round(cfg, 500)
        with pytest.raises(ValueError, match="--batch must be >= 1"):
            probe_round(cfg, 0)
    else:
        with pytest.raises(ValueError, match=match):
            probe_round(cfg, 1)


def test_secure_aggregation_has_no_single_upload_to_invert():
    code, _, err = cli("attack", "invert", config_dir("secure") / "digits_distributed.yaml", "--out", "unused")
    assert code == 2 and "sees only the sum" in err


def test_cli_invert_and_mia_write_their_files(tmp_path):
    path = tmp_path / "fedavg.yaml"
    path.write_text(config_to_yaml(validate_config(FEDAVG)))
    code, stdout, err = cli("attack", "invert", path, "--batch", 2, "--steps", 20, "--out", tmp_path / "inv")
    assert code == 0, err
    report = json.loads((tmp_path / "inv" / "inversion.json").read_text())
    assert set(report["attacks"]) == {"dlg", "inverting_gradients"} and report["batch"] == 2
    assert (tmp_path / "inv" / "inversion.png").stat().st_size > 1000 and "PSNR" in stdout
    code, _, err = cli("attack", "invert", path, "--out", tmp_path / "inv")
    assert code == 2 and "already exists" in err
    code, _, err = cli("run", path, "--out", tmp_path / "run")
    assert code == 0, err
    code, stdout, err = cli("attack", "mia", tmp_path / "run", "--out", tmp_path / "mia")
    assert code == 0, err
    mia = json.loads((tmp_path / "mia" / "mia.json").read_text())
    assert set(mia["attacks"]) == {"loss", "confidence", "shadow"}
    assert all(0 <= a["asr"] <= 1 and "fpr" not in a for a in mia["attacks"].values())
    assert (tmp_path / "mia" / "roc.png").stat().st_size > 1000
    code, _, err = cli("attack", "mia", tmp_path / "inv", "--out", tmp_path / "mia2")
    assert code == 2 and "not a finished dpfl run directory" in err


def test_a_normalising_config_is_attacked_in_image_space():
    """With `normalize`, the probe's records are [0, 1] images and its model normalises them as the pipeline did:
    the probe gradient is the gradient of those images through that model (before, PSNR compared a [0, 1]-clamped
    reconstruction with normalised records)."""
    cfg = validate_config({**FEDAVG, "data": {"dataset": "digits", "clients": 10,
                                              "options": {"normalize": [0.3, 0.4]}}})
    probe = probe_round(cfg, 2)
    assert float(probe.x.min()) >= -1e-6 and float(probe.x.max()) <= 1 + 1e-6 and float(probe.x.max()) > 0.9
    want = observed_gradient(probe.model, probe.x, probe.y, "cross_entropy")
    for g, w in zip(probe.gradient, want, strict=True):
        assert torch.allclose(g, w, rtol=1e-3, atol=1e-5)
    plain = probe_round(validate_config(FEDAVG), 2)  # the same records, never normalised
    assert torch.allclose(probe.x, plain.x, atol=1e-6)


FEDCEO = {**BASE, "algorithm": {"name": "fedceo", "params": {"lam": 1e12, "theta": 1.0, "interval": 2}},
          "training": {**BASE["training"], "selection": {"kind": "fixed", "k": 4}},
          "privacy": {"mechanism": "dpsgd", "clip": 1.0, "noise_multiplier": 1.0, "budgets": float("inf"),
                      "delta": 1e-5}}


def test_fedceo_after_smoothing_attacks_the_smoothed_model_of_client_0():
    """Threshold ~0 (lam huge) leaves every model as it is: the smoothed probe is the raw upload's (same noise);
    a threshold that zeroes every singular value hands back the zero model, so the implied update is -w."""
    raw = probe_round(validate_config(FEDCEO), 1)
    kept = probe_round(validate_config(FEDCEO), 1, smoothing=1)
    for a, b in zip(raw.gradient, kept.gradient, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    assert "smoothed model after smoothing 1" in kept.observer
    zeroed = validate_config({**FEDCEO, "algorithm": {"name": "fedceo", "params": {"lam": 1e-12, "interval": 2}}})
    probe = probe_round(zeroed, 1, smoothing=1)
    lr = FEDCEO["training"]["optimizer"]["lr"]
    for g, p in zip(probe.gradient, (p for p in probe.model.parameters() if p.requires_grad), strict=True):
        assert torch.allclose(g, p.detach() / lr, rtol=1e-5, atol=1e-6)  # -(0 - w) / lr
    with pytest.raises(ValueError, match="no smoothing"):
        probe_round(validate_config(DPSGD), 1, smoothing=1)


def test_attacks_on_a_dropout_model_are_reproducible():
    """mlp2 has dropout: the attacks run it in eval mode (the client's mask is unknown to the attacker), so the same
    probe gives the same reconstructions whatever the global RNG did in between (before: a new mask every
    forward, and PSNR moved by tenths of a dB between identical calls)."""
    cfg = validate_config({**FEDAVG, "model": {"name": "mlp2"}})
    probe = probe_round(cfg, 1)
    extractor = torch.nn.Flatten()  # the feature metric is not under test here
    first = invert_probe(probe, steps=15, extractor=extractor)
    torch.manual_seed(123)
    second = invert_probe(probe, steps=15, extractor=extractor)
    for name in first:
        assert torch.equal(first[name]["reconstruction"], second[name]["reconstruction"])


def test_cli_invert_after_smoothing(tmp_path):
    path = tmp_path / "fedceo.yaml"
    path.write_text(config_to_yaml(validate_config(FEDCEO)))
    code, stdout, err = cli("attack", "invert", path, "--steps", 5, "--after-smoothing", 2, "--out", tmp_path / "inv")
    assert code == 0, err
    report = json.loads((tmp_path / "inv" / "inversion.json").read_text())
    assert report["after_smoothing"] == 2 and "smoothed model" in stdout
    plain = tmp_path / "fedavg.yaml"
    plain.write_text(config_to_yaml(validate_config(FEDAVG)))
    code, _, err = cli("attack", "invert", plain, "--after-smoothing", 1, "--out", tmp_path / "x")
    assert code == 2 and "no smoothing" in err
