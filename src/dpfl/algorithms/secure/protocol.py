"""Secure aggregation with dropouts: the four rounds of Bonawitz et al. 2017 (arXiv 1611.04482), honest-but-curious.

1. advertise_keys: each client makes two ephemeral X25519 key pairs (c: share encryption, s: mask agreement).
2. share_keys: each client Shamir-shares its s private key and a fresh self-mask seed b (threshold t) with every
   client on the roster, each share encrypted with AES-GCM under the pair's c-key agreement; the server only routes.
3. masked_input: client u uploads y_u = x_u + PRG(b_u) + sum_v +-PRG(s_uv) in Z/2^k (+ if u < v, - if u > v), where
   s_uv = HKDF(X25519(s_u, s_v)) is the same at both ends, so pairwise masks cancel in the sum.
4. unmasking: for each client that uploaded, the survivors send their share of b; for each client that shared but
   did not upload, their share of its s key. The server rebuilds the dropped clients' pairwise masks and everyone's
   self mask and removes them. A client never reveals both kinds of share for the same peer.

Any stage with fewer than t clients left aborts with TooFewSurvivorsError. t must exceed n/2 (so two disjoint
responder sets cannot both reach it) and be at most n.
"""

from __future__ import annotations

import multiprocessing
import secrets
import time
from collections.abc import Collection, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dpfl.algorithms.secure import prg, shamir
from dpfl.algorithms.secure.errors import ProtocolViolation, SecAggConfigError, TooFewSurvivorsError
from dpfl.algorithms.secure.keys import KeyPair, be8, edge_info, round_salt
from dpfl.algorithms.secure.ring import FixedPointRing

PAIR_STREAM, SELF_STREAM = 1, 2
_SHARE_INFO = b"dpfl/secagg/v1/share"
_MASK_INFO = b"dpfl/secagg/v1/mask"
STAGES = ("advertise_keys", "share_keys", "masked_input", "unmasking")


def default_threshold(n: int) -> int:
    """floor(n/2) + 1: the smallest admissible threshold, which tolerates the most dropouts."""
    return n // 2 + 1


@dataclass(frozen=True)
class SecAggParams:
    """One round's public parameters: who was selected, the threshold, the vector length and the ring."""

    clients: tuple[int, ...]
    threshold: int
    dim: int
    ring: FixedPointRing
    run_id: bytes = b"dpfl"
    round_index: int = 0

    def __post_init__(self) -> None:
        n = len(self.clients)
        if n < 2 or len(set(self.clients)) != n or min(self.clients) < 0:
            raise SecAggConfigError(f"secure aggregation needs at least 2 distinct non-negative client ids, got "
                                    f"{list(self.clients)[:10]}")
        if self.threshold > n:
            raise SecAggConfigError(f"threshold t = {self.threshold} exceeds the number of clients n = {n}")
        if 2 * self.threshold <= n:
            raise SecAggConfigError(f"threshold t = {self.threshold} must exceed n/2 = {n / 2:g} (smallest admissible: "
                                    f"{default_threshold(n)})")
        if self.ring.max_summands < n:
            raise SecAggConfigError(f"the ring is sized for {self.ring.max_summands} summands, the round has {n} "
                                    "clients: their sum could wrap around")
        limit = prg.max_elements(self.ring.dtype)
        if not 1 <= self.dim <= limit:
            raise SecAggConfigError(f"dimension {self.dim} is outside [1, {limit}], what one ChaCha20 mask stream "
                                    f"covers in a {self.ring.bits}-bit ring")

    @property
    def salt(self) -> bytes:
        return round_salt(self.run_id, self.round_index)


@dataclass(frozen=True)
class AdvertisedKeys:
    c_public: bytes  # share encryption
    s_public: bytes  # mask agreement


@dataclass(frozen=True)
class UnmaskResponse:
    """One survivor's shares: of the s key of each client that dropped after sharing, of b of each that uploaded."""

    s_key_shares: dict[int, bytes]
    self_seed_shares: dict[int, bytes]


def _share_nonce(sender: int, receiver: int) -> bytes:
    return sender.to_bytes(6, "big") + receiver.to_bytes(6, "big")


def signed_mask_sum(jobs: list[tuple[bytes, int, int]], dim: int, dtype: type) -> np.ndarray:
    """sum of sign * PRG(seed, stream) over jobs (seed, stream, sign = +1 or -1), in the ring."""
    total = np.zeros(dim, dtype=dtype)
    expander = prg.Expander(dim, dtype)
    for seed, stream, sign in jobs:
        (np.add if sign > 0 else np.subtract)(total, expander.expand(seed, stream), out=total)
    return total


def _parallel_mask_sum(jobs: list[tuple[bytes, int, int]], dim: int, dtype: type, workers: int) -> np.ndarray:
    """signed_mask_sum split over `workers` processes (ChaCha20 holds the GIL, so threads would not help)."""
    if workers <= 1 or len(jobs) < 2 * workers:
        return signed_mask_sum(jobs, dim, dtype)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    chunks = [jobs[i::workers] for i in range(workers)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method)) as pool:
        parts = list(pool.map(signed_mask_sum, chunks, [dim] * workers, [dtype] * workers))
    total = parts[0]
    for part in parts[1:]:
        np.add(total, part, out=total)
    return total


