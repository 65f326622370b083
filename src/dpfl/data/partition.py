"""Split sample indices among clients: iid, label shards (McMahan et al.), Dirichlet label skew, and the equal IID
shards of MP-DP's comparison.

Each partitioner returns one sorted int64 index array per client (`iid_equal` keeps its permutation's order). The
arrays are disjoint; iid with default sizes, shards and dirichlet cover every index, iid with explicit sizes covers
``sum(sizes)`` of them. ``rng`` is a numpy Generator or an int seed (turned into dpfl's PARTITION stream), so the
same seed gives the same split everywhere.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from dpfl.seeding import Purpose, numpy_generator

RngLike = np.random.Generator | int | None


def iid(n: int, n_clients: int, rng: RngLike = None, sizes: Sequence[int] | None = None) -> list[np.ndarray]:
    """Uniformly random disjoint subsets: equal sizes (the first ``n % n_clients`` get one more) or ``sizes``."""
    flat, counts = iid_flat(n, n_clients, rng, sizes)
    return np.split(flat, np.cumsum(counts)[:-1]) if n_clients > 1 else [flat]


def iid_flat(n: int, n_clients: int, rng: RngLike = None,
             sizes: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`iid`'s split as (every client's sorted indices one after the other, each client's count), with no Python per
    client: a population of millions is split in a few numpy passes. The same draw as `iid`."""
    _check_int("n", n, 0)
    _check_int("n_clients", n_clients, 1)
    gen = _generator(rng)
    if sizes is None:
        base, extra = divmod(n, n_clients)
        counts = np.full(n_clients, base, dtype=np.int64)
        counts[:extra] += 1
    else:
        counts = np.asarray(sizes)
        if counts.shape != (n_clients,) or not np.issubdtype(counts.dtype, np.integer):
            raise ValueError(f"sizes must be {n_clients} integers (one per client), got {sizes!r}")
        if (counts < 0).any():
            raise ValueError(f"sizes must be >= 0, got {sizes!r}")
        if counts.sum() > n:
            raise ValueError(f"sizes must sum to at most n={n}, got sum {int(counts.sum())}")
        counts = counts.astype(np.int64)
    perm = gen.permutation(n)
    # client i holds perm[bounds[i]:bounds[i + 1]], sorted: each index's owner, then the indices in owner order
    # (a stable sort keeps each client's indices increasing); indices past the last bound belong to nobody
    owner = np.empty(n, dtype=np.int64)
    owner[perm] = np.repeat(np.arange(n_clients + 1, dtype=np.int64), np.append(counts, n - counts.sum()))
    flat = np.argsort(owner, kind="stable")[: int(counts.sum())].astype(np.int64)
    return flat, counts


def iid_equal(n: int, n_clients: int, rng: RngLike = None, per_client: int | None = None) -> list[np.ndarray]:
    """Equal IID shards of one seeded permutation: client k holds its positions k m .. (k + 1) m - 1, m = `per_client`
    or floor(n / n_clients); the rest is left out. MP-DP's comparison runs on this split (spec bidirectional.md §11).
    Each shard keeps the permutation's order, not sorted: FedSGD draws its batches by position in the shard."""
    _check_int("n", n, 0)
    _check_int("n_clients", n_clients, 1)
    per = n // n_clients if per_client is None else per_client
    _check_int("per_client", per, 1)
    if per * n_clients > n:
        raise ValueError(f"{n_clients} clients x {per} records exceed the {n} records")
    perm = _generator(rng).permutation(n)
    return [perm[k * per:(k + 1) * per].astype(np.int64) for k in range(n_clients)]


def label_shards(
    labels: np.ndarray, n_clients: int, shards_per_client: int = 2, rng: RngLike = None
) -> list[np.ndarray]:
    """Sort by label, cut ``n_clients * shards_per_client`` equal shards, deal each client random shards.

    With 2 shards per client most clients see at most 2 classes (McMahan et al., 2017). Ties within
    a label are broken randomly so shard contents do not depend on file order.
    """
    labels = _check_labels(labels)
    _check_int("n_clients", n_clients, 1)
    _check_int("shards_per_client", shards_per_client, 1)
    n_shards = n_clients * shards_per_client
    if labels.shape[0] < n_shards:
        raise ValueError(
            f"need at least n_clients * shards_per_client = {n_shards} samples for label shards, got {labels.shape[0]}"
        )
    gen = _generator(rng)
    shuffled = gen.permutation(labels.shape[0])
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(by_label, n_shards)
    order = gen.permutation(n_shards)
    return [
        np.sort(np.concatenate([shards[s] for s in order[c * shards_per_client : (c + 1) * shards_per_client]])).astype(
            np.int64
        )
        for c in range(n_clients)
    ]


