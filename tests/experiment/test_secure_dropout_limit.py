"""The secure-aggregation dropout limit a refusal states is the one the config accepts: floor(dropout K) of a cohort
of K leave, so the round completes while at most K - t leave (t the threshold)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpfl.experiment.config import ConfigError, load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "secure" / "digits_distributed.yaml"  # K = 75, t = 38


def _limit() -> float:
    with pytest.raises(ConfigError) as refused:
        load_config(CONFIG, ["secure_aggregation.dropout=0.9"])
    found = re.search(r"less than ([0-9.]+) \(at most 37 of 75 clients leaving\)", str(refused.value))
    assert found, str(refused.value)
    return float(found.group(1))


def test_the_stated_dropout_limit_is_where_the_config_stops_accepting():
    limit = _limit()
    assert limit == pytest.approx(38 / 75, abs=1e-4)
    assert load_config(CONFIG, ["secure_aggregation.dropout=0.5"]).secure_aggregation.dropout == 0.5  # 37 leave
    load_config(CONFIG, [f"secure_aggregation.dropout={37 / 75 + 1e-9}"])  # still 37
    with pytest.raises(ConfigError):
        load_config(CONFIG, [f"secure_aggregation.dropout={38 / 75}"])  # 38 leave: 37 < t remain
