"""X25519 key agreement with HKDF-SHA256 key derivation (the `cryptography` package), 8-byte big-endian integers.

Every derived key is bound to the run, the round and a purpose string, so keys never repeat across rounds, edges
or uses (Bonawitz et al. 2017 §4; the MP-DP spec §5.3 fixes the same layout for its edge seeds).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_RAW = serialization.Encoding.Raw


def be8(i: int) -> bytes:
    return int(i).to_bytes(8, "big")


def round_salt(run_id: bytes, round_index: int) -> bytes:
    """SHA-256(run_id || round): the HKDF salt that makes every round's keys fresh."""
    return hashlib.sha256(bytes(run_id) + be8(round_index)).digest()


def edge_info(purpose: bytes, a: int, b: int) -> bytes:
    """purpose || min(a, b) || max(a, b): both endpoints of an edge derive the same key."""
    return purpose + be8(min(a, b)) + be8(max(a, b))


def hkdf(secret: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(secret)


@dataclass
class KeyPair:
    """An ephemeral X25519 key pair; the private key never leaves the client except as Shamir shares."""

    private: X25519PrivateKey = field(default_factory=X25519PrivateKey.generate)

    @property
    def public_bytes(self) -> bytes:
        return self.private.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw)

    @property
    def private_bytes(self) -> bytes:
        return self.private.private_bytes(_RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> "KeyPair":
        return cls(X25519PrivateKey.from_private_bytes(raw))

    def agree(self, peer_public: bytes, salt: bytes, info: bytes) -> bytes:
        """HKDF-SHA256(X25519(own private, peer public)) -> 32 bytes."""
        return hkdf(self.private.exchange(X25519PublicKey.from_public_bytes(peer_public)), salt, info)
