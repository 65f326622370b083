"""`dropout_policy: secagg_recovery` for MP-DP (spec bidirectional.md §5.5): seed recovery as in secure aggregation.

At key agreement every client Shamir-shares its round's X25519 private key (threshold t) with the other clients,
each share encrypted with AES-GCM under a key both ends derive from their own key pair (HKDF info
"dpfl/mpdp/v1/share"), so the server only routes ciphertexts. If a client agreed on edges and never uploaded, the
survivors decrypt and send their shares of its key; with t of them the server rebuilds its key, re-derives its edge
seeds with each surviving neighbour and removes their Δ (and correction masks) from the sums. The server then knows
those Δ: the neighbours' uploads had less pairwise noise than planned, and the round is flagged "reduced protection".
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dpfl.algorithms.secure import shamir
from dpfl.algorithms.secure.keys import KeyPair, be8, edge_info, round_salt
from dpfl.algorithms.secure.mpdp.ddp import DDPClient, NoiseLayout, pairwise_sum

SHARE_INFO = b"dpfl/mpdp/v1/share"


def _aead(own: KeyPair, peer_public: bytes, run_id: bytes, round_: int, a: int, b: int) -> AESGCM:
    return AESGCM(own.agree(peer_public, round_salt(run_id, round_), edge_info(SHARE_INFO, a, b)))


def _nonce(owner: int, holder: int) -> bytes:
    return owner.to_bytes(6, "big") + holder.to_bytes(6, "big")


def deal_shares(clients: Mapping[int, DDPClient], threshold: int, run_id: bytes,
                round_: int) -> dict[int, dict[int, bytes]]:
    """ciphertexts[holder][owner]: owner's key share for holder, readable only by holder."""
    ids = sorted(clients)
    if not len(ids) / 2 < threshold <= len(ids):
        raise ValueError(f"the recovery threshold must be in ({len(ids) / 2:g}, {len(ids)}], got {threshold}")
    out: dict[int, dict[int, bytes]] = {h: {} for h in ids}
    salt = round_salt(run_id, round_)
    for owner in ids:
        shares = shamir.split(clients[owner].keys.private_bytes, ids, threshold)
        for holder in ids:
            if holder == owner:
                continue
            box = _aead(clients[owner].keys, clients[holder].public, run_id, round_, owner, holder)
            out[holder][owner] = box.encrypt(_nonce(owner, holder), be8(owner) + shares[holder], salt)
    return out


def recover_key(owner: int, owner_public: bytes, holders: Mapping[int, DDPClient],
                ciphertexts: Mapping[int, Mapping[int, bytes]], threshold: int, run_id: bytes, round_: int) -> KeyPair:
    """The owner's private key from `threshold` holders' decrypted shares (each holder decrypts its own)."""
    if len(holders) < threshold:
        raise ValueError(f"{len(holders)} survivors cannot rebuild a key shared with threshold {threshold}")
    shares = {}
    for h in sorted(holders)[:threshold]:
        box = _aead(holders[h].keys, owner_public, run_id, round_, owner, h)
        try:
            plain = box.decrypt(_nonce(owner, h), ciphertexts[h][owner], round_salt(run_id, round_))
        except InvalidTag as e:
            raise ValueError(f"the key share of client {owner} held by {h} does not authenticate") from e
        shares[h] = plain[8:]
    key = KeyPair.from_private_bytes(shamir.reconstruct(shares))
    if key.public_bytes != owner_public:
        raise ValueError(f"the shares of client {owner}'s key do not rebuild its published key")
    return key


def dropped_noise(owner: int, key: KeyPair, neighbour_publics: Mapping[int, bytes], count: int, scale: float,
                  family: str, stream: int, run_id: bytes, round_: int,
                  layout: NoiseLayout | None = None) -> np.ndarray:
    """Σ over the owner's surviving neighbours v of what v added for the edge (v, owner): +Δ if v < owner, else -Δ,
    i.e. minus the owner's own pairwise sum with them."""
    return -pairwise_sum(key, owner, neighbour_publics, count, scale, run_id, round_, family, stream, layout)
