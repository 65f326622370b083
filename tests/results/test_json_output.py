"""Strict JSON for scripts (results.json_output): no NaN/Infinity literals, one line on stdout."""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from dpfl.results.json_output import emit_json, json_safe, strict_json
from dpfl.results.run_files import as_float


def test_non_finite_numbers_become_strings_that_as_float_reads_back():
    obj = {"a": [1.0, math.inf, (-math.inf, math.nan)], "b": {"c": 2}, "d": "x"}
    assert json_safe(obj) == {"a": [1.0, "inf", ["-inf", "nan"]], "b": {"c": 2}, "d": "x"}
    assert [as_float(v) for v in json_safe([math.inf, -math.inf])] == [math.inf, -math.inf]
    text = strict_json(obj)
    assert "Infinity" not in text and "NaN" not in text
    with pytest.raises(TypeError):
        strict_json({"p": Path("x")})  # only emit_json falls back to str


def test_emit_json_writes_one_line_to_the_current_stdout():
    buf = io.StringIO()
    with redirect_stdout(buf):
        emit_json({"eps": math.inf, "path": Path("runs/a")})
    assert buf.getvalue() == '{"eps": "inf", "path": "runs/a"}\n' and json.loads(buf.getvalue())["eps"] == "inf"
    other = io.StringIO()
    emit_json([1], other)
    assert other.getvalue() == "[1]\n"
