"""Where a round's local training runs: in this process (`local`) or sharded across Ray actors (`ray`).

A backend trains a cohort's plans and returns a `LocalResult` in plan order; everything else of a round
(selection, uploads, aggregation, accounting) stays in the run's process. Since every client's batches
and noise are keyed by (seed, round, client), the backend decides only where the arithmetic happens.
"""

from dpfl.engine.backends.errors import BackendError

__all__ = ["BackendError"]  # Backend: backends/base.py; LocalBackend: backends/local.py; RayBackend: backends/ray.py
