"""`dpfl reproduce merge`: the pieces of one grid's results.csv become one file, or a one-line refusal."""

from __future__ import annotations

import pytest

from cli_runner import cli
from dpfl.reproduce.merge import MergeError, merge_csv_texts

HEADER = "method,setting,seed,final_accuracy\n"
PIECE_A = HEADER + "robust_hdp,Dist5,0,0.71\nweiavg,Dist5,0,0.54\nweiavg,Dist5-misreport,0,0.60\n"
PIECE_B = HEADER + "weiavg,Dist5,10,0.52\nrobust_hdp,Dist5,2,0.70\nweiavg,Dist5,2,0.52\n"


def _merge(*texts: str, key=("setting", "seed", "method"), new_columns=False) -> str:
    return merge_csv_texts([(f"in{i}.csv", t) for i, t in enumerate(texts)], key, new_columns=new_columns)


def test_union_sorted_by_key_numbers_numerically_words_by_first_appearance():
    assert _merge(PIECE_A, PIECE_B) == HEADER + (
        "robust_hdp,Dist5,0,0.71\nweiavg,Dist5,0,0.54\n"
        "robust_hdp,Dist5,2,0.70\nweiavg,Dist5,2,0.52\n"
        "weiavg,Dist5,10,0.52\n"  # 10 after 2: numeric, not text, order
        "weiavg,Dist5-misreport,0,0.60\n")  # settings in the order the first piece shows them


def test_merging_again_changes_nothing_and_cells_are_copied_as_text():
    once = _merge(PIECE_A, PIECE_B)
    assert _merge(once, PIECE_A, PIECE_B) == once
    odd = HEADER + 'pfa,Dist5,0,"1e-3, quoted"\n'
    assert '"1e-3, quoted"' in _merge(odd, PIECE_A)


def test_leading_comment_lines_of_every_input_are_kept_once_above_the_header():
    a = "# dpfl reproduce x --out runs/a (seeds 0-1)\n" + PIECE_A
    b = "# dpfl reproduce x --only-seeds 2 --out runs/b\n# 2026-11-28\n" + PIECE_B
    merged = _merge(a, b)
    assert merged == ("# dpfl reproduce x --out runs/a (seeds 0-1)\n# dpfl reproduce x --only-seeds 2 --out runs/b\n"
                      "# 2026-11-28\n" + _merge(PIECE_A, PIECE_B))
    assert _merge(merged, b, a) == merged  # merging a piece again changes nothing, comments included
    with pytest.raises(MergeError, match="in0.csv, line 4: 4 columns"):  # line numbers count the comment lines
        _merge("# one\n# two\n" + HEADER + "weiavg,Dist5,3\n", PIECE_A)


@pytest.mark.parametrize("name, key", [("rdpcfl_ci.csv", ("setting", "seed", "method")),
                                       ("splitting_cnn_reduced.csv", ("setting", "seed", "method", "anderson")),
                                       ("robust_hdp_full.csv", ("setting", "seed", "method")),
                                       ("rdpcfl_round1_full.csv", ("setting", "seed", "round1_batch"))])
def test_published_csvs_merged_with_themselves_come_back_byte_for_byte(name, key):
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "results" / name).read_text(encoding="utf-8")
    assert merge_csv_texts([(name, text), (name, text)], key) == text


def test_two_different_rows_for_one_run_are_refused():
    other = HEADER + "weiavg,Dist5,0,0.99\n"
    with pytest.raises(MergeError, match=r"in1.csv: the row .*'seed': '0'.* differs from the one in in0.csv "
                                         r"\(columns final_accuracy\).* \(then add the column that does with --key\)"):
        _merge(PIECE_A, other)


