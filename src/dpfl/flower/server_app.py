"""The ServerApp: reads its run config, runs the dpfl config through `DpflStrategy`, writes the run directory.

Run config keys (`[tool.flwr.app.config]` of the Flower project, `flwr run --run-config`, or `server_app(...)`):
- `config`: the dpfl YAML config (a path; a relative path is looked up in the working directory, then in the
  Flower project's directory, which the FAB carries);
- `set`: overrides, `;`-separated `field.path=value` (as `dpfl run --set`), e.g. "training.rounds=3";
- `out`: the run directory to write (default `runs/flower-<name>` under the ServerApp's working directory);
- `shared-seed`: send the run seed to the nodes (testing equivalence with the simulation ONLY; not private
  against the server); default false;
- `timeout`: seconds to wait for a round's replies; `node-timeout`: for every client's SuperNode to connect.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from dpfl.flower import require_flwr

require_flwr()

from flwr.app import Context  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from dpfl.flower.strategy import DpflStrategy  # noqa: E402

DEFAULTS: dict[str, Any] = {"config": "", "set": "", "out": "", "shared-seed": False, "timeout": 300.0,
                            "node-timeout": 120.0}


def find_config(name: str) -> Path:
    """`name` as given, else in a directory on sys.path (Flower puts the project's directory there)."""
    if not name:
        raise ValueError("run config `config` is empty: name the dpfl YAML config to run")
    path = Path(name).expanduser()
    if path.is_absolute() or path.is_file():
        return path
    for folder in sys.path:
        if folder and (Path(folder) / path).is_file():
            return Path(folder) / path
    return path  # load_config reports the missing file


def strategy_from(run_config: dict[str, Any]) -> DpflStrategy:
    """The strategy of a run config (DEFAULTS filled in)."""
    from dpfl.experiment.config import load_config

    conf = {**DEFAULTS, **run_config}
    overrides = [s.strip() for s in str(conf["set"]).split(";") if s.strip()]
    cfg = load_config(find_config(str(conf["config"])), overrides)
    out = Path(str(conf["out"])) if conf["out"] else Path("runs") / f"flower-{cfg.name}"
    return DpflStrategy(cfg, out, shared_seed=bool(conf["shared-seed"]), timeout=float(conf["timeout"]),
                        node_timeout=float(conf["node-timeout"]))


def server_app(**defaults: Any) -> ServerApp:
    """A ServerApp whose run config falls back to `defaults` (e.g. for `flwr.simulation.run_simulation`, which
    gives no run config): keys as in the module docstring, `shared_seed` or `shared-seed`."""
    defaults = {k.replace("_", "-"): v for k, v in defaults.items()}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy_from({**defaults, **dict(context.run_config)}).start(grid)

    return app


app = server_app()
