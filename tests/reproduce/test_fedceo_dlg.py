"""`dpfl reproduce fedceo --dlg` (spec fedceo.md §8, offline variant): its points, files, resume and refusals."""

import json

import pytest
from cli_runner import cli

from dpfl.experiment.config import validate_config
from dpfl.reproduce.fedceo_dlg import dlg_points, run_dlg_study

BASE = validate_config({
    "name": "dlg", "seed": 0, "data": {"dataset": "digits", "clients": 10}, "model": {"name": "cnn_digits"},
    "algorithm": {"name": "fedceo", "params": {"lam": 0.5, "theta": 1.04, "interval": 2}},
    "training": {"rounds": 4, "local_epochs": 1, "batch_size": 16, "optimizer": {"lr": 0.1},
                 "selection": {"kind": "fixed", "k": 3}},
    "privacy": {"mechanism": "dpsgd", "clip": 1.0, "noise_multiplier": 1.0, "budgets": float("inf"),
                "delta": 1e-5}})


def test_points_are_fedavg_then_upload_and_smoothings_per_sigma():
    points = dlg_points(BASE, (1.0, 2.0), (1, 3))
    assert [p.name for p in points] == ["fedavg", "upload-sg1.0", "smoothed1-sg1.0", "smoothed3-sg1.0",
                                        "upload-sg2.0", "smoothed1-sg2.0", "smoothed3-sg2.0"]
    assert points[0].config.algorithm.name == "fedavg" and points[0].config.privacy.mechanism == "none"
    assert points[4].config.privacy.noise_multiplier == 2.0 and points[4].config.algorithm.name == "fedceo"
    with pytest.raises(ValueError, match="needs a FedCEO config"):
        dlg_points(points[0].config)


def test_the_study_writes_its_tables_and_resumes(tmp_path):
    lines = []
    csv_path, md_path, rows = run_dlg_study(tmp_path, BASE, steps=4, sigmas=(1.0,), smoothings=(1,),
                                            progress=lines.append)
    assert [r["point"] for r in rows] == ["fedavg", "upload-sg1.0", "smoothed1-sg1.0"]
    assert all(r["steps"] == 4 and r["dlg_psnr"] > 0 and r["ig_psnr"] > 0 for r in rows)
    saved = json.loads((tmp_path / "smoothed1-sg1.0" / "inversion.json").read_text())
    assert saved["after_smoothing"] == 1 and "smoothed model" in saved["observer"] and saved["environment"]["torch"]
    assert (tmp_path / "fedavg" / "inversion.png").stat().st_size > 1000
    md = md_path.read_text()
    assert "mean public image" in md and "FedCEO smoothed model, smoothing 1" in md
    assert "Points computed by: dpfl " in md and "(3 points). Written by: dpfl " in md
    again = []
    _, _, rows2 = run_dlg_study(tmp_path, BASE, steps=4, sigmas=(1.0,), smoothings=(1,), progress=again.append)
    assert rows2 == rows and all("saved before" in line for line in again)
    assert csv_path.read_text().startswith("point,sigma_g,attacked")


def test_cli_refuses_other_scales_and_options(tmp_path):
    code, _, err = cli("reproduce", "fedceo", "--dlg", "--scale", "full", "--out", tmp_path)
    assert code == 2 and "--scale ci" in err
    code, _, err = cli("reproduce", "fedceo", "--dlg", "--scale", "ci", "--seeds", 2, "--out", tmp_path)
    assert code == 2 and "takes only --out" in err
