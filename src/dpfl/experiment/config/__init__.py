"""One run's configuration: a YAML file, every field validated (pydantic v2), with `--set` overrides.

    cfg = load_config(Path("configs/demo.yaml"), ["training.rounds=5", "privacy.budgets=[1,2,4,8,8,8,8,8,8,8]"])
    print(config_to_yaml(cfg))        # the resolved config: every field, defaults and inferred values filled in

Every model forbids unknown fields, so a typo fails instead of being ignored. Every problem is a
`ConfigError` whose message is ONE line naming the field path, the problem, the value given and what
is allowed, e.g. ``training.selection.k: required when kind is 'fixed' (got null; allowed: an integer
in [1, data.clients])``.

The privacy section states the threat model the run claims (unit, observer, mechanism, sampling). When
left out these are filled in from the algorithm; when given they must agree with it. Budgets are a
number (every client), a list (one epsilon per client) or a named distribution drawn with the run seed
when the run is built (`dpfl.experiment.build`). Nothing here touches data, models or accountants.

Heterogeneous budgets and batch sizes of PFA and Robust-HDP (spec heterogeneous_dp.md section 3):

    privacy:
      budgets: {distribution: MixGauss1}          # or Uniform, Gauss, Pareto, MixGauss2..4, MixGauss3-code,
                                                  # Dist1..Dist9; optional eps_floor (default 0.01);
                                                  # Pareto also takes pareto_cap (default: uncapped)
      budgets: {distribution: rhdp20, dist: Dist5}  # the RHDP code's fixed list; needs data.clients: 20
    training:
      batch_size: hetero                          # each client uniform from {16, 32, 64, 128}, seeded
      batch_size: rhdp20                          # the RHDP code's 20-client list

The user's own data, one file or folder per client, never re-split (docs/own-data.md):

    data:
      silos: [hospital_a.csv, hospital_b.csv, hospital_c.csv]   # relative to the config file's folder
      test: test.csv                                             # or client_test_fraction: 0.2
      schema: {label: readmitted, n_classes: 2, features: {age: int64, bmi: float32}}
      scaling: {mean: [60, 27], std: [15, 5]}                    # public statistics; `fit` is refused

Distribution names are matched case-insensitively (mixgauss1 -> MixGauss1) except where two names differ
only in case: `uniform` is U(low, high) and `Uniform` is PFA's U(1, 10) with its re-draw.

Layout (one idea per module; arrows point down, no cycles):

    errors      ConfigError and the rendering of a pydantic error as one line
    limits      dpfl's documented upper bounds (clients, rounds, steps, epochs, batch sizes, nesting)
    base        the strict _Section base every section derives from
    vocabulary  algorithm and mechanism names; what each mechanism protects, from whom
    data, model, training, budgets, privacy, algorithm     one module per section
    own_data    data.silos: the user's files (one per client), the declared schema, public scaling, paths
    run         RunConfig and the checks that span sections
    yaml_io, overrides, loading     YAML in, --set overrides, load_config / validate_config / config_to_yaml
"""

from __future__ import annotations

from dpfl.experiment.config.algorithm import ALGORITHM_MECHANISMS, ALGORITHM_PARAMS, AlgorithmConfig, StageConfig
from dpfl.experiment.config.budgets import (
    BUDGET_DISTRIBUTION_MODELS,
    Budgets,
    ChoiceBudgets,
    FixedBudgets,
    NamedBudgets,
    ParetoBudgets,
    Rhdp20Budgets,
    UniformBudgets,
)
from dpfl.experiment.config.data import DataConfig
from dpfl.experiment.config.errors import ConfigError
from dpfl.experiment.config.loading import config_to_dict, config_to_yaml, load_config, validate_config
from dpfl.experiment.config.model import PROVIDED_MODEL, ModelConfig
from dpfl.experiment.config.overrides import apply_overrides, device_override, parse_override
from dpfl.experiment.config.privacy import MisreportConfig, PrivacyConfig
from dpfl.experiment.config.run import RunConfig
from dpfl.experiment.config.training import (
    BatchSizeChoice,
    BatchSizeKind,
    CheckpointConfig,
    EvaluationConfig,
    OptimizerConfig,
    SelectionConfig,
    TrainingConfig,
)
from dpfl.experiment.config.vocabulary import (
    ALGORITHMS,
    MECHANISM_OBSERVER,
    MECHANISM_UNIT,
    MECHANISMS,
    AlgorithmName,
    Mechanism,
)
from dpfl.experiment.config.yaml_io import parse_yaml

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_MECHANISMS",
    "ALGORITHM_PARAMS",
    "BUDGET_DISTRIBUTION_MODELS",
    "MECHANISMS",
    "MECHANISM_OBSERVER",
    "MECHANISM_UNIT",
    "AlgorithmConfig",
    "StageConfig",
    "AlgorithmName",
    "BatchSizeChoice",
    "BatchSizeKind",
    "Budgets",
    "CheckpointConfig",
    "ChoiceBudgets",
    "ConfigError",
    "DataConfig",
    "EvaluationConfig",
    "FixedBudgets",
    "Mechanism",
    "MisreportConfig",
    "ModelConfig",
    "PROVIDED_MODEL",
    "NamedBudgets",
    "OptimizerConfig",
    "ParetoBudgets",
    "PrivacyConfig",
    "Rhdp20Budgets",
    "RunConfig",
    "SelectionConfig",
    "TrainingConfig",
    "UniformBudgets",
    "apply_overrides",
    "device_override",
    "config_to_dict",
    "config_to_yaml",
    "load_config",
    "parse_override",
    "parse_yaml",
    "validate_config",
]
