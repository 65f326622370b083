"""dpfl: differentially private federated learning with per-client privacy ledgers."""

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (dynamic)