def _need(stage: str, ids: Collection[int], threshold: int) -> None:
    if len(ids) < threshold:
        raise TooFewSurvivorsError(stage, len(ids), threshold)


class SecAggClient:
    """One client's side of a round; its methods must be called in protocol order, each at most once."""

    def __init__(self, cid: int, params: SecAggParams) -> None:
        if cid not in params.clients:
            raise ProtocolViolation(f"client {cid} was not selected for this round")
        self.cid, self.p = cid, params
        self._c, self._s = KeyPair(), KeyPair()
        self._stage = 0
        self._roster: dict[int, AdvertisedKeys] = {}
        self._held: dict[int, tuple[bytes, bytes]] = {}  # peer -> (share of its s key, share of its b)
        self._sharers: frozenset[int] = frozenset()

    def _advance(self, expected: int) -> None:
        if self._stage != expected:
            raise ProtocolViolation(f"client {self.cid}: {STAGES[expected]!r} called out of order")
        self._stage = expected + 1

    def advertise_keys(self) -> AdvertisedKeys:
        self._advance(0)
        return AdvertisedKeys(self._c.public_bytes, self._s.public_bytes)

    def _aead(self, peer: int) -> AESGCM:
        return AESGCM(self._c.agree(self._roster[peer].c_public, self.p.salt, edge_info(_SHARE_INFO, self.cid, peer)))

    def share_keys(self, roster: Mapping[int, AdvertisedKeys]) -> dict[int, bytes]:
        """Encrypted shares of (s key, b) for every other client on the roster, keyed by recipient."""
        if self.cid not in roster or not set(roster) <= set(self.p.clients):
            raise ProtocolViolation(f"client {self.cid}: the roster must contain it and only selected clients")
        _need("share_keys", roster, self.p.threshold)
        self._advance(1)
        self._roster = dict(roster)
        self._b = secrets.token_bytes(32)
        holders = sorted(roster)
        s_shares = shamir.split(self._s.private_bytes, holders, self.p.threshold)
        b_shares = shamir.split(self._b, holders, self.p.threshold)
        self._held[self.cid] = (s_shares[self.cid], b_shares[self.cid])
        aad = self.p.salt
        return {v: self._aead(v).encrypt(_share_nonce(self.cid, v), be8(self.cid) + be8(v) + s_shares[v] + b_shares[v],
                                         aad)
                for v in holders if v != self.cid}

    def masked_input(self, x: np.ndarray, inbox: Mapping[int, bytes]) -> np.ndarray:
        """y = encode(x) + self mask + signed pairwise masks with every client whose shares arrived, in the ring."""
        sharers = set(inbox) | {self.cid}
        if not sharers <= set(self._roster):
            raise ProtocolViolation(f"client {self.cid}: shares from clients not on the roster")
        _need("masked_input", sharers, self.p.threshold)
        x = np.asarray(x)
        if x.shape != (self.p.dim,):
            raise SecAggConfigError(f"client {self.cid}: input of shape {x.shape}, the round's dimension is "
                                    f"{self.p.dim}")
        y = self.p.ring.encode(x)  # may raise RingOverflowError before any state changes
        held = {}
        for v, ct in inbox.items():
            try:
                plain = self._aead(v).decrypt(_share_nonce(v, self.cid), ct, self.p.salt)
            except InvalidTag as e:
                raise ProtocolViolation(f"client {self.cid}: the share from client {v} does not authenticate") from e
            if plain[:16] != be8(v) + be8(self.cid):
                raise ProtocolViolation(f"client {self.cid}: a share addressed from {v} names another edge")
            held[v] = (plain[16:16 + shamir.SHARE_BYTES], plain[16 + shamir.SHARE_BYTES:])
        self._advance(2)
        self._held.update(held)
        self._sharers = frozenset(sharers)
        dtype = self.p.ring.dtype
        jobs = [(self._b, SELF_STREAM, 1)] + [
            (self._s.agree(self._roster[v].s_public, self.p.salt, edge_info(_MASK_INFO, self.cid, v)), PAIR_STREAM,
             1 if self.cid < v else -1) for v in sorted(sharers - {self.cid})]
        np.add(y, signed_mask_sum(jobs, self.p.dim, dtype), out=y)
        return y

    def unmask(self, uploaded: Collection[int]) -> UnmaskResponse:
        """Shares for the server: b of every client that uploaded, the s key of every sharer that did not."""
        uploaded = set(uploaded)
        if not uploaded <= self._sharers or self.cid not in uploaded:
            raise ProtocolViolation(f"client {self.cid}: the uploader list must be sharers and include this client")
        _need("unmasking", uploaded, self.p.threshold)
        self._advance(3)
        return UnmaskResponse(
            s_key_shares={v: self._held[v][0] for v in sorted(self._sharers - uploaded)},
            self_seed_shares={v: self._held[v][1] for v in sorted(uploaded)})


