"""PFA: Projected Federated Averaging (Liu et al., PVLDB 2022; spec heterogeneous_dp §4.2).

Clients are split once, from their *reported* epsilons, into public (large ε) and private ones. Each
round, the private group's ε-weighted mean update is projected onto a low-dimensional subspace fitted
to the public clients' updates (per tensor by default), which removes most of the private DP noise,
and the two groups are combined with weights E_pub, E_pri (their summed reported ε):

    d_pub = Σ_{S_pub} (ε_i/E_pub) u_i          d_pri = Σ_{S_pri} (ε_i/E_pri) u_i
    d̂_pri,ℓ = μ_ℓ + V_ℓ V_ℓᵀ (d_pri,ℓ − μ_ℓ)    (subspace of the public updates of tensor ℓ)
    Δ̄_ℓ = (E_pub d_pub,ℓ + E_pri d̂_pri,ℓ) / (E_pub + E_pri)
    w ← w + server_lr · Δ̄

If no private client takes part, Δ̄ = d_pub, i.e. WeiAvg over the public clients (§9.9). The runner
re-draws a round's sample up to 50 times until `accepts_selection` (some public participant); a round
with no public participant raises `NoPublicClients` (the engine maps it to stop_reason "no_public").

The split is computed over the whole population (`PFA.fit_split(clients, eps_reported)` returns a
PFA with `public_clients` fixed). If it was never fitted and `split` is not `explicit`, the split rule
is applied to the round's participants only (identical under full participation).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpfl.algorithms.server.subspace import SOLVERS, SUBSPACES, Subspace, fit_subspace
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import ServerStep
from dpfl.engine import params as P
from dpfl.seeding import Purpose, numpy_generator, torch_generator
from dpfl.algorithms.server.stop import StopTraining

SPLITS = ("top_fraction", "gmm", "kmeans", "explicit")
SCOPES = ("tensor", "model")
GROUP_WEIGHTINGS = ("epsilon", "count")

# Client keys of PFA's random streams under Purpose.SERVER_NOISE; far above any real client id, so they
# never collide with other server-noise streams. Per tensor ℓ: random basis PFA_STREAM + 2ℓ, Lanczos start
# PFA_STREAM + 2ℓ + 1; the split's k-means / GMM initialisation uses PFA_SPLIT_STREAM.
PFA_STREAM = 1 << 21
PFA_SPLIT_STREAM = (1 << 21) - 1


@dataclass(frozen=True)
class Groups:
    """A round's public/private participants and their group weights (ε_i, or 1 with `count`)."""

    pub: torch.Tensor  # bool [K]
    raw: torch.Tensor  # float64 [K]

    @property
    def pri(self) -> torch.Tensor:
        return ~self.pub

    @property
    def E_pub(self) -> torch.Tensor:
        return self.raw[self.pub].sum()

    @property
    def E_pri(self) -> torch.Tensor:
        return self.raw[self.pri].sum()

    @property
    def w_pub(self) -> torch.Tensor:
        return self.raw[self.pub] / self.E_pub

    @property
    def w_pri(self) -> torch.Tensor | None:
        return self.raw[self.pri] / self.E_pri if self.pri.any() else None

    def row_weights(self) -> torch.Tensor:
        """[2, K] float64 (or [1, K] without private participants): the group means as weights on all K rows."""
        w = torch.zeros(2 if self.pri.any() else 1, len(self.pub), dtype=torch.float64)
        w[0, self.pub] = self.w_pub
        if w.shape[0] == 2:
            w[1, self.pri] = self.w_pri
        return w

    def combine(self, d_pub: torch.Tensor, d_pri_hat: torch.Tensor) -> torch.Tensor:
        """Δ̄_ℓ = (E_pub·d_pub + E_pri·d̂_pri) / (E_pub + E_pri)."""
        return (self.E_pub * d_pub + self.E_pri * d_pri_hat) / (self.E_pub + self.E_pri)


