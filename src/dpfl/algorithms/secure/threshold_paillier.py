"""Threshold Paillier (Damgård-Jurik with s = 1, Shoup-style shares) and fixed-point encodings, for TP-SMC.

TP-SMC (Truex et al., "A Hybrid Approach to Privacy-Preserving Federated Learning", AISec 2019; spec
bidirectional.md §9) has every client encrypt its noisy update under one public key whose decryption key is
shared among the parties: the aggregator adds the ciphertexts and learns the sum only when `threshold` parties
each contribute a partial decryption.

Keys: n = p q with safe primes p = 2p' + 1, q = 2q' + 1, m = p' q'. The decryption exponent d satisfies
d = 0 mod m and d = 1 mod n; it is Shamir-shared over Z_{nm} with a polynomial of degree threshold - 1, party i
(1-based) holding s_i = f(i).

- Encrypt M in Z_n: c = (1 + n)^M r^n = (1 + M n) r^n mod n^2 with r uniform in Z_n^* (the `secrets` CSPRNG).
- Add: the product of ciphertexts encrypts the sum of the plaintexts mod n.
- Partial decryption by party i: c_i = c^(2 Δ s_i) mod n^2, Δ = parties!.
- Combine any `threshold` partials of a set S: c' = prod c_i^(2 μ_i), μ_i = Δ prod_{j in S, j != i} j / (j - i)
  (an integer), so c' = c^(4 Δ^2 d) = (1 + n)^(4 Δ^2 M) mod n^2 (d kills r^n, whose order divides 2m, and is 1
  mod n), and M = L(c') (4 Δ^2)^-1 mod n with L(u) = (u - 1) / n.

Fixed point: v -> round(v 2^f) mod n; a residue above n/2 decodes as negative. A sum of encodings decrypts
exactly while its magnitude stays below n/2 (`FixedPoint.check_headroom`).

Not implemented (simulation only): the zero-knowledge proofs that partial decryptions are correct, and
distributed key generation (a dealer makes the keys, as in the paper's setup). Safe-prime search runs in Python
(sympy): seconds for 256-bit primes, ~20 s each at 512 bits; the spec restricts TP-SMC to tiny models.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy


@dataclass(frozen=True)
class PublicKey:
    n: int

    @property
    def n2(self) -> int:
        return self.n * self.n

    def encrypt(self, m: int) -> int:
        """A fresh encryption of m in Z_n (m is reduced mod n)."""
        while True:
            r = secrets.randbelow(self.n - 1) + 1
            if math.gcd(r, self.n) == 1:
                break
        return ((1 + (m % self.n) * self.n) * pow(r, self.n, self.n2)) % self.n2

    def add(self, ciphertexts: Sequence[int]) -> int:
        """An encryption of the sum of the plaintexts (mod n)."""
        out = 1
        for c in ciphertexts:
            out = (out * c) % self.n2
        return out


@dataclass(frozen=True)
class KeyShare:
    party: int  # 1-based
    share: int  # s_i = f(i) over Z_{nm}
    public: PublicKey
    parties: int

    def partial_decrypt(self, c: int) -> int:
        return pow(c, 2 * math.factorial(self.parties) * self.share, self.public.n2)


@dataclass(frozen=True)
class ThresholdKeys:
    public: PublicKey
    shares: tuple[KeyShare, ...]
    threshold: int


def _safe_prime(bits: int) -> int:
    while True:
        half = sympy.randprime(2 ** (bits - 2), 2 ** (bits - 1))
        if sympy.isprime(2 * half + 1):
            return 2 * half + 1


def keygen(key_bits: int, parties: int, threshold: int) -> ThresholdKeys:
    """A dealer's keys: n of `key_bits` bits, d Shamir-shared among `parties`, any `threshold` of whom decrypt."""
    if key_bits < 64 or key_bits % 2:
        raise ValueError(f"key_bits must be an even number >= 64, got {key_bits}")
    if not 1 <= threshold <= parties:
        raise ValueError(f"threshold must be in [1, {parties}] for {parties} parties, got {threshold}")
    while True:
        p, q = _safe_prime(key_bits // 2), _safe_prime(key_bits // 2)
        if p != q:
            break
    n, m = p * q, ((p - 1) // 2) * ((q - 1) // 2)
    d = m * pow(m, -1, n) % (n * m)  # d = 0 mod m, d = 1 mod n
    coeffs = [d] + [secrets.randbelow(n * m) for _ in range(threshold - 1)]
    public = PublicKey(n)
    shares = []
    for i in range(1, parties + 1):
        y = 0
        for c in reversed(coeffs):  # Horner, over Z_{nm}
            y = (y * i + c) % (n * m)
        shares.append(KeyShare(i, y, public, parties))
    return ThresholdKeys(public, tuple(shares), threshold)


def combine(public: PublicKey, partials: Mapping[int, int], parties: int, threshold: int) -> int:
    """The plaintext from the partial decryptions of `threshold` (or more: the first ones are used) parties."""
    if len(partials) < threshold:
        raise ValueError(f"decryption needs {threshold} partial decryptions, got {len(partials)}")
    chosen = sorted(partials)[:threshold]
    delta = math.factorial(parties)
    n2 = public.n2
    pos = neg = 1  # the factors with positive and with negative exponents: one modular inverse in all
    for i in chosen:
        num = den = 1
        for j in chosen:
            if j != i:
                num *= j
                den *= j - i
        mu = delta * num // den  # exact: Δ = parties! is a multiple of den
        if mu >= 0:
            pos = (pos * pow(partials[i], 2 * mu, n2)) % n2
        else:
            neg = (neg * pow(partials[i], -2 * mu, n2)) % n2
    acc = (pos * pow(neg, -1, n2)) % n2
    big_l = (acc - 1) // public.n
    return (big_l * pow(4 * delta * delta, -1, public.n)) % public.n


@dataclass(frozen=True)
class FixedPoint:
    """Real numbers as integers mod n: round(v 2^bits), negatives as n - |.|."""

    n: int
    bits: int = 32

    def encode(self, v: float) -> int:
        if not math.isfinite(v):
            raise ValueError(f"cannot encode {v!r}")
        return round(v * 2**self.bits) % self.n

    def decode(self, x: int) -> float:
        x %= self.n
        return (x - self.n if x > self.n // 2 else x) / 2**self.bits

    def pack(self, values: Sequence[float]) -> list[int]:
        """One plaintext per value (the interface `paillier_packing.SlotPacking` shares)."""
        return [self.encode(v) for v in values]

    def unpack_sum(self, plaintexts: Sequence[int], values: int) -> list[float]:
        """The `values` sums from the decrypted sums of `pack`ed plaintexts."""
        if len(plaintexts) != values:
            raise ValueError(f"{len(plaintexts)} plaintexts, expected {values} (one per value)")
        return [self.decode(x) for x in plaintexts]

    def check_headroom(self, max_abs: float, count: int) -> None:
        """Refuse a setting whose sum of `count` values of magnitude <= max_abs could wrap around n/2."""
        if count * (max_abs * 2**self.bits + 1) >= self.n // 2:
            raise ValueError(f"fixed point with {self.bits} fractional bits: a sum of {count} values up to "
                             f"{max_abs:g} could exceed n/2 (use a larger key or fewer bits)")
