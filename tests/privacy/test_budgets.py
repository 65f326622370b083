"""Per-client budgets: validation, named distributions, reproducibility, registry."""

import math

import numpy as np
import pytest

from dpfl.privacy import BUDGET_DISTRIBUTIONS, ClientBudget, draw_budgets, register_budget_distribution


def test_client_budget_validation():
    b = ClientBudget(1, 1e-5)
    assert (b.epsilon, b.delta) == (1.0, 1e-5) and isinstance(b.epsilon, float)
    assert ClientBudget(math.inf, 1e-5).epsilon == math.inf
    with pytest.raises(ValueError, match=r"epsilon must be a number > 0.*got 0"):
        ClientBudget(0, 1e-5)
    with pytest.raises(ValueError, match=r"delta must be a number in \(0, 1\), got 1.0"):
        ClientBudget(1.0, 1.0)
    with pytest.raises(ValueError, match="epsilon"):
        ClientBudget("1", 1e-5)


def test_fixed_and_list():
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(draw_budgets("fixed", 4, rng, value=2.5), [2.5] * 4)
    vals = [2.81, 1.69, 1.74]
    np.testing.assert_array_equal(draw_budgets("list", 3, rng, values=vals), vals)
    with pytest.raises(ValueError, match="values has 3 entries, expected n_clients=4"):
        draw_budgets("list", 4, rng, values=vals)
    with pytest.raises(ValueError, match=r"values\[1\] must be a finite number > 0, got -1"):
        draw_budgets("list", 2, rng, values=[1, -1])


def test_uniform_is_in_range_and_reproducible():
    a = draw_budgets("uniform", 1000, np.random.default_rng(7), low=0.2, high=5.0)
    b = draw_budgets("uniform", 1000, np.random.default_rng(7), low=0.2, high=5.0)
    np.testing.assert_array_equal(a, b)
    assert a.min() >= 0.2 and a.max() <= 5.0 and a.std() > 1.0
    with pytest.raises(ValueError, match="low must be <= high, got low=5.0, high=1.0"):
        draw_budgets("uniform", 3, np.random.default_rng(0), low=5.0, high=1.0)


def test_choice_respects_values_and_probabilities():
    rng = np.random.default_rng(1)
    eps = draw_budgets("choice", 2000, rng, values=[0.5, 10.0], probs=[0.9, 0.1])
    assert set(np.unique(eps)) == {0.5, 10.0}
    assert 0.05 < np.mean(eps == 10.0) < 0.15
    np.testing.assert_array_equal(draw_budgets("choice", 5, rng, values=[1.0, 2.0], probs=[0.0, 1.0]), [2.0] * 5)
    with pytest.raises(ValueError, match="probs must be 2 non-negative numbers summing to 1"):
        draw_budgets("choice", 5, rng, values=[1.0, 2.0], probs=[0.5, 0.6])


def test_unknown_kind_and_bad_parameters():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"kind must be one of \['fixed', 'list', 'uniform', 'choice', 'Uniform', "
                                         r"'Gauss', 'Pareto', 'MixGauss1'.*'Dist9', 'rhdp20'\], got 'zipf'"):
        draw_budgets("zipf", 3, rng)
    with pytest.raises(ValueError, match="bad parameters for budget distribution 'uniform'"):
        draw_budgets("uniform", 3, rng, low=1.0)
    with pytest.raises(ValueError, match="n_clients must be an integer >= 1"):
        draw_budgets("fixed", 0, rng, value=1.0)
    with pytest.raises(ValueError, match="rng must be a numpy.random.Generator"):
        draw_budgets("fixed", 2, 0, value=1.0)


def test_registry_accepts_new_distributions():
    @register_budget_distribution("test-doubling")
    def _doubling(n_clients, rng, *, start):
        return start * 2.0 ** np.arange(n_clients)

    try:
        np.testing.assert_array_equal(draw_budgets("test-doubling", 3, np.random.default_rng(0), start=0.5),
                                      [0.5, 1, 2])
        with pytest.raises(ValueError, match="already registered"):
            register_budget_distribution("test-doubling")(_doubling)
    finally:
        BUDGET_DISTRIBUTIONS.pop("test-doubling")