class NoPublicClients(StopTraining):
    """No public client takes part in the round: PFA cannot fit a subspace (stop_reason "no_public")."""

    stop_reason = "no_public"


_CHUNK_ELEMENTS = 1 << 18  # float64 elements of an upload block converted at a time (2 MiB)


def float64_column_chunks(flat: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
    """(columns, float64 copy of those columns) of a K × p block, a few MiB at a time (in cache), so the
    float64 arithmetic of PFA never holds a float64 copy of the whole block."""
    K, p = flat.shape
    step = max(1, _CHUNK_ELEMENTS // max(K, 1))
    for a in range(0, p, step):
        cols = slice(a, min(a + step, p))
        yield cols, flat[:, cols].to(torch.float64)


def weighted_rows64(flat: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`weights @ flat` in float64 ([G, K] @ [K, p] -> [G, p]) without a float64 copy of all of `flat`.

    The group means of PFA, column chunk by column chunk instead of copying the block whole to float64 and
    then copying each group's rows out of it. Rows with weight 0 add exact zeros, so this equals
    `w_group @ X[group]` up to the order of the float64 additions.
    """
    weights = weights.to(device=flat.device, dtype=torch.float64)  # the view's weights live on the CPU
    if flat.dtype == torch.float64:
        return weights @ flat
    out = torch.empty((weights.shape[0], flat.shape[1]), dtype=torch.float64, device=flat.device)
    for cols, block in float64_column_chunks(flat):
        out[:, cols] = weights @ block
    return out


def _check_eps(eps: np.ndarray) -> None:
    if eps.ndim != 1 or eps.size == 0:
        raise ValueError("the PFA split needs a non-empty vector of reported epsilons")
    if not np.all(np.isfinite(eps)) or not np.all(eps > 0):
        raise ValueError("PFA needs a finite reported epsilon > 0 for every client (some declared no budget)")


def top_fraction_split(eps: np.ndarray, public_fraction: float = 0.1) -> np.ndarray:
    """The PFA code's rule: thr = sorted(ε)[−max(1, ⌊f·M⌋)], public = {ε_i >= thr} (ties included)."""
    eps = np.asarray(eps, dtype=np.float64)
    _check_eps(eps)
    n_top = max(1, math.floor(public_fraction * eps.size + 1e-9))  # 1e-9: 0.1*30 is 3.0000000000000004
    n_top = min(n_top, eps.size)
    thr = np.sort(eps)[-n_top]
    return eps >= thr


def cluster_split(eps: np.ndarray, method: str, seed: int = 0) -> np.ndarray:
    """Two clusters of ε (k-means on ε, or a GMM on min–max-scaled ε); public = the larger-mean cluster.

    With fewer than two distinct ε values there is nothing to split and every client is public.
    """
    from sklearn.cluster import KMeans
    from sklearn.mixture import GaussianMixture

    eps = np.asarray(eps, dtype=np.float64)
    _check_eps(eps)
    if np.unique(eps).size < 2:
        return np.ones(eps.size, dtype=bool)
    rs = int(numpy_generator(seed, Purpose.SERVER_NOISE, 0, PFA_SPLIT_STREAM).integers(2**31 - 1))
    if method == "kmeans":
        x = eps.reshape(-1, 1)
        km = KMeans(n_clusters=2, n_init=10, random_state=rs).fit(x)
        centres = km.cluster_centers_.ravel()
        return km.labels_ == int(np.argmax(centres))
    if method == "gmm":
        x = ((eps - eps.min()) / (eps.max() - eps.min())).reshape(-1, 1)
        gm = GaussianMixture(n_components=2, random_state=rs).fit(x)
        return gm.predict(x) == int(np.argmax(gm.means_.ravel()))
    raise ValueError(f"unknown cluster split {method!r}")


@dataclass(frozen=True)
class PFA(ServerStep):
    """Projected Federated Averaging (spec §4.2); see the module docstring for the update.

    Fields (spec names): `split` (top_fraction | gmm | kmeans | explicit), `public_fraction` (0.1),
    `public_clients` (the explicit list, or the fitted split), `subspace` (centered | second-moment |
    mean-outer | random), `random_center`, `k` (1), `scope` (tensor | model), `svd_solver`
    (exact | lanczos), `lanczos_iters` (256), `weighting` (epsilon | count), `server_lr`.
    """

    # The weights say how much of each client reaches Δ̄, but private updates pass through a projection,
    # so sum_i w_i^2 sigma_i^2 is NOT the aggregate's noise: the runner logs no noise statistic for PFA.
    linear_in_updates = False
    replays_noise = True

    split: str = "top_fraction"
    public_fraction: float = 0.1
    public_clients: tuple[int, ...] | None = None
    subspace: str = "centered"
    k: int = 1
    scope: str = "tensor"
    svd_solver: str = "exact"
    lanczos_iters: int = 256
    random_center: bool = False
    weighting: str = "epsilon"
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"PFA split must be one of {SPLITS}, got {self.split!r}")
        if self.subspace not in SUBSPACES:
            raise ValueError(f"PFA subspace must be one of {SUBSPACES}, got {self.subspace!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"PFA scope must be one of {SCOPES}, got {self.scope!r}")
        if self.svd_solver not in SOLVERS:
            raise ValueError(f"PFA svd_solver must be one of {SOLVERS}, got {self.svd_solver!r}")
        if self.weighting not in GROUP_WEIGHTINGS:
            raise ValueError(f"PFA weighting must be one of {GROUP_WEIGHTINGS}, got {self.weighting!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"PFA k must be an integer >= 1, got {self.k!r}")
        if self.subspace == "mean-outer" and self.k != 1:
            raise ValueError("PFA subspace 'mean-outer' is rank 1 (Algorithm 3 literal); k must be 1")
        if isinstance(self.lanczos_iters, bool) or not isinstance(self.lanczos_iters, int) or self.lanczos_iters < 1:
            raise ValueError(f"PFA lanczos_iters must be an integer >= 1, got {self.lanczos_iters!r}")
        if self.svd_solver == "lanczos" and self.k > self.lanczos_iters:
            raise ValueError(f"PFA k={self.k} exceeds lanczos_iters={self.lanczos_iters} "
                             "(at most that many Ritz vectors)")
        if not 0 < self.public_fraction <= 1:
            raise ValueError(f"PFA public_fraction must be in (0, 1], got {self.public_fraction}")
        if not self.server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {self.server_lr}")
        if self.split == "explicit" and not self.public_clients:
            raise ValueError("PFA split 'explicit' needs a non-empty public_clients list")
        if self.public_clients is not None:
            ids = tuple(int(c) for c in self.public_clients)
            if any(c < 0 for c in ids) or len(set(ids)) != len(ids):
                raise ValueError(f"PFA public_clients must be distinct non-negative ids, got {self.public_clients!r}")
            object.__setattr__(self, "public_clients", ids)

    # ---- the public/private split -----------------------------------------------------------------

    def split_mask(self, eps_reported: Sequence[float] | np.ndarray | torch.Tensor, seed: int = 0) -> np.ndarray:
        """The rule `split` applied to a vector of reported epsilons (True = public). Not for `explicit`."""
        eps = np.asarray(torch.as_tensor(eps_reported, dtype=torch.float64).numpy())
        if self.split == "top_fraction":
            return top_fraction_split(eps, self.public_fraction)
        if self.split in ("gmm", "kmeans"):
            return cluster_split(eps, self.split, seed)
        raise ValueError("split 'explicit' is a given list of client ids, not a rule on epsilons")

    def fit_split(self, clients, eps_reported, seed: int = 0) -> PFA:
        """This PFA with `public_clients` fixed from the whole population's reported epsilons (§4.2)."""
        if self.split == "explicit":
            return self
        ids = torch.as_tensor(clients, dtype=torch.int64)
        mask = self.split_mask(eps_reported, seed)
        if len(ids) != len(mask):
            raise ValueError("clients and eps_reported must have the same length")
        return dataclasses.replace(self, public_clients=tuple(int(c) for c in ids[torch.from_numpy(mask)]))

    def public_mask(self, view: ServerView, seed: int = 0) -> torch.Tensor:
        """bool [K]: which of the round's participants are public."""
        if self.public_clients is not None:
            return torch.isin(view.clients, torch.tensor(self.public_clients, dtype=torch.int64))
        return torch.from_numpy(self.split_mask(view.eps_reported, seed))

    # ---- weights -----------------------------------------------------------------------------------

    def _raw_weights(self, view: ServerView) -> torch.Tensor:
        if self.weighting == "count":
            return torch.ones(len(view), dtype=torch.float64)
        eps = view.eps_reported.to(torch.float64)
        if not (torch.isfinite(eps).all() and (eps > 0).all()):
            raise ValueError("PFA needs a finite reported epsilon > 0 for every client (some declared no budget)")
        return eps

    def weights(self, view: ServerView) -> torch.Tensor:
        """Effective per-client weights ε_i/(E_pub + E_pri) (§5; `count`: 1/K), float32 [K].

        Each client's update enters Δ̄ with this weight, the private ones through the projection.
        Group labels come from `public_mask(view)`.
        """
        raw = self._raw_weights(view)
        return (raw / raw.sum()).to(torch.float32)

    # ---- aggregation -------------------------------------------------------------------------------

    def groups(self, view: ServerView, seed: int = 0) -> Groups:
        """The round's public mask and group weights; raises NoPublicClients if nobody public takes part."""
        pub = self.public_mask(view, seed)
        if not pub.any():
            raise NoPublicClients("no public client in this round (stop_reason 'no_public')")
        return Groups(pub, self._raw_weights(view))

    def accepts_selection(self, selected: Sequence[int]) -> bool:
        """Whether a drawn sample of clients contains a public one (the runner re-draws until it does)."""
        if self.public_clients is None:  # the rule is applied to the participants: it always finds one
            return len(selected) > 0
        return bool(set(int(c) for c in selected) & set(self.public_clients))

    def blocks(self, uploads: P.Params) -> dict[str, torch.Tensor]:
        """The projection's units as [K, p_ℓ] matrices: one per tensor (`scope: tensor`) or the whole model."""
        if self.scope == "model":
            return {"__model__": P.flatten(uploads)}
        return {n: u.flatten(1) for n, u in uploads.items()}

    def unblock(self, out: dict[str, torch.Tensor], like: P.Params) -> P.Params:
        """Per-block [p_ℓ] results back to tensors shaped and typed like one row of `like`."""
        if self.scope == "model":
            res = P.unflatten(out["__model__"], like, leading=1)  # a single [p] vector -> tensors like one row
        else:
            res = {n: out[n].reshape(u.shape[1:]) for n, u in like.items()}
        return {n: res[n].to(like[n].dtype) for n in like}

    def fit(self, U: torch.Tensor, d_pub: torch.Tensor, seed: int, round_: int, index: int) -> Subspace:
        """The subspace of block `index` from the public updates U (|S_pub| × p_ℓ, float64)."""
        gen = None
        if self.subspace == "random":
            gen = torch_generator(seed, Purpose.SERVER_NOISE, round_, PFA_STREAM + 2 * index)
        elif self.svd_solver == "lanczos":
            gen = torch_generator(seed, Purpose.SERVER_NOISE, round_, PFA_STREAM + 2 * index + 1)
        return fit_subspace(U, self.k, self.subspace, self.svd_solver, d_pub=d_pub, lanczos_iters=self.lanczos_iters,
                            generator=gen, random_center=self.random_center)

    @property
    def sends_center(self) -> bool:
        """Whether the subspace has an offset μ to broadcast (PFA+ downlink bytes)."""
        return self.subspace == "centered" or (self.subspace == "random" and self.random_center)

    def mean_update(self, uploads: P.Params, view: ServerView, seed: int, round_: int) -> P.Params:
        """Δ̄ (before the server learning rate), in the uploads' dtype."""
        return self._update(uploads, view, seed, round_)[0]

    def noise_passthrough(self, uploads: P.Params, noise: P.Params, view: ServerView, seed: int,
                          round_: int) -> P.Params:
        """The DP noise in Δ̄ (spec §5, `pfa_noise_passthrough`): Δ̄ as a function of the uploads is linear once the
        subspaces are fixed, so with the round's subspaces (fitted to `uploads`, exactly as `update` fits them) it
        splits into the map applied to the noise-free updates plus the map applied to `noise`, each upload's noise
        ([K, ...] like `uploads`). Returns the latter, in float64. A diagnostic: only the engine knows the noise."""
        if set(noise) != set(uploads) or any(noise[n].shape != uploads[n].shape for n in uploads):
            raise ValueError("noise must have the uploads' tensors and shapes")
        out = self._update(uploads, view, seed, round_, noise)[1]
        assert out is not None
        return out

    def _centred(self, public_rows: int) -> bool:
        """Whether the subspace's centre μ is the public updates' row mean (else it is 0): `fit_subspace`'s rule."""
        return public_rows > 1 and (self.subspace == "centered" or (self.subspace == "random" and self.random_center))

    def _update(self, uploads: P.Params, view: ServerView, seed: int, round_: int,
                noise: P.Params | None = None) -> tuple[P.Params, P.Params | None]:
        """(Δ̄, the part of it that is `noise`: the same map with the same subspaces; None without noise)."""
        K = len(view)
        if K == 0 or any(u.shape[0] != K for u in uploads.values()):
            raise ValueError(f"uploads must have a leading axis of {K} clients (one per view entry)")
        g = self.groups(view, seed)
        weights = g.row_weights()
        noise_blocks = None if noise is None else self.blocks(noise)
        out: dict[str, torch.Tensor] = {}
        noise_out: dict[str, torch.Tensor] = {}
        for index, (name, flat) in enumerate(self.blocks(uploads).items()):
            means = weighted_rows64(flat, weights)
            noise_means = None if noise_blocks is None else weighted_rows64(noise_blocks[name], weights)
            d_pub = means[0]
            if g.w_pri is None:  # §9.9: no private participant, Δ̄ = d_pub (WeiAvg over the public clients)
                out[name] = d_pub
                if noise_means is not None:
                    noise_out[name] = noise_means[0]
                continue
            U = flat[g.pub].to(torch.float64)
            sub = self.fit(U, d_pub, seed, round_, index)
            out[name] = g.combine(d_pub, sub.project(means[1]))
            if noise_means is not None:  # noise_blocks too
                public_noise = noise_blocks[name][g.pub].to(torch.float64)
                centre = public_noise.mean(0) if self._centred(len(U)) else torch.zeros_like(noise_means[0])
                noise_out[name] = g.combine(noise_means[0], Subspace(centre, sub.V).project(noise_means[1]))
        return self.unblock(out, uploads), (None if noise is None else
                                            {n: t.to(torch.float64) for n, t in self.unblock(noise_out, noise).items()})

    def aggregation_weights(self, state: Any, view: ServerView, channel: object, dim: int) -> torch.Tensor:
        return self.weights(view)

    def aggregate(self, global_params: P.Params, uploads: P.Params, view: ServerView, seed: int,
                  round_: int) -> P.Params:
        return P.axpy(self.server_lr, self.mean_update(uploads, view, seed, round_), global_params)

