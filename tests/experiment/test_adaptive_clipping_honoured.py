"""`privacy.adaptive_clipping` is honoured or refused, never dropped: every algorithm built with it either runs the
adaptive clip (its server step at client level, every phase of its local program at sample level) or is refused in
one line naming the key (`algorithm_bundle.check_precision`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dpfl.algorithms.client.program import LocalProgram
from dpfl.experiment.algorithm_bundle import check_precision
from dpfl.experiment.build import build_run
from dpfl.experiment.config import ConfigError, load_config

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
ADAPTIVE = ["privacy.clip=null", "privacy.adaptive_clipping={count_noise: 5.0}", "training.rounds=1"]
HONOURED = {
    "dp_fedavg_local": [], "weiavg": [], "pfa": [], "robust_hdp": [], "ppsgd": [],
    "fedprox": ["algorithm.params={mu: 0.1}"], "fedceo": ["algorithm.params={lam: 1.0}"],
    "fedsplit": ["algorithm.params={eta: 0.1}"],
    "dp_fedavg_central": ["privacy.mechanism=central", "privacy.unit=client", "privacy.observer=aggregate",
                          "privacy.sampling=null"],
}
# under a server optimizer the loop reads the wrapped step's adaptive clip (the wrapper delegates it)
HONOURED["dp_fedavg_central+fedadam"] = [*HONOURED["dp_fedavg_central"], "algorithm.server_optimizer={name: fedadam}"]


def _cfg(name: str, extra: list[str]):
    return load_config(DEMO, [f"algorithm.name={name.split('+')[0]}", *ADAPTIVE, *extra])


@pytest.mark.parametrize("name", sorted(HONOURED))
def test_an_algorithm_built_with_adaptive_clipping_runs_it(name):
    algorithm = build_run(_cfg(name, HONOURED[name])).algorithm
    if name.startswith("dp_fedavg_central"):
        assert algorithm.aggregator.adaptive_clipping is not None
    else:
        assert all(phase.spec.adaptive_clipping is not None for phase in algorithm.local.phases)


def test_the_oracle_is_refused_its_weights_read_a_fixed_clips_noise():
    with pytest.raises(ConfigError, match="privacy.adaptive_clipping: the oracle") as err:
        build_run(_cfg("oracle", []))
    assert err.value.path == "privacy.adaptive_clipping"


def test_a_local_program_that_drops_the_setting_is_refused():
    cfg = _cfg("dp_fedavg_local", [])
    algorithm = build_run(cfg).algorithm
    local = algorithm.local
    assert isinstance(local, LocalProgram)
    fixed = dataclasses.replace(local, spec=dataclasses.replace(local.spec, adaptive_clipping=None))
    with pytest.raises(ConfigError, match="privacy.adaptive_clipping: algorithm 'dp_fedavg_local' clips with a fixed"):
        check_precision(cfg, dataclasses.replace(algorithm, local=fixed))
