"""`dpfl privacy fdp` driven as a user drives it (spec fdp_accounting.md §1.3, §4.5, §5, §9 T2 and T12)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from cli_runner import cli
from dpfl.privacy.fdp import PAPER_LABEL, fdp_report
from dpfl.results.fdp_plot import fdp_figure, plot_fdp

T2 = ("--algo", "fedavg", "--eta", "0.01", "--K", "5", "--V", "1", "--sigma", "0.02", "--m", "100")
T2_FINAL = (*T2, "--L", "1", "--view", "aggregate", "--release", "final", "--show-paper-claimed",
            "--grid", "1,10,100,1000")


def fdp(*args: object) -> tuple[int, str, str]:
    return cli("privacy", "fdp", *args)


def fdp_json(*args: object) -> dict:
    code, out, err = fdp(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def curves(report: dict) -> dict[str, dict]:
    return {c["bound"]: c for c in report["curves"]}


def _assert_one_line_error(code: int, err: str) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


def test_t2_final_model_view_matches_the_spec_values():
    got = fdp_json(*T2_FINAL)
    assert (got["view"], got["release"], got["rounds"]) == ("aggregate", "final", [1, 10, 100, 1000])
    c = curves(got)
    assert c["composition"]["mu"] == pytest.approx([0.5, 1.581139, 5.0, 15.811388], abs=2e-6)
    assert c["composition"]["epsilon"]["1e-05"] == pytest.approx([1.993091, 7.511276, 33.103732, 191.549201], rel=1e-6)
    assert c["shifted-interpolation"]["mu"] == pytest.approx(c["composition"]["mu"], abs=2e-6)  # constant steps
    paper = c["paper-claimed"]
    assert paper["mu"][-1] == pytest.approx(3.170487, abs=2e-6)
    assert paper["epsilon"]["1e-05"][-1] == pytest.approx(17.917056, rel=1e-6)
    assert paper["is_guarantee"] is False and paper["label"] == PAPER_LABEL
    assert c["composition"]["is_guarantee"] and c["shifted-interpolation"]["is_guarantee"]
    assert got["headline"]["bound"] == "shifted-interpolation"
    assert got["params"]["L"] == 1 and any("ASSUMPTION" in a for a in got["assumptions"])


def test_t12_default_view_without_secure_aggregation_is_upload_with_composition_only():
    got = fdp_json(*T2, "--L", "1", "--release", "final", "--grid", "100")
    assert got["view"] == "upload" and got["release"] == "final"
    assert [c["bound"] for c in got["curves"]] == ["composition"]  # no shifted bound outside the aggregate view
    assert got["curves"][0]["mu"] == pytest.approx([50.0], abs=2e-6)
    assert got["headline"]["bound"] == "composition"


def test_t12_secure_aggregation_resolves_auto_to_aggregate():
    got = fdp_json(*T2, "--secure-aggregation", "--grid", "100")
    assert got["view"] == "aggregate" and got["release"] == "transcript"
    assert [c["bound"] for c in got["curves"]] == ["composition"]  # transcript: composition only
    assert got["curves"][0]["mu"] == pytest.approx([5.0], abs=2e-6)
    with_final = fdp_json(*T2, "--secure-aggregation", "--release", "final", "--L", "1", "--grid", "100")
    assert with_final["headline"]["bound"] == "shifted-interpolation"


def test_table_states_the_threat_model_and_labels_the_paper_columns():
    code, out, err = fdp(*T2_FINAL)
    assert code == 0, err
    assert "view:    aggregate" in out and "release: final" in out and "1e-05" in out
    assert "L 1 (ASSUMPTION)" in out and "eta 0.01" in out and "sigma 0.02" in out and "m 100" in out
    assert out.count(PAPER_LABEL) >= 3  # the μ column, the ε column and the legend lines
    assert "headline guarantee: shifted-interpolation" in out
    assert "15.8114" in out and "3.17049" in out
    code, out, _ = fdp(*T2, "--grid", "100")
    assert code == 0 and "upload (resolved from --view auto)" in out and PAPER_LABEL not in out


def test_csv_has_one_row_per_round_and_labels_the_paper_column():
    code, out, err = fdp(*T2_FINAL, "--format", "csv")
    assert code == 0, err
    rows = list(csv.reader(io.StringIO(out)))
    header = rows[0]
    assert header[0] == "T" and f"mu[{PAPER_LABEL}]" in header and f"eps[{PAPER_LABEL},delta=1e-05]" in header
    assert "mu[composition]" in header and "eps[shifted-interpolation,delta=1e-05]" in header
    assert [r[0] for r in rows[1:]] == ["1", "10", "100", "1000"]
    assert float(rows[-1][header.index(f"mu[{PAPER_LABEL}]")]) == pytest.approx(3.170487, abs=2e-6)
    assert all("paper-claimed" not in h or PAPER_LABEL in h for h in header)  # never a bare paper column


def test_json_flag_equals_format_json():
    a, b = fdp(*T2_FINAL, "--json"), fdp(*T2_FINAL, "--format", "json")
    assert a[0] == b[0] == 0 and a[1] == b[1]
    assert json.loads(a[1]) == json.loads(json.dumps(_report().to_dict()))  # exactly to_dict


def test_several_deltas():
    got = fdp_json(*T2, "--grid", "1", "--delta", "1e-5", "--delta", "1e-3")
    assert got["deltas"] == [1e-5, 1e-3]
    assert got["curves"][0]["epsilon"]["0.001"] == pytest.approx([27.176], rel=1e-4)  # μ = 5 (upload view)


def test_out_writes_csv_json_and_png(tmp_path):
    out = tmp_path / "fdp"
    code, stdout, err = fdp(*T2_FINAL, "--out", out)
    assert code == 0, err
    for name in ("fdp_curves.csv", "fdp_curves.json", "fdp_curves.png"):
        assert (out / name).is_file() and str(out / name) in stdout
    assert (out / "fdp_curves.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((out / "fdp_curves.json").read_text()) == fdp_json(*T2_FINAL)
    assert (out / "fdp_curves.csv").read_text() == fdp(*T2_FINAL, "--format", "csv")[1]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left behind


def _report():
    return fdp_report(algo="fedavg", schedule="constant", eta=0.01, K=5, V=1.0, sigma=0.02, m=100,
                      rounds=[1, 10, 100, 1000], L=1.0, view="aggregate", release="final", paper="printed")


def test_plot_dashes_and_labels_the_paper_curve(tmp_path):
    report = _report()
    fig = fdp_figure(report)
    axes = fig.get_axes()
    assert len(axes) == 2 and all(ax.get_xscale() == "log" for ax in axes)
    for ax in axes:
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert sum(PAPER_LABEL in t for t in texts) == 1 and len(texts) == 3
        for line in ax.get_lines():
            dashed = PAPER_LABEL in line.get_label()
            assert line.get_linestyle() == ("--" if dashed else "-")
    assert "aggregate" in fig._suptitle.get_text() and "final" in fig._suptitle.get_text()
    path = plot_fdp(report, tmp_path / "p.png", delta=1e-5)
    assert path.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError):
        fdp_figure(report, delta=1e-3)  # not in the report


@pytest.mark.parametrize("args", [
    (*T2, "--show-paper-claimed"),  # the paper's curve needs L
    (*T2, "--grid", "log:x"),
    (*T2, "--grid", "0,10"),
    (*T2, "--view", "server"),
    (*T2, "--release", "all"),
    (*T2, "--format", "xml"),
    (*T2, "--delta", "2"),
    (*T2, "--sigma", "0"),
    (*T2, "--honest-clients", "500"),
    (*T2, "--paper-variant", "h0"),  # only with --show-paper-claimed
    ("--algo", "fedprox", *T2[2:]),  # fedprox needs --alpha
    ("--algo", "sgd", *T2[2:]),
    (*T2, "--K", "x"),  # click's own parsing error
])
def test_bad_input_is_one_error_line_with_exit_code_2(args, tmp_path):
    code, out, err = fdp(*args, "--out", tmp_path / "never")
    _assert_one_line_error(code, err)
    assert out == "" and not (tmp_path / "never").exists()


def test_required_options_are_required():
    code, _, err = fdp("--algo", "fedavg", "--eta", "0.01")
    _assert_one_line_error(code, err)
    assert "--from-run" in err


NOISY_RUN = ("--set", "training.rounds=12", "--set", "privacy.secure_aggregation=true", "--set",
             "privacy.release=final", "--set", "privacy.smoothness_L=1", "--set",
             "algorithm.params.schedule=stagewise")


def test_from_run_uses_the_runs_config_and_matches_its_privacy_json(tmp_path):
    run_dir = tmp_path / "run"
    code, _, err = cli("run", "configs/fdp/digits_noisy_fedavg.yaml", "--out", run_dir, *NOISY_RUN)
    assert code == 0, err
    got = fdp_json("--from-run", run_dir, "--grid", "1,6,12", "--out", tmp_path / "curves")
    assert got["run"] == str(run_dir) and got["view"] == "aggregate" and got["release"] == "final"
    assert got["rounds"] == [1, 6, 12] and got["params"]["schedule"] == "stagewise" and got["params"]["m"] == 10
    by = curves(got)
    assert by["paper-claimed"]["label"] == PAPER_LABEL and not by["paper-claimed"]["is_guarantee"]
    privacy = json.loads((run_dir / "privacy.json").read_text())["fdp"]
    for bound in ("composition", "shifted-interpolation"):  # full participation: the plan is what ran
        assert by[bound]["mu"][-1] == pytest.approx(privacy["clients"][0]["bounds"][bound]["mu"], rel=1e-12)
    assert got["headline"]["bound"] == privacy["headline"] == "shifted-interpolation"
    assert (tmp_path / "curves" / "fdp_curves.png").stat().st_size > 0
    code, out, _ = fdp("--from-run", run_dir)
    assert code == 0 and f"from the config of run {run_dir}" in " ".join(out.split())

    for args, message in ((("--algo", "fedavg"), "--algo"), (("--grid", "1,20"), "beyond the run's 12 rounds")):
        code, _, err = fdp("--from-run", run_dir, *args)
        _assert_one_line_error(code, err)
        assert message in err
    code, _, err = fdp("--from-run", tmp_path)
    _assert_one_line_error(code, err)
    assert "not a run directory" in err


def test_log_grid_runs_up_to_t_max():
    got = fdp_json(*T2, "--T-max", "1000", "--grid", "log:4")
    assert got["rounds"] == [1, 10, 100, 1000]
    assert got["curves"][0]["mu"][-1] == pytest.approx(158.113883, abs=2e-6)  # upload view: √m·μ_comp