def test_different_columns_a_missing_key_and_ragged_rows_are_refused():
    with pytest.raises(MergeError, match="columns only here: seconds; only in in0.csv: -; --new-columns keeps both"):
        _merge(PIECE_A, "method,setting,seed,final_accuracy,seconds\nweiavg,Dist5,3,0.5,10\n")
    with pytest.raises(MergeError, match="in1.csv: no column seed \\(the key\\)"):
        _merge(PIECE_A, "method,setting,final_accuracy\nweiavg,Dist5,0.5\n", new_columns=True)
    with pytest.raises(MergeError, match="the same columns in another order"):
        _merge(PIECE_A, "setting,method,seed,final_accuracy\nDist5,weiavg,3,0.5\n")
    with pytest.raises(MergeError, match="in0.csv: no column b1 \\(the key\\)"):
        _merge(PIECE_A, PIECE_B, key=("setting", "b1"))
    with pytest.raises(MergeError, match="in1.csv, line 2: 4 columns in the header, not in this row"):
        _merge(PIECE_A, HEADER + "weiavg,Dist5,3\n")
    with pytest.raises(MergeError, match="at least two"):
        _merge(PIECE_A)
    with pytest.raises(MergeError, match="distinct columns"):
        _merge(PIECE_A, PIECE_B, key=("seed", "seed"))


OLD = "method,setting,seed,seconds,run_dir\nweiavg,Dist5,0,10.5,runs/a\nweiavg,Dist5,1,11.0,runs/b\n"
NEW = ("method,setting,seed,seconds,cpu_seconds,run_dir\nweiavg,Dist5,1,11.0,9.5,runs/b\n"
       "weiavg,Dist5,2,12.0,9.0,runs/c\n")


def test_new_columns_are_kept_empty_where_an_input_lacks_them():
    """A published CSV from before cpu_seconds merged with a newer piece: the newer header, old rows empty there."""
    merged = _merge(OLD, NEW, new_columns=True)
    assert merged == ("method,setting,seed,seconds,cpu_seconds,run_dir\nweiavg,Dist5,0,10.5,,runs/a\n"
                      "weiavg,Dist5,1,11.0,9.5,runs/b\nweiavg,Dist5,2,12.0,9.0,runs/c\n")  # seed 1: the wider row
    assert _merge(NEW, OLD, new_columns=True) == merged  # the widest header, whichever input comes first
    assert _merge(merged, OLD, NEW, new_columns=True) == merged
    other = "method,setting,seed,seconds,cpu_seconds,run_dir\nweiavg,Dist5,0,99.0,1.0,runs/a\n"
    with pytest.raises(MergeError, match=r"differs from the one in in0.csv \(columns seconds\)"):
        _merge(OLD, other, new_columns=True)  # the columns both have must agree
    third = "method,setting,seed,seconds,message\nweiavg,Dist5,3,1.0,hi\n"  # neither header has every column
    header = _merge(NEW, third, new_columns=True).splitlines()[0]
    assert header == "method,setting,seed,seconds,cpu_seconds,run_dir,message"


def test_cli_overwrites_an_input_only_after_reading_all_and_writes_nothing_on_refusal(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(PIECE_A)
    b.write_text(PIECE_B)
    code, out, err = cli("reproduce", "merge", a, b, "--out", a, "--key", "setting, seed, method")
    assert code == 0, err
    assert a.read_text() == _merge(PIECE_A, PIECE_B) and "6 rows" in out
    b.write_text("# provenance\n# of b\n" + PIECE_B)
    code, out, err = cli("reproduce", "merge", a, b, "--out", tmp_path / "with-comments.csv")
    assert code == 0 and "6 rows" in out, (out, err)  # comment lines are not rows
    b.write_text(HEADER + "weiavg,Dist5,0,0.99\n")
    before = a.read_text()
    code, out, err = cli("reproduce", "merge", a, b, "--out", tmp_path / "c.csv")
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert a.read_text() == before and not (tmp_path / "c.csv").exists()
    code, out, err = cli("reproduce", "merge", a, tmp_path / "missing.csv", "--out", tmp_path / "c.csv")
    assert code == 2 and "missing.csv: No such file or directory" in err and not (tmp_path / "c.csv").exists()
    b.write_text(NEW)
    a.write_text(OLD)
    code, out, err = cli("reproduce", "merge", a, b, "--out", tmp_path / "c.csv")
    assert code == 2 and "--new-columns keeps both" in err and not (tmp_path / "c.csv").exists()
    code, out, err = cli("reproduce", "merge", a, b, "--out", tmp_path / "c.csv", "--new-columns")
    assert code == 0 and (tmp_path / "c.csv").read_text() == _merge(OLD, NEW, new_columns=True), err
    code, out, err = cli("reproduce", "merge", a, a, "--out", tmp_path)  # a directory
    assert code == 2 and err.startswith("error: --out ") and "Traceback" not in err, err
