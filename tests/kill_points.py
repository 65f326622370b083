"""Kill points for the resume tests: run the `dpfl` CLI with a SIGKILL injected at a chosen point.

As a script (what the tests start in a subprocess)::

    python tests/kill_points.py POINT N -- run CONFIG --out DIR [--set ...] [--resume]

kills the process (``os.kill(os.getpid(), SIGKILL)``: no cleanup, no ``finally``, like the OOM killer or
a power cut) on the N-th time POINT is reached, then never returns; if POINT is reached fewer than N
times the CLI simply finishes. The points, all injected here, from the test side (the library has no
hook for them):

- ``train``: the N-th local-training step of a client (``BatchStream.next``): inside a round.
- ``rename:NAME``: the N-th atomic write of the file NAME (``checkpoint.pt``, ``privacy.json``,
  ``summary.json``, ``report.md``, ``accuracy.png``...), after its temporary file was written and
  before the rename: the temporary file stays behind.
- ``metrics``: the N-th metrics row: the first half of its line is written (no newline), then the kill:
  the file ends with a truncated line.
- ``summary``: the N-th write of ``summary.json``, before it starts (``privacy.json`` is written).
- ``report``: the N-th ``write_report`` of the run directory, before it starts (``summary.json`` is
  written, ``report.md`` and the plots are not).

:func:`install` puts the same hooks in place in-process with any action, e.g. to count how often each
point is reached in an uninterrupted run (``Counter``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

POINT_KINDS = ("train", "rename:", "metrics", "summary", "report")

Action = Callable[[str, dict[str, Any]], None]  # (point, context) -> None, called before the original


def install(action: Action, patch: Callable[[Any, str, Any], None] = setattr) -> None:
    """Wrap the functions behind every kill point so that `action(point, context)` runs first.

    `patch(owner, name, value)` sets the attribute (``setattr``, or ``monkeypatch.setattr`` to undo it).
    """
    import dpfl.experiment.run_directory as rd
    from dpfl.engine.sampling import BatchStream

    next_step = BatchStream.next

    def step(self, *args, **kwargs):
        action("train", {})
        return next_step(self, *args, **kwargs)

    replace = os.replace

    def renamed(src, dst, *args, **kwargs):
        action(f"rename:{Path(dst).name}", {"src": src, "dst": dst})
        return replace(src, dst, *args, **kwargs)

    append = rd.append_jsonl

    def appended(path, row, *args, **kwargs):
        action("metrics", {"path": path, "row": row})
        return append(path, row, *args, **kwargs)

    write_json = rd.write_json_atomic

    def wrote_json(path, obj, *args, **kwargs):
        if Path(path).name == "summary.json":
            action("summary", {"path": path})
        return write_json(path, obj, *args, **kwargs)

    report = rd.write_report

    def reported(run_dir, *args, **kwargs):
        action("report", {"run_dir": run_dir})
        return report(run_dir, *args, **kwargs)

    patch(BatchStream, "next", step)
    patch(os, "replace", renamed)
    patch(rd, "append_jsonl", appended)
    patch(rd, "write_json_atomic", wrote_json)
    patch(rd, "write_report", reported)


def killer(point: str, n: int) -> Action:
    """The action that SIGKILLs this process the `n`-th time `point` is reached."""
    seen = [0]

    def action(reached: str, context: dict[str, Any]) -> None:
        if reached != point:
            return
        seen[0] += 1
        if seen[0] != n:
            return
        if point == "metrics":  # a writer killed mid-append: half a line, no newline
            line = json.dumps(context["row"], default=lambda o: o.tolist()).encode("utf-8")
            with open(context["path"], "ab") as f:
                f.write(line[: max(1, len(line) // 2)])
                f.flush()
                os.fsync(f.fileno())
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    return action


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[2] != "--":
        raise SystemExit("usage: kill_points.py POINT N -- DPFL-ARGS...")
    point, n = argv[0], int(argv[1])
    if not point.startswith(POINT_KINDS):
        raise SystemExit(f"unknown kill point {point!r} (one of {', '.join(POINT_KINDS)}NAME)")
    install(killer(point, n))
    from dpfl.cli import main as dpfl_main

    dpfl_main(argv[3:])


if __name__ == "__main__":
    main(sys.argv[1:])
