"""`dpfl reproduce attacks`: every setting runs its training, inversion, membership inference and audit, results.csv
has the issue's columns, a re-run skips finished settings, bad input is one line."""

import csv
import json

import pytest
from cli_runner import cli
from lock_holder import hold_in_another_process, kill

from dpfl.evaluate import probe
from dpfl.reproduce import attacks
from dpfl.reproduce.jobs import GridError


@pytest.fixture
def small(monkeypatch):  # the ci scale's machinery with fewer canaries and attack steps (the real one: ~10 min)
    monkeypatch.setitem(attacks.SCALES, "ci", {**attacks.SCALES["ci"], "canaries": 20, "inversion_steps": 5})
    monkeypatch.setattr(probe, "EXTRACTOR_EPOCHS", 1)


# all 7 settings twice (~20 s): the integration tier; one setting runs end to end in the default tier (the next test)
@pytest.mark.integration
def test_reproduce_attacks_ci_smoke(tmp_path, small):
    out = tmp_path / "attacks"
    # 2 rounds: DP-SGD clients (10 of 20 per round) are planned one participation; at 1 round, half of one, and the
    # run is refused (it would train nothing)
    csv_path, md_path, rows = attacks.run_study("ci", out, rounds=2)
    assert all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    assert all(r["accuracy"] is not None for r in rows)  # every released model was trained
    table = list(csv.DictReader(csv_path.open()))
    assert {"method", "epsilon", "psnr", "mia_asr", "mia_auc", "tpr_at_1fpr", "eps_lower",
            "eps_reported"} <= set(table[0])
    assert [(r["method"], r["epsilon"]) for r in table] == [("fedavg", "")] + [
        (m, e) for m in ("dpsgd", "client") for e in ("1.0", "3.0", "8.0")]
    assert {r["audit_unit"] for r in table} == {"client", "sample"}
    assert all(float(r["eps_reported"]) <= float(r["epsilon"]) + 1e-6 for r in table if r["method"] != "fedavg")
    assert (out / "runs" / "attacks_ci_fmnist-fedavg" / "inversion.png").is_file()
    stamp = (out / "runs" / "attacks_ci_fmnist-client-eps1" / "attacks.json").stat().st_mtime
    attacks.run_study("ci", out, rounds=2)
    assert (out / "runs" / "attacks_ci_fmnist-client-eps1" / "attacks.json").stat().st_mtime == stamp
    with pytest.raises(GridError, match="holds another run.*rounds: 2"):  # other --rounds: not mixed in
        attacks.run_study("ci", out, rounds=3)
    assert "ε lower" in md_path.read_text()
    assert "(7 settings). Written by: dpfl " in md_path.read_text()  # each setting's environment in its attacks.json


def test_a_diverged_model_keeps_its_row_without_membership_numbers(tmp_path, small, monkeypatch):
    """A released model with non-finite outputs is not attacked (and says so); its run, inversion and audit stay."""
    from dpfl.attacks.membership import NonFiniteOutputsError

    def diverged(run_dir):
        raise NonFiniteOutputsError("model outputs contain NaN or infinite values")

    monkeypatch.setattr(attacks, "attack_released_model", diverged)
    out = tmp_path / "attacks"
    csv_path, md_path, rows = attacks.run_study("ci", out, rounds=1, settings_pattern="fedavg")
    assert rows[0]["status"] == "ok" and rows[0]["mia_asr"] is None and rows[0]["psnr"] is not None
    assert rows[0]["eps_lower"] is not None and "diverged" in rows[0]["mia_skipped"]
    saved = json.loads((out / "runs" / "attacks_ci_fmnist-fedavg" / "attacks.json").read_text())
    assert "diverged" in saved["mia_skipped"]
    assert "| fedavg | n/a | 0 |" in md_path.read_text()


def test_reproduce_attacks_bad_scale_is_one_line(tmp_path):
    code, _, err = cli("reproduce", "attacks", "--scale", "huge", "--out", tmp_path)
    assert code == 2 and "--scale must be ci" in err