def dirichlet(
    labels: np.ndarray,
    n_clients: int,
    alpha: float,
    rng: RngLike = None,
    min_size: int = 1,
    max_tries: int = 100,
) -> list[np.ndarray]:
    """Label skew: each class is split among clients in proportions drawn from Dirichlet(alpha).

    Smaller alpha means more skew. A draw is redone while some client has fewer than ``min_size``
    samples; after ``max_tries`` draws the last one is repaired deterministically (samples move from
    the largest client to those below ``min_size``) with a warning, so this never loops forever.
    """
    labels = _check_labels(labels)
    _check_int("n_clients", n_clients, 1)
    _check_int("min_size", min_size, 0)
    _check_int("max_tries", max_tries, 1)
    if not (isinstance(alpha, (int, float, np.floating, np.integer)) and np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
    n = labels.shape[0]
    if n < n_clients * min_size:
        raise ValueError(
            f"cannot give {n_clients} clients at least min_size={min_size} samples each from {n} samples "
            f"(need n >= n_clients * min_size = {n_clients * min_size})"
        )
    gen = _generator(rng)
    classes = np.unique(labels)
    members = [np.flatnonzero(labels == k) for k in classes]
    for _ in range(max_tries):
        parts = _dirichlet_draw(members, n_clients, float(alpha), gen)
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(p).astype(np.int64) for p in parts]
    warnings.warn(
        f"dirichlet partition: no draw gave every client >= {min_size} samples in {max_tries} tries "
        f"(alpha={alpha}, n_clients={n_clients}); moved samples from the largest clients instead",
        RuntimeWarning,
        stacklevel=2,
    )
    return [np.sort(p).astype(np.int64) for p in _repair(parts, min_size)]


def dirichlet_quota(labels: np.ndarray, n_clients: int, alpha: float, quota: int,
                    rng: RngLike = None) -> list[np.ndarray]:
    """Label skew with equal sizes (spec fdp_accounting.md §8): each client draws class proportions
    p ~ Dir(alpha·1_C), then fills its `quota` one sample at a time: a class from p renormalised over the
    classes that still have samples, a sample of it uniformly without replacement. Clients fill in turn."""
    labels = _check_labels(labels)
    _check_int("n_clients", n_clients, 1)
    _check_int("quota", quota, 1)
    if not (isinstance(alpha, (int, float, np.floating, np.integer)) and np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
    if n_clients * quota > labels.shape[0]:
        raise ValueError(f"{n_clients} clients x {quota} samples need {n_clients * quota} samples, only "
                         f"{labels.shape[0]} available")
    gen = _generator(rng)
    classes = np.unique(labels)
    left = [list(gen.permutation(np.flatnonzero(labels == k))) for k in classes]
    parts = []
    for _ in range(n_clients):
        p = gen.dirichlet(np.full(len(classes), float(alpha)))
        if not np.all(np.isfinite(p)) or p.sum() <= 0:  # tiny alpha can underflow to all zeros
            p = np.zeros(len(classes))
            p[gen.integers(len(classes))] = 1.0
        mine = []
        for _ in range(quota):
            w = np.array([p[c] if left[c] else 0.0 for c in range(len(classes))])
            if w.sum() <= 0:  # the client's classes are used up: renormalise over what remains, uniformly
                w = np.array([1.0 if left[c] else 0.0 for c in range(len(classes))])
            c = int(gen.choice(len(classes), p=w / w.sum()))
            mine.append(left[c].pop())
        parts.append(np.sort(np.asarray(mine, dtype=np.int64)))
    return parts


def _dirichlet_draw(
    members: list[np.ndarray], n_clients: int, alpha: float, gen: np.random.Generator
) -> list[np.ndarray]:
    buckets: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for idx in members:
        idx = gen.permutation(idx)
        p = gen.dirichlet(np.full(n_clients, alpha))
        if not np.all(np.isfinite(p)) or p.sum() <= 0:  # tiny alpha can underflow to all zeros
            p = np.zeros(n_clients)
            p[gen.integers(n_clients)] = 1.0
        cuts = np.floor(np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
        for c, chunk in enumerate(np.split(idx, cuts)):
            buckets[c].append(chunk)
    return [np.concatenate(b) if b else np.empty(0, dtype=np.int64) for b in buckets]


def _repair(parts: list[np.ndarray], min_size: int) -> list[np.ndarray]:
    """Move samples from the currently largest client to each client below ``min_size`` (deterministic)."""
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    for c in range(len(parts)):
        while len(parts[c]) < min_size:
            donor = int(np.argmax([len(p) for p in parts]))
            need = min(min_size - len(parts[c]), len(parts[donor]) - min_size)
            parts[c] = np.concatenate([parts[c], parts[donor][-need:]])
            parts[donor] = parts[donor][:-need]
    return parts


def _generator(rng: RngLike) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return numpy_generator(0, Purpose.PARTITION)
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0:
        return numpy_generator(int(rng), Purpose.PARTITION)
    raise ValueError(f"rng must be a numpy Generator, a non-negative int seed or None, got {rng!r}")


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-d array, got shape {labels.shape}")
    return labels


def _check_int(name: str, value: object, low: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