@dataclass
class SecAggResult:
    total: np.ndarray  # float64 sum of the included clients' vectors, to the ring's resolution
    included: tuple[int, ...]  # whose vectors are in the sum
    dropped_after_sharing: tuple[int, ...]  # whose pairwise masks the server had to rebuild
    seconds: dict[str, float] = field(default_factory=dict)


class SecAggServer:
    """The server's side: it routes messages, keeps one running masked sum, and unmasks only the total.

    `workers` > 1 expands the masks to remove in that many processes (the server's cost with dropouts is one
    ChaCha20 stream per (dropped, survivor) pair).
    """

    def __init__(self, params: SecAggParams, workers: int = 1) -> None:
        self.p, self.workers = params, workers
        self._roster: dict[int, AdvertisedKeys] = {}
        self._sharers: tuple[int, ...] = ()
        self._sum: np.ndarray | None = None
        self._uploaded: list[int] = []
        self.seconds: dict[str, float] = {}

    def collect_keys(self, keys: Mapping[int, AdvertisedKeys]) -> dict[int, AdvertisedKeys]:
        if not set(keys) <= set(self.p.clients):
            raise ProtocolViolation("keys from clients not selected for this round")
        _need("advertise_keys", keys, self.p.threshold)
        self._roster = dict(sorted(keys.items()))
        return dict(self._roster)

    def route_shares(self, outboxes: Mapping[int, Mapping[int, bytes]]) -> dict[int, dict[int, bytes]]:
        """Each sharer's inbox: the ciphertexts addressed to it by the other sharers."""
        if not set(outboxes) <= set(self._roster):
            raise ProtocolViolation("shares from clients that did not advertise keys")
        _need("share_keys", outboxes, self.p.threshold)
        self._sharers = tuple(sorted(outboxes))
        return {v: {u: outboxes[u][v] for u in self._sharers if u != v} for v in self._sharers}

    def receive_masked(self, cid: int, y: np.ndarray) -> None:
        """Adds one masked upload to the running sum (checked first, so a bad upload changes nothing)."""
        if cid not in self._sharers or cid in self._uploaded:
            raise ProtocolViolation(f"masked input from client {cid}, which did not share keys or already uploaded")
        if y.dtype != self.p.ring.dtype or y.shape != (self.p.dim,):
            raise ProtocolViolation(f"masked input from client {cid} is {y.dtype}{list(y.shape)}, expected "
                                    f"{np.dtype(self.p.ring.dtype)}[{self.p.dim}]")
        t0 = time.perf_counter()
        if self._sum is None:
            self._sum = y.copy()
        else:
            np.add(self._sum, y, out=self._sum)
        self._uploaded.append(cid)
        self.seconds["receive"] = self.seconds.get("receive", 0.0) + time.perf_counter() - t0

    def uploaded(self) -> tuple[int, ...]:
        """The clients whose masked input arrived, announced to the survivors for unmasking."""
        _need("masked_input", self._uploaded, self.p.threshold)
        return tuple(sorted(self._uploaded))

    def unmask(self, responses: Mapping[int, UnmaskResponse]) -> SecAggResult:
        """Rebuilds the masks from >= t responders' shares and returns the decoded sum of the uploaded vectors."""
        uploaded = self.uploaded()
        if not set(responses) <= set(uploaded):
            raise ProtocolViolation("unmasking responses from clients that did not upload")
        _need("unmasking", responses, self.p.threshold)
        t0 = time.perf_counter()
        dropped = tuple(v for v in self._sharers if v not in set(uploaded))
        responders = sorted(responses)[: self.p.threshold]
        coeff = shamir.lagrange_at_zero(responders)
        dtype, dim, salt = self.p.ring.dtype, self.p.dim, self.p.salt
        jobs = []  # (seed, stream, sign) of every mask to add to the sum
        for u in uploaded:
            b = shamir.reconstruct({r: responses[r].self_seed_shares[u] for r in responders}, coefficients=coeff)
            jobs.append((b, SELF_STREAM, -1))
        for v in dropped:
            s_key = KeyPair.from_private_bytes(
                shamir.reconstruct({r: responses[r].s_key_shares[v] for r in responders}, coefficients=coeff))
            if s_key.public_bytes != self._roster[v].s_public:
                raise ProtocolViolation(f"the shares of client {v}'s key do not reconstruct its advertised key")
            for u in uploaded:  # u added +mask if u < v, -mask if u > v: remove it
                seed = s_key.agree(self._roster[u].s_public, salt, edge_info(_MASK_INFO, u, v))
                jobs.append((seed, PAIR_STREAM, -1 if u < v else 1))
        total = _parallel_mask_sum(jobs, dim, dtype, self.workers)
        np.add(total, self._sum, out=total)
        self.seconds["unmask"] = time.perf_counter() - t0
        return SecAggResult(self.p.ring.decode(total), uploaded, dropped, dict(self.seconds))
