"""The ServerApp: reads its run config, runs the dpfl config through `DpflStrategy`, writes the run directory.

Run config keys (`[tool.flwr.app.config]` of the Flower project, `flwr run --run-config`, or `server_app(...)`):
- `config`: the dpfl YAML config (a path; a relative path is looked up in the working directory, then in the
  Flower project's directory, which the FAB carries);
- `set`: overrides, `;`-separated `field.path=value` (as `dpfl run --set`), e.g. "training.rounds=3";
- `out`: the run directory to write (default `runs/flower-<name>` under the ServerApp's working directory); a
  finished run leaves summary.json there, a failed one `flower-failure.txt` (the reason; `dpfl flower check`);
- `nodes`: how many SuperNodes (= dpfl clients) the run has: sets the config's `data.clients` (0: the config's);
- `shared-seed`: send the run seed to the nodes (testing equivalence with the simulation ONLY; not private
  against the server); default false;
- `timeout`: seconds to wait for a round's replies; `node-timeout`: for every client's SuperNode to connect.
"""

from __future__ import annotations

import sys
from logging import ERROR
from pathlib import Path
from typing import Any

from dpfl.flower import require_flwr

require_flwr()

from flwr.app import Context  # noqa: E402
from flwr.common.logger import log  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from dpfl.flower.strategy import DpflStrategy  # noqa: E402

DEFAULTS: dict[str, Any] = {"config": "", "set": "", "out": "", "nodes": 0, "shared-seed": False, "timeout": 300.0,
                            "node-timeout": 60.0}


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
    nodes = int(conf["nodes"])
    if nodes < 0:
        raise ValueError(f"run config `nodes` must be >= 0 (0: the config's data.clients), got {nodes}")
    if nodes:  # one number for both sides: the SuperNodes started and the run's clients
        overrides.append(f"data.clients={nodes}")
    cfg = load_config(find_config(str(conf["config"])), overrides)
    out = Path(str(conf["out"])) if conf["out"] else Path("runs") / f"flower-{cfg.name}"
    return DpflStrategy(cfg, out, shared_seed=bool(conf["shared-seed"]), timeout=float(conf["timeout"]),
                        node_timeout=float(conf["node-timeout"]))


def server_app(**defaults: Any) -> ServerApp:
    """A ServerApp whose run config falls back to `defaults` (a ServerApp built in Python, whose project gives no
    run config): keys as in the module docstring, `shared_seed` or `shared-seed`. A run that fails leaves its
    reason in `out` (`note_failure`) and re-raises, so that Flower marks the run failed too."""
    defaults = {k.replace("_", "-"): v for k, v in defaults.items()}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        conf = {**defaults, **dict(context.run_config)}
        strategy = None
        try:
            strategy = strategy_from(conf)
            strategy.start(grid)
        except Exception as err:
            reason = " ".join(str(err).split()) or type(err).__name__
            log(ERROR, "dpfl: the run failed: %s", reason)
            note_failure(strategy, conf, reason)
            raise

    return app


def note_failure(strategy: DpflStrategy | None, conf: dict[str, Any], reason: str) -> None:
    """Leave the reason in the run directory (`dpfl flower check` reads it), unless that directory holds another
    run: the strategy claimed it, or (a config the strategy never got) it is free."""
    from dpfl.experiment.run_directory import is_occupied
    from dpfl.flower.verdict import only_failed_attempts, write_failure

    if strategy is not None:
        out, ours = strategy.out, strategy.claimed
    elif conf.get("out"):
        out = Path(str(conf["out"]))
        ours = not is_occupied(out) or only_failed_attempts(out)
    else:
        return
    if ours:
        try:
            write_failure(out, reason)
        except OSError as err:
            log(ERROR, "dpfl: could not write the failure note in %s: %s", out, err)


app = server_app()
