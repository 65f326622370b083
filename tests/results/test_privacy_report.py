"""privacy.json as a typed `PrivacyReport`: on the privacy.json of small real runs, the typed fields are the file's
values, `to_dict()` is the file's content in the file's key order (so privacy.json's bytes would not change),
`rigorous` follows what the file says, and the deprecated dict-style access warns, naming the attribute to use."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest

import dpfl
from dpfl.results.privacy_report import ClientPrivacy, PrivacyReport, read_privacy_report
from dpfl.results.run_files import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"
SMALL = ["training.rounds=2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two finished demo runs (10 clients, 2 rounds): noise calibrated by the accountant, and by PFA's heuristic."""
    base = tmp_path_factory.mktemp("privacy_report")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*dict-style access to a typed result", category=DeprecationWarning)
        dpfl.run(DEMO, overrides=SMALL, out=base / "accountant")
        dpfl.run(DEMO, overrides=[*SMALL, "privacy.calibration=pfa-heuristic"], out=base / "heuristic")
    return {"accountant": base / "accountant", "heuristic": base / "heuristic"}


def raw(run_dir: Path) -> dict:
    return json.loads((run_dir / "privacy.json").read_text())


@pytest.mark.parametrize("name", ["accountant", "heuristic"])
def test_to_dict_is_the_file_key_order_included_and_writes_the_same_bytes(runs, name, tmp_path):
    d = raw(runs[name])
    report = PrivacyReport.from_dict(d)
    assert report.to_dict() == d
    # the order of keys at every level (top, each client row, the guarantee block): json.dumps writes them in order
    assert json.dumps(report.to_dict()) == json.dumps(d)
    assert list(report.to_dict()) == list(d) == list(report.key_order)
    again = write_json_atomic(tmp_path / "privacy.json", report.to_dict())  # as the run directory writes it
    assert again.read_bytes() == (runs[name] / "privacy.json").read_bytes()
    assert read_privacy_report(runs[name]) == report


def test_the_typed_fields_are_the_files_values(runs):
    d = raw(runs["accountant"])
    r = read_privacy_report(runs["accountant"])
    assert (r.algorithm, r.unit, r.observer, r.mechanism, r.accountant) == (
        d["algorithm"], d["unit"], d["observer"], d["mechanism"], d["accountant"])
    assert r.unit == "sample" and r.accountant == "rdp"
    assert r.client_sampling is not None
    assert (r.client_sampling.kind, r.client_sampling.k, r.client_sampling.rate) == tuple(d["client_sampling"].values())
    assert (r.local_sampling, r.stop_reason, r.accounted, r.meets_budgets) == (
        d["local_sampling"], d["stop_reason"], True, True)
    assert len(r.clients) == len(d["clients"]) == 10 and all(isinstance(c, ClientPrivacy) for c in r.clients)
    assert r.epsilon == tuple(c["epsilon_guarantee"] for c in d["clients"])
    assert r.delta == tuple(c["delta"] for c in d["clients"])
    assert r.epsilon_budget == tuple(c["epsilon_budget"] for c in d["clients"])
    assert r.noise_multiplier == tuple(c["noise_multiplier"] for c in d["clients"])
    assert r.epsilon_spent == tuple(c["epsilon_spent"] for c in d["clients"])
    assert [c.records for c in r.clients] == [c["records"] for c in d["clients"]]
    assert r.guarantee is not None and r.guarantee.source == d["guarantee"]["source"]
    assert r.epsilon_max == d["guarantee"]["epsilon_max"] == max(r.epsilon)
    assert r.guarantee.other_epsilons == d["guarantee"]["other_epsilons"]
    assert r.noise_calibration == d["noise_calibration"] and r.noise_source == "accountant"
    assert r.heuristic is None and all(c.epsilon_heuristic is None for c in r.clients)
    # what has no field of its own is kept as in the file
    assert set(r.extra) == {"eps_per_participation", "eps_total_max", "eps_total_mean", "user_level",
                            "user_level_note", "ledger"}
    assert r.extra["ledger"] == d["ledger"] and r.extra["eps_per_participation"] == d["eps_per_participation"]


def test_the_outcome_of_dpfl_run_holds_the_report_of_its_privacy_json(tmp_path):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*dict-style access to a typed result", category=DeprecationWarning)
        outcome = dpfl.run(DEMO, overrides=["training.rounds=1"], out=tmp_path / "run")
        assert isinstance(outcome.privacy, dpfl.PrivacyReport)
        assert outcome.privacy.to_dict() == raw(tmp_path / "run")
        assert outcome.epsilon == list(outcome.privacy.epsilon)
        assert outcome.summary["epsilon_max"] == outcome.privacy.epsilon_max
        assert outcome.privacy  # truthiness does not go through the deprecated len()


def test_rigorous_for_the_accountants_calibration_and_not_for_pfas_heuristic(runs):
    calibrated = read_privacy_report(runs["accountant"])
    assert calibrated.rigorous and calibrated.caveats == ()
    heuristic = read_privacy_report(runs["heuristic"])
    assert heuristic.calibration == "pfa-heuristic" and heuristic.noise_source == "pfa-heuristic"
    assert not heuristic.rigorous
    assert [c.split(":")[0] for c in heuristic.caveats] == ["heuristic calibration (heuristic)"]
    assert all(c.epsilon_heuristic is not None for c in heuristic.clients)
    # the guarantee itself is still the accountant's epsilon of the noise used
    assert heuristic.epsilon == heuristic.epsilon_spent