def test_registered_distribution_must_return_positive_epsilons():
    register_budget_distribution("test-bad")(lambda n, rng: -np.ones(n))
    try:
        with pytest.raises(ValueError, match="must give 2 finite epsilons > 0"):
            draw_budgets("test-bad", 2, np.random.default_rng(0))
    finally:
        BUDGET_DISTRIBUTIONS.pop("test-bad")


# ---- the registry has no import cycle, and is complete whichever module is imported first ----------------
REGISTERED = ["fixed", "list", "uniform", "choice",
              "Uniform", "Gauss", "Pareto", "MixGauss1", "MixGauss2", "MixGauss3", "MixGauss4", "MixGauss3-code",
              *(f"Dist{i}" for i in range(1, 10)), "rhdp20"]
BUDGET_MODULES = ["dpfl.privacy.budget_registry", "dpfl.privacy.budget_distributions", "dpfl.privacy.budgets",
                  "dpfl.privacy"]


@pytest.mark.parametrize("first", BUDGET_MODULES)
def test_registry_is_complete_whichever_module_is_imported_first(first):
    """A fresh interpreter imports ``first`` before anything else of dpfl; every public name is where it was."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import dpfl

    code = "\n".join([
        "import json, sys",
        f"import {first}",
        "from dpfl.privacy.budgets import (BUDGET_DISTRIBUTIONS, ClientBudget, budget_distribution_name,",
        "                                  draw_budgets, register_budget_distribution)",
        "from dpfl.privacy.budget_registry import BUDGET_DISTRIBUTIONS as registry",
        "import dpfl.privacy as p",
        "assert registry is BUDGET_DISTRIBUTIONS is p.BUDGET_DISTRIBUTIONS",
        "assert p.draw_budgets is draw_budgets and p.register_budget_distribution is register_budget_distribution",
        "assert p.ClientBudget is ClientBudget and budget_distribution_name('mixgauss1') == 'MixGauss1'",
        "print(json.dumps(list(BUDGET_DISTRIBUTIONS)))",
    ])
    src = str(Path(dpfl.__file__).resolve().parents[1])  # the dpfl under test, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == REGISTERED


def test_budget_modules_do_not_import_each_other_in_a_cycle():
    """budget_registry imports nothing of dpfl; budget_distributions registers into it without importing budgets
    (which imports budget_distributions): an import of budgets from there would bring the cycle back."""
    import ast
    import importlib

    def dpfl_imports(module: str) -> set[str]:
        tree = ast.parse(open(importlib.import_module(module).__file__, encoding="utf-8").read())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        return {n for n in names if n.startswith("dpfl")}

    assert dpfl_imports("dpfl.privacy.budget_registry") == set()
    assert not {n for n in dpfl_imports("dpfl.privacy.budget_distributions")
                if n.startswith("dpfl.privacy.budgets") or n == "dpfl.privacy"}
    assert "dpfl.privacy.budget_distributions" in dpfl_imports("dpfl.privacy.budgets")


def test_budgets_hold_arrays_and_make_each_client_budget_on_access():
    from dpfl.privacy.budgets import Budgets

    listed = [ClientBudget(1.0, 1e-5), ClientBudget(float("inf"), 1e-6), ClientBudget(2.5, 1e-5)]
    held = Budgets.of(listed)
    assert held == listed and list(held) == listed and held[1] == listed[1] and held[-1] == listed[2]
    assert held.tolist() == listed and held[1:] == listed[1:] and len(held) == 3
    assert held.epsilons.tolist() == [1.0, float("inf"), 2.5] and not held.epsilons.flags.writeable
    assert Budgets.of(ClientBudget(3.0, 1e-5), 4) == [ClientBudget(3.0, 1e-5)] * 4
    assert Budgets(np.full(2, 2.0), 1e-5) != Budgets(np.full(2, 2.0), 1e-6)
    with pytest.raises(ValueError, match="budgets has 3 entries for 2 clients"):
        Budgets.of(listed, 2)
    with pytest.raises(ValueError, match="epsilon must be a number > 0"):
        Budgets([1.0, 0.0], 1e-5)
    with pytest.raises(ValueError, match=r"delta must be a number in \(0, 1\)"):
        Budgets([1.0, 2.0], [1e-5, 1.0])
