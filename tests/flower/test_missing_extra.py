"""Without flwr, the Flower path says in one line which command installs it (no flwr needed for this test)."""

from __future__ import annotations

import sys

import pytest

from cli_runner import cli


@pytest.fixture
def no_flwr(monkeypatch):
    monkeypatch.setitem(sys.modules, "flwr", None)  # `import flwr` now raises ImportError
    for name in [m for m in sys.modules if m.startswith("dpfl.flower.") and m != "dpfl.flower.guide"]:
        monkeypatch.delitem(sys.modules, name)


def test_require_flwr_names_the_extra(no_flwr):
    from dpfl.flower import FlowerMissing, require_flwr

    with pytest.raises(FlowerMissing) as err:
        require_flwr()
    assert str(err.value) == "the Flower federation needs the flower extra: pip install 'dpfl[flower]'"


def test_importing_the_apps_names_the_extra(no_flwr):
    with pytest.raises(ImportError, match=r"pip install 'dpfl\[flower\]'"):
        import dpfl.flower.server_app  # noqa: F401


def test_cli_one_line(no_flwr):
    code, out, err = cli("flower", "guide")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "error: the Flower federation needs the flower extra: pip install 'dpfl[flower]'"]