@pytest.mark.parametrize(("change", "caveat"), [
    ({"accounted": False}, "not accounted"),
    ({"meets_budgets": False, "warning": "NOT PRIVATE AS PROMISED: clients [3] spent more than their budgets"},
     "budget violation"),
    ({"per_upload_amplification": "ASSUMED: the server cannot tell which clients took part"}, "assumption"),
    ({"fdp": {"headline": "shifted-interpolation"}}, "assumption"),
    ({"secure_aggregation": {"protocol": "secagg", "discretisation": "UNACCOUNTED: uploads are rounded"}},
     "unaccounted stage"),
])
def test_what_privacy_json_says_against_the_guarantee_makes_it_not_rigorous(runs, change, caveat):
    d = {**raw(runs["accountant"]), **change}
    report = PrivacyReport.from_dict(d)
    assert not report.rigorous
    assert any(c.startswith(caveat) for c in report.caveats), report.caveats
    assert report.to_dict() == d


@pytest.mark.parametrize(("config", "overrides", "block", "caveat"), [
    ("secure/digits_distributed.yaml", [], "secure_aggregation",
     "unaccounted stage (secure_aggregation.discretisation): UNACCOUNTED"),
    ("digits_udp.yaml", ["privacy.per_upload_amplification=true", "training.selection={kind: poisson, rate: 0.5}"],
     "aggregate_view", "assumption (per_upload_amplification): ASSUMED"),
])
def test_real_runs_with_unaccounted_or_assumed_parts(tmp_path, config, overrides, block, caveat):
    """Client-level runs, whose privacy.json has other blocks: the same round trip, and the file's label is a caveat."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*dict-style access to a typed result", category=DeprecationWarning)
        outcome = dpfl.run(ROOT / "configs" / config, overrides=[*SMALL, *overrides], out=tmp_path / "run")
    d = raw(tmp_path / "run")
    report = outcome.privacy
    assert json.dumps(report.to_dict()) == json.dumps(d)
    assert report.unit == d["unit"] == "client"
    assert report.epsilon == tuple(c["epsilon_guarantee"] for c in d["clients"])
    assert report.extra[block] == d[block]
    assert not report.rigorous and [c[:len(caveat)] for c in report.caveats] == [caveat]


def test_fdp_composition_headline_and_exact_secure_aggregation_stay_rigorous(runs):
    d = {**raw(runs["accountant"]), "fdp": {"headline": "composition"},
         "secure_aggregation": {"protocol": "secagg", "threat_model": "honest-but-curious server"}}
    assert PrivacyReport.from_dict(d).rigorous


def test_dict_access_still_works_and_warns_naming_the_attribute(runs):
    d = raw(runs["accountant"])
    r = PrivacyReport.from_dict(d)
    with pytest.warns(DeprecationWarning, match=r"PrivacyReport\['unit'\] is deprecated .* use PrivacyReport\.unit"):
        assert r["unit"] == d["unit"]
    with pytest.warns(DeprecationWarning, match=r"use PrivacyReport\.guarantee instead"):
        assert r["guarantee"]["source"] == d["guarantee"]["source"]
    with pytest.warns(DeprecationWarning, match=r"use PrivacyReport\.clients instead"):
        assert r["clients"][0]["epsilon_guarantee"] == d["clients"][0]["epsilon_guarantee"]
    with pytest.warns(DeprecationWarning, match=r"use PrivacyReport\.extra\['eps_total_max'\] instead"):
        assert r.get("eps_total_max") == d["eps_total_max"]
    with pytest.warns(DeprecationWarning, match=r"use PrivacyReport\.fdp|use PrivacyReport\.extra\['fdp'\]"):
        assert r.get("fdp", "absent") == "absent"
    with pytest.warns(DeprecationWarning, match=r"use PrivacyReport\.key_order"):
        assert "clients" in r and "fdp" not in r
    with pytest.warns(DeprecationWarning, match=r"use PrivacyReport\.key_order"):
        assert list(r.keys()) == list(d)
    with pytest.warns(DeprecationWarning, match=r"iterating a PrivacyReport"):
        assert [key for key in r] == list(d)
    with pytest.warns(DeprecationWarning, match=r"use len\(PrivacyReport\.key_order\)"):
        assert len(r) == len(d)
    with pytest.warns(DeprecationWarning, match=r"PrivacyReport\.to_dict\(\)\.items\(\)"):
        assert dict(r.items()) == d
    with pytest.warns(DeprecationWarning), pytest.raises(KeyError):
        r["fdp"]  # noqa: B018 - the lookup is the test


def test_the_report_is_frozen_and_independent_of_the_dict_it_came_from(runs):
    d = raw(runs["accountant"])
    kept = copy.deepcopy(d)
    r = PrivacyReport.from_dict(d)
    d["clients"][0]["epsilon_guarantee"] = -1.0
    d["ledger"].clear()
    assert r.to_dict() == kept
    out = r.to_dict()
    out["guarantee"]["source"] = "changed"
    assert r.guarantee is not None and r.guarantee.source == kept["guarantee"]["source"]
    with pytest.raises(AttributeError):
        r.unit = "client"  # type: ignore[misc]
