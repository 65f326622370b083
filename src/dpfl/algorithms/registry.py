"""The names a config can give: algorithms (the built-in catalog and the user's), and user-registered round stages
(aggregators and local programs).

    @register_algorithm("my_fedavg", params=MyParams, mechanisms=("dpsgd",))
    def my_fedavg(run: RunFacts, *, server_lr: float = 1.0) -> Algorithm:
        ...

    # config:  algorithm: {name: my_fedavg, params: {server_lr: 0.5}}

An algorithm is registered with its factory ``factory(run, **params) -> Algorithm`` (`run`: the
`dpfl.algorithms.catalog.context.RunFacts` of the run it is built for), the pydantic model of its params (what
the config validates `algorithm.params` with) and the privacy mechanisms it runs with (the first is the default).
dpfl's own algorithms are registered first, from `dpfl.algorithms.catalog.builtins`, before any lookup or
registration; a name is registered once.

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
from dataclasses import dataclass
from typing import Any

__all__ = ["AGGREGATORS", "ALGORITHMS", "LOCAL_PROGRAMS", "AlgorithmSpec", "algorithm_names", "algorithm_spec",
           "register_aggregator", "register_algorithm", "register_local_program"]

# the config's privacy.mechanism; mpdp / mpdp_central: MP-DP's family, whose methods state their own per-round
# guarantee (privacy.json's `stage` block: nominal for MP-DP, never in the ledger)
MECHANISMS: tuple[str, ...] = ("dpsgd", "udp", "central", "param_noise", "mpdp", "mpdp_central", "none")

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


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm a config can name: its factory, its params model (a pydantic model) and its mechanisms.

    `with_data`: the bundle depends on the data split (the clustered algorithms): its factory reads run.data,
    budgets and batch_sizes and returns a `catalog.clustered.ClusteredBuild` (the bundle and each client's noise).
    """

    name: str
    factory: Callable[..., Any]
    params: type
    mechanisms: tuple[str, ...]
    with_data: bool = False


ALGORITHMS: dict[str, AlgorithmSpec] = {}  # read it through algorithm_spec / algorithm_names (they load dpfl's own)
_BUILTIN_NAMES: set[str] = set()


def _algorithms() -> dict[str, AlgorithmSpec]:
    """The table, dpfl's own algorithms first (so they keep their order and their names)."""
    if not _BUILTIN_NAMES:
        from dpfl.algorithms.catalog.builtins import BUILTINS

        _BUILTIN_NAMES.update(spec.name for spec in BUILTINS)
        ALGORITHMS.update({spec.name: spec for spec in BUILTINS})
    return ALGORITHMS


def register_algorithm(name: str, factory: Callable[..., Any] | None = None, *, params: type,
                       mechanisms: tuple[str, ...] = ("dpsgd",), replace: bool = False) -> Any:
    """Register ``factory(run: RunFacts, **params) -> Algorithm`` under `name`, with `params` (a pydantic model
    of its keyword arguments) and the `mechanisms` it runs with (the first is the default); usable as a decorator."""
    from pydantic import BaseModel

    if not (isinstance(params, type) and issubclass(params, BaseModel)):
        raise ValueError(f"algorithm {name!r}: params must be a pydantic model class, got {params!r}")
    mechanisms = tuple(mechanisms)
    unknown = [m for m in mechanisms if m not in MECHANISMS]
    if not mechanisms or unknown:
        raise ValueError(f"algorithm {name!r}: mechanisms must be one or more of {', '.join(MECHANISMS)}, got "
                         f"{mechanisms!r}")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"an algorithm name must be an identifier (letters, digits, _), got {name!r}")
    table = _algorithms()

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise ValueError(f"an algorithm factory must be callable, got {type(fn).__name__}")
        if name in table and (not replace or name in _BUILTIN_NAMES):
            how = "it is one of dpfl's own" if name in _BUILTIN_NAMES else "pass replace=True to replace it"
            raise ValueError(f"algorithm {name!r} is already registered; {how}")
        table[name] = AlgorithmSpec(name, fn, params, mechanisms)
        return fn

    return add if factory is None else add(factory)


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The registered algorithm `name` (KeyError if none is)."""
    return _algorithms()[name]


def algorithm_names() -> tuple[str, ...]:
    """Every name a config's algorithm.name may take: dpfl's own in their order, then the user's."""
    return tuple(_algorithms())