def test_overfit_scale_derives_the_same_methods_from_a_base_that_overfits():
    """`--scale overfit`: fedavg, dpsgd and client at budgets 1, 8 and 100, all on the overfitting base (50 records
    per client, 100 rounds of 5 epochs, every client every round); nothing else differs from the ci machinery."""
    derived = attacks.settings("overfit")
    assert [attacks.setting_name(m, e) for m, e, _ in derived] == [
        "fedavg", "dpsgd-eps1", "dpsgd-eps8", "dpsgd-eps100", "client-eps1", "client-eps8", "client-eps100"]
    for method, eps, cfg in derived:
        assert (cfg.data.clients, cfg.data.max_train_samples, cfg.training.rounds, cfg.training.local_epochs) == \
            (10, 500, 100, 5)
        assert cfg.training.selection.kind == "all" and cfg.name.startswith("attacks_overfit_fmnist-")
        if method != "fedavg":
            assert cfg.privacy.budgets == eps and cfg.privacy.unit == ("sample" if method == "dpsgd" else "client")
    assert [attacks.setting_name(m, e) for m, e, _ in attacks.settings("overfit", pattern="dpsgd-eps1*")] == [
        "dpsgd-eps1", "dpsgd-eps100"]


def test_seeds_add_directories_and_keep_seed_zeros(tmp_path, monkeypatch):
    """--seeds N: every setting on seeds 0..N-1, seed by seed; seed 0 keeps its name (finished runs stay valid), the
    others get -seed<s> and their own config seed; results.md adds mean ± std over seeds."""
    one = attacks.settings("ci")
    two = attacks.settings("ci", seeds=2)
    assert [c for _, _, c in two[:7]] == [c for _, _, c in one]  # seed 0: the same configs as before seeds
    assert [(c.name, c.seed) for _, _, c in two[7:9]] == [("attacks_ci_fmnist-fedavg-seed1", 1),
                                                         ("attacks_ci_fmnist-dpsgd-eps1-seed1", 1)]
    assert [c.seed for _, _, c in attacks.settings("ci", pattern="client-eps8", seeds=3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="--seeds must be >= 1"):
        attacks.settings("ci", seeds=0)
    out = tmp_path / "attacks"
    monkeypatch.setattr(attacks, "run_setting", lambda m, e, c, o, s, cache: {
        "method": m, "epsilon": e, "seed": c.seed, "mia_asr": 0.5 + 0.1 * c.seed, "status": "ok"})
    _, md_path, rows = attacks.run_study("ci", out, settings_pattern="fedavg", seeds=2)
    assert [(r["method"], r["seed"]) for r in rows] == [("fedavg", 0), ("fedavg", 1)]
    md = md_path.read_text()
    assert "Over seeds" in md and "| fedavg | n/a | 2 |" in md and "0.550 ± 0.071" in md
    code, text, _ = cli("reproduce", "attacks", "--scale", "ci", "--out", tmp_path / "other", "--dry-run", "--seeds", 2,
                        "--settings", "fedavg")  # as a user lists the grid
    assert code == 0 and [line.split(" (")[0] for line in text.strip().splitlines()] == ["fedavg seed 0",
                                                                                        "fedavg seed 1"]
    assert "attacks_ci_fmnist-fedavg-seed1" in text
    code, _, err = cli("reproduce", "attacks", "--scale", "ci", "--out", tmp_path / "other", "--dry-run", "--seeds", 0)
    assert code == 2 and "--seeds must be >= 1" in err


def _finished(out, method, epsilon, cfg, psnr):
    """A setting as run_setting leaves it when done: its run's config.yaml and attacks.json."""
    from dpfl.experiment.config import config_to_yaml
    from dpfl.results.environment import describe_job

    d = out / "runs" / cfg.name
    (d / "run").mkdir(parents=True)
    (d / "run" / "config.yaml").write_text(config_to_yaml(cfg))
    (d / "attacks.json").write_text(json.dumps({"method": method, "epsilon": epsilon, "psnr": psnr, "accuracy": 0.5,
                                                "status": "ok", "environment": describe_job()}))


def test_settings_dry_run_and_tables_only_without_computing(tmp_path, monkeypatch):
    out = tmp_path / "attacks"
    everything = attacks.settings("ci")
    assert [attacks.setting_name(m, e) for m, e, _ in everything] == [
        "fedavg", "dpsgd-eps1", "dpsgd-eps3", "dpsgd-eps8", "client-eps1", "client-eps3", "client-eps8"]
    method, eps, cfg = everything[4]
    _finished(out, method, eps, cfg, 7.5)
    code, text, _ = cli("reproduce", "attacks", "--scale", "ci", "--out", out, "--dry-run",
                        "--settings", "fedavg,client-*")
    assert code == 0
    assert [line.split(" (")[0] + ": " + line.rsplit(": ", 1)[1] for line in text.strip().splitlines()] == [
        "fedavg seed 0: new", "client-eps1 seed 0: finished", "client-eps3 seed 0: new", "client-eps8 seed 0: new"]
    assert not (out / "results.csv").exists()  # a dry run writes nothing

    code, text, _ = cli("reproduce", "attacks", "--scale", "ci", "--out", out, "--tables-only")
    assert code == 0 and "1 ok, 0 failed" in text
    rows = list(csv.DictReader((out / "results.csv").open()))
    # its attacks.json has no seed (as rows written before seeds existed): read back as seed 0
    assert [(r["method"], r["epsilon"], r["seed"], r["psnr"]) for r in rows] == [("client", "1.0", "0", "7.5")]
    md = (out / "results.md").read_text()
    assert "holds 1 of the selection's 7 settings" in md
    assert "Command: `dpfl reproduce attacks --scale ci --out" in md and "--tables-only" not in md

    computed = []  # --settings computes only the selection (the real run_setting: test above)
    monkeypatch.setattr(attacks, "run_setting", lambda m, e, c, o, s, cache: computed.append(c.name) or
                        {"method": m, "epsilon": e, "status": "ok"})
    attacks.run_study("ci", out, settings_pattern="dpsgd-eps[13]")
    assert computed == [c.name for _, _, c in everything[1:3]]

    code, _, err = cli("reproduce", "attacks", "--scale", "ci", "--out", tmp_path / "empty", "--tables-only")
    assert code == 2 and "no finished setting" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("reproduce", "attacks", "--scale", "ci", "--out", out, "--dry-run", "--settings", "dp-*")
    assert code == 2 and "matches no setting (settings: fedavg, dpsgd-eps1," in err
    code, _, err = cli("reproduce", "attacks", "--scale", "ci", "--out", out, "--dry-run", "--rounds", "3")
    assert code == 2 and "holds another run" in err  # client-eps1 was made with the base config's rounds
    code, _, err = cli("reproduce", "attacks", "--scale", "ci", "--out", out, "--dry-run", "--tables-only")
    assert code == 2


def test_a_setting_another_process_runs_is_skipped_and_written_nothing(tmp_path, small):
    """Two `dpfl reproduce attacks` (or --workers) on one --out: a setting whose directory another process holds (its
    run, attacks and audit) is skipped, not run twice; the other settings run."""
    from dpfl.experiment.run_lock import LOCK_FILE

    out = tmp_path / "attacks"
    held = out / "runs" / "attacks_ci_fmnist-fedavg"
    held.mkdir(parents=True)
    proc = hold_in_another_process(held)
    lines: list[str] = []
    try:
        rows = attacks.run_study("ci", out, rounds=1, settings_pattern="fedavg,client-eps8", progress=lines.append)[2]
    finally:
        kill(proc)
    assert [(r["method"], r["status"]) for r in rows] == [("client", "ok")]
    assert any(line.startswith("  skipped: ") and "in use by another process" in line for line in lines), lines
    assert [p.name for p in held.iterdir()] == [LOCK_FILE]
    proc = hold_in_another_process(held)
    try:
        with pytest.raises(GridError, match="every selected setting is being run by another process"):
            attacks.run_study("ci", out, rounds=1, settings_pattern="fedavg")
    finally:
        kill(proc)
    code, _, err = cli("reproduce", "attacks", "--scale", "ci", "--out", out, "--workers", "2", "--tables-only")
    assert code == 2 and "--tables-only runs none" in err
