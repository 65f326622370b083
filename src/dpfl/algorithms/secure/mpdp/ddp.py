"""DDP_Client (MP-DP Algorithm 2, spec bidirectional.md §5): each client's upload noise is its own η_k plus
pairwise Δ_{k,v} that cancel in the sum, with the pairwise streams derived by real X25519 key agreement.

η_k entries ~ DN(S σ_η, 1) = Uniform(±√2 S σ_η) from the client's private generator; Δ_{k,v} entries
~ DN(S σ_Δ, 1) from ChaCha20 keyed by seed_{k,v} = HKDF-SHA256(X25519(sk_k, pk_v), salt = SHA-256(run_id ‖ t),
info = "dpfl/mpdp/v1/edge" ‖ min ‖ max); the lower id adds +Δ, the higher -Δ. Everything is float64 (§5.4).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from dpfl.algorithms.secure import prg
from dpfl.algorithms.secure.keys import KeyPair, edge_info, round_salt
from dpfl.algorithms.secure.mpdp.dn import dn_star_abs, dn_star_abs_from_uniforms
from dpfl.algorithms.stages import RoundAborted

EDGE_INFO = b"dpfl/mpdp/v1/edge"
DELTA_STREAM, CORRECTION_MASK_STREAM, BIAS_FACTOR_STREAM = 1, 2, 3
KEY_STREAM = 0x6B6579  # a seeded simulation's round key comes from SeedSequence([seed, KEY_STREAM]), not the η stream


X_LMAX = 200  # series terms of the shared |DN*(2)| bias factors drawn from stream 3 (with the tail correction)


@dataclass(frozen=True)
class NoiseLayout:
    """Which entries of the flattened upload need a non-uniform DDP law (spec §7.3): `x2` are multiplied by an
    extra X ~ |DN*(2)| (hidden biases after the first layer), `gauss` are Gaussian (the last bias, factor 1)."""

    d: int
    x2: np.ndarray
    gauss: np.ndarray

    @classmethod
    def uniform(cls, d: int) -> NoiseLayout:
        return cls(d, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    @classmethod
    def from_plan(cls, plan) -> NoiseLayout:
        kinds, sizes = plan.noise_kinds(), [int(np.prod(s)) for s in plan.shapes()]
        starts = np.cumsum([0] + sizes[:-1])
        pick = lambda k: np.concatenate([np.arange(a, a + n) for a, n, kind in zip(starts, sizes, kinds, strict=True)  # noqa: E731
                                         if kind == k] or [np.zeros(0, dtype=np.int64)]).astype(np.int64)
        return cls(int(sum(sizes)), pick("dn_x2"), pick("gaussian"))


def shared_x2(seed: bytes, count: int) -> np.ndarray:
    """count factors X ~ |DN*(2)| from the edge's stream 3: identical at both ends."""
    u = uniforms(seed, count * (X_LMAX + 2), BIAS_FACTOR_STREAM).reshape(count, X_LMAX + 2)
    return dn_star_abs_from_uniforms(2, u, X_LMAX)


