"""dpfl: differentially private federated learning with per-client privacy ledgers."""

__version__ = "0.1.0"
