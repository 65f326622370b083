"""Structured heterogeneity for clustered FL (clustered_dpfl.md §2): clients in planted clusters, one a minority.

Cluster sizes (the reference code's): floor(ratio n) clients form the minority cluster 0, the rest split equally
over the M - 1 majority clusters; client ids are contiguous per cluster. Each client draws its own training,
validation and test records (without replacement within the client; clients may share records unless
`disjoint`): floor(|test| / n_maj) test records (floor(|test| / n) when disjoint; for label_shift at most the smallest
class group's test records, so that draw is always feasible), and its cluster's shift is applied to all three:
- `rotation` (covariate shift): cluster m's images rotated by m 360/M degrees before normalisation (exact rot90 for
  multiples of 90 degrees; otherwise scipy's bilinear rotation with zero fill, counter-clockwise);
- `label_flip`: y -> (y + m) mod C;
- `label_shift` (dpfl's definition, the paper's is not available): classes are grouped by c mod M, and each of a
  cluster-m client's records comes from group m with probability `purity` (else uniformly from the other classes).
Random streams: client i's draws use (PARTITION, round 3, client i), so a client's data depend only on the seed.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch

from dpfl.data.arrays import ArrayDataset, Normalize, channel_stats
from dpfl.data.federated import ClientData, FederatedDataset
from dpfl.seeding import Purpose, numpy_generator

__all__ = ["SHIFTS", "cluster_sizes", "clustered_split", "shift_images"]

SHIFTS: tuple[str, ...] = ("rotation", "label_flip", "label_shift")
Shift = Literal["rotation", "label_flip", "label_shift"]
DRAW_ROUND = 3  # the PARTITION stream's round for these draws (rounds 0-2 are FederatedDataset.from_arrays')


def cluster_sizes(n_clients: int, n_clusters: int, minority_ratio: float) -> list[int]:
    """[n_min, n_maj, ..., n_maj]: the minority cluster 0 first, then M - 1 equal majority clusters."""
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, (int, np.integer)) or n_clusters < 2:
        raise ValueError(f"n_clusters must be an integer >= 2, got {n_clusters!r}")
    if not 0 <= minority_ratio < 1:
        raise ValueError(f"minority_ratio must be in [0, 1), got {minority_ratio!r}")
    n_min = math.floor(minority_ratio * n_clients)
    rest, groups = n_clients - n_min, n_clusters - 1
    if n_min < 1 or rest < groups or rest % groups:
        valid = [n for n in range(max(2, n_clients - 50), n_clients + 51) if _valid(n, n_clusters, minority_ratio)]
        nearest = min(valid, key=lambda n: (abs(n - n_clients), n)) if valid else None
        raise ValueError(f"{n_clients} clients cannot form a minority cluster of floor({minority_ratio:g} n) >= 1 "
                         f"clients and {groups} equal majority clusters"
                         + (f"; the nearest valid number of clients is {nearest}" if nearest else ""))
    return [n_min] + [rest // groups] * groups


def _valid(n: int, m: int, ratio: float) -> bool:
    n_min = math.floor(ratio * n)
    return n_min >= 1 and n - n_min >= m - 1 and (n - n_min) % (m - 1) == 0


def shift_images(x: torch.Tensor, cluster: int, n_clusters: int) -> torch.Tensor:
    """Cluster m's covariate shift: NCHW images rotated by m 360 / M degrees (counter-clockwise, zero fill)."""
    angle = cluster * 360.0 / n_clusters
    if angle % 90 == 0:
        return torch.rot90(x, k=int(angle // 90), dims=(2, 3)).contiguous()
    from scipy import ndimage

    rotated = ndimage.rotate(x.numpy(), angle, axes=(2, 3), reshape=False, order=1, mode="constant", cval=0.0)
    return torch.from_numpy(np.ascontiguousarray(rotated, dtype=np.float32))


def clustered_split(base: ArrayDataset, n_clients: int, n_clusters: int = 4, *, shift: Shift = "rotation",
                    minority_ratio: float = 0.15, n_train_per_client: int = 8000, val_frac: float = 0.2,
                    seed: int = 0, disjoint: bool = False, purity: float = 0.9,
                    normalize: Normalize | None = None) -> FederatedDataset:
    """Clients in planted clusters (see the module docstring). `base` holds raw images in [0, 1] (`normalize` is
    applied after the shift); `info` records true_cluster and minority_cluster = 0."""
    if shift not in SHIFTS:
        raise ValueError(f"shift must be one of {', '.join(SHIFTS)}, got {shift!r}")
    sizes = cluster_sizes(n_clients, n_clusters, minority_ratio)
    if isinstance(n_train_per_client, bool) or not isinstance(n_train_per_client, int) or n_train_per_client < 1:
        raise ValueError(f"n_train_per_client must be an integer >= 1, got {n_train_per_client!r}")
    if not 0 <= val_frac < 1:
        raise ValueError(f"val_frac must be in [0, 1), got {val_frac!r}")
    if shift == "label_shift" and not 0 < purity <= 1:
        raise ValueError(f"purity must be in (0, 1], got {purity!r}")
    if shift == "rotation" and base.x_train.ndim != 4:
        raise ValueError(f"rotation needs NCHW images, {base.name!r} has samples of shape {base.input_shape}")
    truth = np.repeat(np.arange(n_clusters), sizes)
    n_draw = math.ceil(n_train_per_client / (1.0 - val_frac))
    y_train, y_test = base.y_train.numpy(), base.y_test.numpy()
    n_test = base.n_test // (n_clients if disjoint else sizes[1])
    if shift == "label_shift":  # a cluster's test records come mostly from its class group: keep the draw feasible
        n_test = min(n_test, min(int(((y_test % n_clusters) == m).sum()) for m in range(n_clusters)))
    if n_draw > base.n_train or n_test < 1:
        raise ValueError(f"each client draws {n_draw} of the {base.n_train} training records and "
                         f"floor({base.n_test} / {sizes[1]}) = {n_test} test records of {base.name!r}: too few")
    free = {"train": np.ones(base.n_train, dtype=bool), "test": np.ones(base.n_test, dtype=bool)}
    clients = []
    for i, m in enumerate(truth):
        rng = numpy_generator(seed, Purpose.PARTITION, DRAW_ROUND, i)
        draw = _draw(y_train, free["train"], n_draw, m, n_clusters, shift, purity, base.n_classes, rng)
        test = _draw(y_test, free["test"], n_test, m, n_clusters, shift, purity, base.n_classes, rng)
        if disjoint:
            free["train"][draw] = False
            free["test"][test] = False
        cut = n_train_per_client
        parts = [_shifted(base.x_train[idx], base.y_train[idx], m, n_clusters, shift, base.n_classes, normalize)
                 for idx in (draw[:cut], test, draw[cut:])]
        clients.append(ClientData(*parts[0], *parts[1], *parts[2]))
    x_test = base.x_test if normalize is None else _normalized(base.x_test, normalize)
    info = dict(dataset=base.name, n_clients=n_clients, partition="clustered", shift=shift, n_clusters=n_clusters,
                minority_ratio=minority_ratio, cluster_sizes=sizes, true_cluster=truth.tolist(), minority_cluster=0,
                n_train_per_client=n_train_per_client, val_frac=val_frac, disjoint=disjoint, seed=int(seed),
                global_test="the base test split, unshifted (cluster 0's view)")
    if shift == "label_shift":
        info["purity"] = purity
    return FederatedDataset(clients, x_test, base.y_test, base.n_classes, base.input_shape, info)


def _draw(labels: np.ndarray, free: np.ndarray, count: int, cluster: int, n_clusters: int, shift: str,
          purity: float, n_classes: int, rng: np.random.Generator) -> np.ndarray:
    """`count` distinct indices among the free ones: uniformly, or for label_shift mostly from group `cluster`."""
    if shift != "label_shift":
        return _choose(np.flatnonzero(free), count, rng)
    in_group = (labels % n_clusters) == cluster
    inside, outside = np.flatnonzero(free & in_group), np.flatnonzero(free & ~in_group)
    n_in = int(rng.binomial(count, purity))
    return rng.permutation(np.concatenate([_choose(inside, n_in, rng), _choose(outside, count - n_in, rng)]))


def _choose(pool: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    if count > len(pool):
        raise ValueError(f"a client needs {count} records but only {len(pool)} are left to draw from "
                         "(disjoint clients or a small class group): use fewer records per client")
    return rng.choice(pool, size=count, replace=False).astype(np.int64)


def _shifted(x: torch.Tensor, y: torch.Tensor, cluster: int, n_clusters: int, shift: str, n_classes: int,
             normalize: Normalize | None) -> tuple[torch.Tensor, torch.Tensor]:
    if shift == "rotation":
        x = shift_images(x, cluster, n_clusters)
    elif shift == "label_flip":
        y = (y + cluster) % n_classes
    return (x.clone() if normalize is None else _normalized(x, normalize)), y.clone()


def _normalized(x: torch.Tensor, normalize: Normalize) -> torch.Tensor:
    mean, std = channel_stats(normalize, n_channels=x.shape[1])
    return (x - mean) / std