def edge_noise(seed: bytes, layout: NoiseLayout, scale: float) -> np.ndarray:
    """One edge's Δ for a layout: DN(scale, 1) entries from stream 1, the `gauss` ones N(0, scale^2) by Box-Muller
    from the stream's words after the first d, the `x2` ones times a shared |DN*(2)|."""
    ng = len(layout.gauss)
    u = uniforms(seed, layout.d + 2 * ((ng + 1) // 2))
    out = math.sqrt(2) * scale * (2 * u[: layout.d] - 1)
    if ng:
        out[layout.gauss] = scale * _box_muller(u[layout.d:], ng)
    if len(layout.x2):
        out[layout.x2] *= shared_x2(seed, len(layout.x2))
    return out


class MissingPeersError(RoundAborted):
    """A client that agreed on edges did not upload: its neighbours' Δ do not cancel, so the round is discarded (the
    round loop runs it again with a fresh broadcast and fresh keys). `uploaded`: the clients whose uploads arrived
    (they are charged all the same)."""

    def __init__(self, round_: int, missing: Iterable[int], affected: Iterable[int],
                 uploaded: Iterable[int] = ()) -> None:
        self.round, self.missing, self.affected = round_, sorted(missing), sorted(affected)
        super().__init__(f"round {round_}: client(s) {self.missing} did not upload; the pairwise noise of their "
                         f"neighbours {self.affected} does not cancel, so the round was discarded (no update applied)",
                         sorted(uploaded))


def sample_graph(clients: list[int], kind: str, n: int | None = None,
                 rngs: Mapping[int, np.random.Generator] | None = None) -> set[tuple[int, int]]:
    """The round's edges {(u, v): u < v}: every pair ('complete'), or the union of each client's n picks ('n_out'),
    each client picking with its own generator (the graph is independent of the data, as GOPA assumes)."""
    K = len(clients)
    if kind == "complete":
        return {(u, v) for i, u in enumerate(sorted(clients)) for v in sorted(clients)[i + 1:]}
    if kind != "n_out":
        raise ValueError(f"graph must be 'complete' or 'n_out', got {kind!r}")
    if n is None or not 1 <= n <= K - 1:
        raise ValueError(f"an n-out graph needs 1 <= n <= K - 1 = {K - 1}, got n = {n}")
    if rngs is None or set(rngs) != set(clients):
        raise ValueError("an n-out graph needs one generator per client")
    edges = set()
    for k in clients:
        others = [c for c in clients if c != k]
        for v in rngs[k].choice(others, size=n, replace=False):
            edges.add((min(k, int(v)), max(k, int(v))))
    return edges


def neighbours(edges: set[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for u, v in sorted(edges):
        out.setdefault(u, []).append(v)
        out.setdefault(v, []).append(u)
    return out


def edge_seed(own: KeyPair, peer_public: bytes, run_id: bytes, round_: int, k: int, v: int) -> bytes:
    return own.agree(peer_public, round_salt(run_id, round_), edge_info(EDGE_INFO, k, v))


def uniforms(seed: bytes, count: int, stream: int = DELTA_STREAM) -> np.ndarray:
    """u = ((w >> 11) + ½) 2^-53 in (0, 1) from each little-endian uint64 word w of the stream."""
    words = prg.expand(seed, count, np.uint64, stream)
    return ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def _box_muller(u: np.ndarray, count: int) -> np.ndarray:
    """`count` standard normals from 2 ceil(count / 2) uniforms in (0, 1), pairs (u1, u2) in order."""
    radius = np.sqrt(-2 * np.log(u[0::2]))
    return np.concatenate([radius * np.cos(2 * np.pi * u[1::2]), radius * np.sin(2 * np.pi * u[1::2])])[:count]


def gaussians(seed: bytes, count: int, stream: int) -> np.ndarray:
    """Standard normals by Box-Muller from one stream (two uniforms per pair of normals)."""
    return _box_muller(uniforms(seed, 2 * ((count + 1) // 2), stream), count)


def pairwise_sum(keys: KeyPair, cid: int, peers: Mapping[int, bytes], count: int, scale: float, run_id: bytes,
                 round_: int, family: str = "dn", stream: int = DELTA_STREAM,
                 layout: NoiseLayout | None = None) -> np.ndarray:
    """Σ_v ±Δ_{cid,v} over the neighbours `peers` {v: public key} of the client holding `keys`, + when cid < v.
    family 'dn': Δ entries ~ DN(scale, 1) (uniform; `layout` says which entries follow §7.3's other laws);
    'gaussian': N(0, scale^2) by Box-Muller (gaussian_conditional, and the stream-2 masks of the correction terms)."""
    total = np.zeros(count)
    for v, pk in sorted(peers.items()):
        seed = edge_seed(keys, pk, run_id, round_, cid, v)
        if family == "dn":
            d = edge_noise(seed, layout if layout is not None else NoiseLayout.uniform(count), scale)
        else:
            d = scale * gaussians(seed, count, stream)
        total += d if cid < v else -d
    return total


class DDPClient:
    """One client's round keys and private generator, from fresh OS entropy unless a simulation seed is given:
    then both come from it (the key from its own stream), so a seeded simulation is reproducible end to end, the
    pairwise noise of one upload included."""

    def __init__(self, cid: int, private_seed: int | None = None) -> None:
        self.cid = cid
        self.keys = KeyPair() if private_seed is None else KeyPair.from_private_bytes(
            np.random.default_rng([private_seed, KEY_STREAM]).bytes(32))
        self.rng = np.random.default_rng(private_seed)  # None: fresh OS entropy

    @property
    def public(self) -> bytes:
        return self.keys.public_bytes

    def pairwise(self, peers: Mapping[int, bytes], count: int, scale: float, run_id: bytes, round_: int,
                 family: str = "dn", stream: int = DELTA_STREAM, layout: NoiseLayout | None = None) -> np.ndarray:
        """This client's Σ_v ±Δ_{k,v} (`pairwise_sum` with its own keys)."""
        return pairwise_sum(self.keys, self.cid, peers, count, scale, run_id, round_, family, stream, layout)

    def eta(self, count: int, scale: float, family: str = "dn", layout: NoiseLayout | None = None) -> np.ndarray:
        """η_k entries ~ DN(scale, 1) (or N(0, scale^2) for gaussian_conditional), scale = S σ_η, from the private
        generator; with a `layout`, §7.3's laws for biases."""
        if family != "dn":
            return self.rng.normal(0.0, scale, count)
        out = self.rng.uniform(-math.sqrt(2) * scale, math.sqrt(2) * scale, count)
        if layout is not None and len(layout.x2):
            out[layout.x2] *= dn_star_abs(2, len(layout.x2), self.rng).numpy()
        if layout is not None and len(layout.gauss):
            out[layout.gauss] = self.rng.normal(0.0, scale, len(layout.gauss))
        return out
