from __future__ import annotations

import json
import re
import shutil

import pytest

from dpfl.results import RunDirError, read_privacy, write_report

from .fakes import make_accounted_run, make_unaccounted_run

LINK = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")


def links(report_text):
    return LINK.findall(report_text)


def assert_links_match_plots(run, text):
    linked = links(text)
    assert all(link.startswith("plots/") for link in linked)
    for link in linked:
        assert (run / link).is_file(), link
    on_disk = {f"plots/{p.name}" for p in (run / "plots").glob("*.png")}
    assert set(linked) == on_disk


@pytest.fixture(scope="module")
def accounted_report(tmp_path_factory):
    run = make_accounted_run(tmp_path_factory.mktemp("report") / "run")
    path = write_report(run)
    return run, path.read_text()


def test_report_links_every_plot(accounted_report):
    run, text = accounted_report
    assert set(links(text)) == {"plots/accuracy.png", "plots/epsilon.png", "plots/budget_vs_spent.png"}
    assert_links_match_plots(run, text)


def test_report_states_status_and_guarantee(accounted_report):
    _, text = accounted_report
    assert "# Run report: dp-fedavg-test" in text
    assert "**Status:** complete (5 of 5 planned rounds)" in text
    assert "incomplete" not in text
    assert "Final accuracy:** 0.8500" in text
    assert "sample-level" in text and "RDP" in text and "k = 5 clients per round" in text
    assert "post-processing" in text
    assert "no epsilon is reported" not in text
    assert "```yaml\nname: dp-fedavg-test" in text


def test_report_shows_each_clients_spent_epsilon(accounted_report):
    run, text = accounted_report
    for c in read_privacy(run)["clients"]:
        row = f"| {c['client']} | {c['epsilon_budget']:.3f} |"
        line = next(line for line in text.splitlines() if line.startswith(row))
        assert f"| {c['epsilon_spent']:.3f} |" in line


def test_incomplete_run_says_so(tmp_path):
    run = make_accounted_run(tmp_path / "run", complete=False)
    text = write_report(run).read_text()
    assert "incomplete: no summary.json; resume with `dpfl run CONFIG --resume --out DIR`" in text
    assert "Best accuracy so far:** 0.8500 (round 5)" in text
    assert_links_match_plots(run, text)


def test_unaccounted_run_reports_no_epsilon(tmp_path):
    run = make_unaccounted_run(tmp_path / "run")
    (run / "plots").mkdir()
    shutil.copyfile(__file__, run / "plots" / "epsilon.png")  # a stale plot from elsewhere
    text = write_report(run).read_text()
    assert "no epsilon is reported" in text
    assert "a privacy mechanism ran for which dpfl computes no epsilon" in text  # the warning, restated
    assert not (run / "plots" / "epsilon.png").exists()
    assert not (run / "plots" / "budget_vs_spent.png").exists()
    assert links(text) == ["plots/accuracy.png"]
    assert "No epsilon plot: the run is not accounted" in text
    assert "Per-client privacy" not in text
    assert_links_match_plots(run, text)


def test_many_clients_summary_and_first_rows(tmp_path):
    run = make_accounted_run(tmp_path / "run", n_clients=60, rounds=2)
    text = write_report(run).read_text()
    clients = read_privacy(run)["clients"]
    assert "First 20 of 60 clients" in text
    assert re.search(r"^\| min \|", text, re.M) and re.search(r"^\| max \|", text, re.M)
    spent = sorted(c["epsilon_spent"] for c in clients)
    assert f"| {spent[-1]:.3f} |" in text
    rows = [line for line in text.splitlines() if re.match(r"^\| \d+ \|", line)]
    assert [int(r.split("|")[1]) for r in rows] == list(range(20))


def test_report_on_a_non_run_directory(tmp_path):
    with pytest.raises(RunDirError, match="not a dpfl run directory"):
        write_report(tmp_path)
    assert not (tmp_path / "report.md").exists()


def test_incomplete_run_before_privacy_json(tmp_path):
    run = make_accounted_run(tmp_path / "run", complete=False)
    (run / "privacy.json").unlink()
    text = write_report(run).read_text()
    assert "incomplete" in text and "privacy.json` has not been written yet" in text
    assert "so far is 1.411 (round 5)" in text  # epsilon_max of the last metrics row, as written
    assert_links_match_plots(run, text)
    assert (run / "plots" / "epsilon.png").is_file() and not (run / "plots" / "budget_vs_spent.png").exists()


def test_non_finite_and_missing_budgets_are_shown_not_invented(tmp_path):
    run = make_accounted_run(tmp_path / "run", n_clients=3, rounds=2)
    privacy = json.loads((run / "privacy.json").read_text())
    privacy["clients"][0]["epsilon_budget"] = None
    privacy["clients"][1]["epsilon_budget"] = "inf"  # the ledger's encoding of an unlimited budget
    privacy["clients"][2]["epsilon_spent"] = "inf"
    (run / "privacy.json").write_text(json.dumps(privacy))
    text = write_report(run).read_text()
    assert re.search(r"^\| 0 \| — \|", text, re.M) and re.search(r"^\| 1 \| inf \|", text, re.M)
    assert re.search(r"^\| 2 \| 2\.000 \| 1e-05 \| [0-9.]+ \| inf \|", text, re.M)
    assert not (run / "plots" / "budget_vs_spent.png").exists()  # no client with finite budget and spend
    assert "No budget-vs-spent plot" in text
    assert_links_match_plots(run, text)


