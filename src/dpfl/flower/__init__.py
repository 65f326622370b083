"""Run a dpfl algorithm as a Flower app (the `dpfl[flower]` extra).

- `server_app.app`: the ServerApp. Its strategy (`strategy.DpflStrategy`) keeps dpfl's whole round loop on the
  server (selection, per-client ledger, aggregation, evaluation, privacy report) and asks the SuperNodes for the
  selected clients' uploads (`clients.FlowerClients`).
- `client_app.app`: the ClientApp. It runs dpfl's local program (DP-SGD or update clipping + noise) on the node's
  own partition and returns the upload (`client_app.client_upload`).

Importing this package does not import Flower; `require_flwr()` gives the one-line error of a missing extra.
See docs/flower.md and examples/flower/.
"""

from __future__ import annotations

INSTALL_HINT = "pip install 'dpfl[flower]'"


class FlowerMissing(ImportError):
    """Flower (`flwr`) is not installed."""


def require_flwr() -> None:
    """Import flwr, or raise FlowerMissing with one line naming the install command."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise FlowerMissing(f"the Flower federation needs the flower extra: {INSTALL_HINT}") from None


__all__ = ["INSTALL_HINT", "FlowerMissing", "require_flwr"]
