"""`dpfl bench secagg`: one JSON object with the round's costs and a sum within the encoding error."""

import json

import pytest

from cli_runner import cli


def test_bench_secagg_json_reports_costs_and_an_exact_sum():
    code, out, err = cli("bench", "secagg", "--clients", 9, "--dim", 500, "--dropout", 0.34, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["dropped"] == 3 and got["included"] == 6 and got["dropped_after_sharing"] == 3
    assert got["threshold"] == 5
    assert got["max_abs_error"] <= got["error_bound"]
    assert got["server_seconds"] > 0 and got["client_seconds_max"] >= got["client_seconds_mean"] > 0
    assert got["upload_bytes_per_client"] > got["plain_upload_bytes_per_client"]


@pytest.mark.parametrize("args,match", [
    (("--clients", 10, "--threshold", 5), "must exceed n/2"),
    (("--clients", 10, "--dropout", 0.6), "aborted at stage"),
    (("--dim", 0), "--dim must be >= 1"),
    (("--stage", "later"), "unknown stage"),
    (("--ring-bits", 16), "ring bits"),
])
def test_bench_secagg_bad_input_is_one_line(args, match):
    code, out, err = cli("bench", "secagg", "--dim", 50, *args)
    assert code == 2 and match in err and "Traceback" not in err