def test_report_labels_heuristic_calibration_misreports_and_budget_violations(tmp_path):
    run = make_accounted_run(tmp_path / "heuristic")
    privacy = json.loads((run / "privacy.json").read_text())
    privacy.update(calibration="pfa-heuristic", calibrated_to="own", meets_budgets=False, oracle=True,
                   heuristic="noise from PFA's heuristic formula", warning="NOT PRIVATE AS PROMISED: clients [1]")
    for c in privacy["clients"]:
        c["epsilon_heuristic"] = c["epsilon_budget"]
        c["epsilon_reported"] = c["epsilon_budget"]
    privacy["clients"][0]["epsilon_reported"] = 10 * privacy["clients"][0]["epsilon_budget"]
    (run / "privacy.json").write_text(json.dumps(privacy))
    report = write_report(run).read_text()
    assert "**not a DP guarantee**" in report
    assert "heuristic ε (not a guarantee)" in report
    assert "Every client within its budget:** **no**" in report
    assert "NOT PRIVATE AS PROMISED" in report
    assert "Misreported budgets" in report and "client 0 reported" in report
    assert "client 1 reported" not in report
    assert "Oracle run" in report


def test_report_shows_the_labelled_aggregate_view_and_the_personalised_accuracy(tmp_path):
    run = make_accounted_run(tmp_path / "udp")
    privacy = json.loads((run / "privacy.json").read_text())
    privacy.update(eps_per_participation=0.5, eps_total_mean=2.0, eps_total_max=3.0, user_level=None)
    privacy["aggregate_view"] = {"epsilon": 1.234, "delta": 1e-5, "relation": "add_remove", "noise_multiplier": 2.0,
                                 "sample_rate": 0.1, "rounds": 5, "valid_for": "an observer of the sums only"}
    (run / "privacy.json").write_text(json.dumps(privacy))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[2].update(acc_personal=0.777, acc_personal_clients=7)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = write_report(run).read_text()
    assert "Aggregate view (NOT the guarantee against this run's server)" in report
    assert "ε = 1.234" in report and "an observer of the sums only" in report
    assert "Personalised accuracy (last):** 0.777" in report and "7 clients" in report
    # the method's metric comes first, and the server's model's accuracy says whose it is
    assert report.index("Personalised accuracy") < report.index("**Final accuracy:**")
    assert "the server's model alone" in report.split("**Final accuracy:**")[1].splitlines()[0]
    assert "One participation costs at most:** ε = 0.5" in report and "No user-level guarantee" in report


def test_a_method_that_states_its_own_guarantee_is_reported_with_it(tmp_path):
    """MP-DP's family: no epsilon in the ledger, but the method's own per-round statement (privacy.json `stage`) is
    what the report shows, nominal and labelled, instead of "no guarantee"."""
    run = make_unaccounted_run(tmp_path / "run")
    privacy = read_privacy(run)
    privacy.update(algorithm="mpdp", warning="no epsilon in dpfl's per-client ledger: the method states its own",
                   stage={"guarantee": "nominal", "per_round_epsilon": 3.0, "delta": 1e-5,
                          "label": "nominal — assumes the idealised Gaussian model", "stamps": [],
                          "per_client": [{"client": 0, "composed": {"epsilon": 9.0, "which": "basic"}}]})
    (run / "privacy.json").write_text(json.dumps(privacy))
    text = write_report(run).read_text()
    assert "the method states its own guarantee** (privacy.json `stage`)" in text
    assert "- guarantee: NOMINAL, per round and client eps = 3, delta = 1e-05 (nominal — assumes" in text
    assert "composed over the run per client (nominal, basic): eps from 9 to 9" in text
    assert "dpfl computed no guarantee for it" not in text


def test_a_populations_report_lists_its_classes(tmp_path):
    """privacy.json above PER_CLIENT_LIMIT clients has `clients_summary`, not `clients` (docs/scale.md): the report
    tables each class (its size, first client and the columns a client row has), not "lists no clients"."""
    run = make_accounted_run(tmp_path / "run", n_clients=2)
    privacy = json.loads((run / "privacy.json").read_text())
    row = {"epsilon_budget": 8.0, "delta": 1e-7, "noise_multiplier": 1.25, "batch_size": 2, "records": 2}
    privacy["clients_summary"] = {"clients": 1_000_000, "classes_count": 2, "classes": [
        {"clients": 999_990, "first_client": 0, **row, "epsilon_spent": 0.0},
        {"clients": 10, "first_client": 3, **row, "epsilon_spent": 0.5, "epsilon_heuristic": 9.0}]}
    del privacy["clients"]
    (run / "privacy.json").write_text(json.dumps(privacy))
    text = write_report(run).read_text()
    assert "1000000 clients in 2 classes of alike clients" in text and "lists no clients" not in text
    rows = [[x.strip() for x in line.strip("|").split("|")] for line in text.splitlines()
            if re.match(r"^\| \d+ \| \d+ \|", line)]
    assert rows == [["999990", "0", "8.000", "1e-07", "1.25", "0.000", "2", "2"],
                    ["10", "3", "8.000", "1e-07", "1.25", "0.500", "2", "2"]]
