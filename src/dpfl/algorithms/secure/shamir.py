"""Shamir t-of-n secret sharing of 32-byte secrets over the prime field GF(2^521 - 1).

Any t shares give the secret by Lagrange interpolation at 0; t - 1 shares are uniformly distributed whatever the
secret, so they reveal nothing. Share j is the polynomial's value at x = j + 1 (client id j). Coefficients come from
`secrets`, the operating system's CSPRNG.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping

PRIME = 2**521 - 1  # a Mersenne prime above every 256-bit secret
SHARE_BYTES = 66


def split(secret: bytes, holders: Iterable[int], threshold: int) -> dict[int, bytes]:
    """Shares of `secret` for each holder id (x = id + 1); any `threshold` of them reconstruct it."""
    holders = list(holders)
    if not 1 <= threshold <= len(holders):
        raise ValueError(f"threshold must be in [1, {len(holders)}] for {len(holders)} holders, got {threshold}")
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    shares = {}
    for h in holders:
        x, y = h + 1, 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % PRIME
        shares[h] = y.to_bytes(SHARE_BYTES, "big")
    return shares


def lagrange_at_zero(holders: Iterable[int]) -> dict[int, int]:
    """The coefficients l_j with f(0) = sum_j l_j f(x_j); computed once per set of responders, reused per secret."""
    holders = list(holders)
    xs = [h + 1 for h in holders]
    if len(set(xs)) != len(xs):
        raise ValueError("duplicate share holders")
    out = {}
    for h, xj in zip(holders, xs, strict=True):
        num = den = 1
        for xm in xs:
            if xm != xj:
                num = num * xm % PRIME
                den = den * (xm - xj) % PRIME
        out[h] = num * pow(den, -1, PRIME) % PRIME
    return out


def reconstruct(shares: Mapping[int, bytes], length: int = 32, coefficients: Mapping[int, int] | None = None) -> bytes:
    """The secret from shares {holder: share}; pass `coefficients` from `lagrange_at_zero(shares)` to reuse them."""
    coefficients = coefficients if coefficients is not None else lagrange_at_zero(list(shares))
    value = sum(coefficients[h] * int.from_bytes(s, "big") for h, s in shares.items()) % PRIME
    if value >= 2 ** (8 * length):
        raise ValueError("the shares do not interpolate to a secret of the expected length (too few or corrupt)")
    return value.to_bytes(length, "big")
