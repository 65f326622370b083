"""User-registered round stages: aggregators and local programs a config can name.

    @register_aggregator("coordinate_median")
    def coordinate_median(server_lr: float = 1.0):
        return MedianAggregator(server_lr)

    # config:  algorithm: {name: dp_fedavg_local, aggregator: {name: coordinate_median, params: {server_lr: 0.5}}}

An aggregator has ``aggregate(global_params, uploads, view, seed, round_) -> new global params``: `uploads` are
the selected clients' updates stacked along a leading axis ``[K, ...]`` (what the server received), `view` the
`ServerView` of their public facts and reported budgets. It only post-processes what the server already saw,
so it can replace the aggregator of any bundle whose guarantee holds against that server (local DP-SGD,
client-level uploads, parameter noise, or no privacy); central DP, where the server's aggregation IS the
mechanism, refuses it.

A local program factory receives the run's training settings as keywords (``lr, loss, steps, epochs, momentum,
private, clip, sampling``) plus its own params, and returns a `LocalProgram` built with `sgd` or `dpsgd`
(`dpfl.algorithms.client.program`): the engine executes that description for the whole cohort, and dpfl
accounts a private program from it, so a custom program can change what is trained and how (loss, trainable
parameters, proximal term, length), never how privacy is accounted. `build` checks that a private run's program
is DP-SGD with the config's clip and sampling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["AGGREGATORS", "LOCAL_PROGRAMS", "register_aggregator", "register_local_program"]

AGGREGATORS: dict[str, Callable[..., Any]] = {}
LOCAL_PROGRAMS: dict[str, Callable[..., Any]] = {}


def _register(table: dict[str, Callable[..., Any]], what: str, name: str, factory: Callable[..., Any] | None,
              replace: bool) -> Any:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a {what} name must be an identifier (letters, digits, _), got {name!r}")

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise ValueError(f"a {what} factory must be callable, got {type(fn).__name__}")
        if name in table and not replace:
            raise ValueError(f"{what} {name!r} is already registered; pass replace=True to replace it")
        table[name] = fn
        return fn

    return add if factory is None else add(factory)


def register_aggregator(name: str, factory: Callable[..., Any] | None = None, *, replace: bool = False) -> Any:
    """Register ``factory(**params) -> aggregator`` under `name`; usable as a decorator."""
    return _register(AGGREGATORS, "aggregator", name, factory, replace)


def register_local_program(name: str, factory: Callable[..., Any] | None = None, *, replace: bool = False) -> Any:
    """Register ``factory(*, lr, loss, steps, epochs, momentum, private, clip, sampling, **params) -> LocalProgram``
    under `name`; usable as a decorator."""
    return _register(LOCAL_PROGRAMS, "local program", name, factory, replace)
