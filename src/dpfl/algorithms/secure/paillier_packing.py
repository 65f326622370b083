"""Many fixed-point values per Paillier plaintext (TP-SMC's packing), so a client encrypts a few ciphertexts.

A Paillier plaintext is an integer below n (1024 bits by default) while one fixed-point coordinate needs about
40: encrypting one coordinate per ciphertext wastes 96% of every encryption and decryption. Packing (as in
BatchCrypt, Zhang et al., USENIX ATC 2020) places `slots` coordinates side by side in one plaintext, each in a
slot of `width` bits, and the homomorphic sum adds the slots independently as long as no slot carries into the
next. That is what the widths guarantee:

- a coordinate v with |v| <= `max_abs` is encoded as round(v 2^bits) + 2^(value_bits - 1), a non-negative integer
  below 2^value_bits (the offset makes negative values positive, so there is no borrow between slots);
- a sum of `count` such encodings stays below count 2^value_bits <= 2^width with width = value_bits +
  ceil(log2(count)), so no slot overflows into its neighbour;
- slots * width < bit length of n, so the packed sum stays below n and decrypts exactly.

Decoding a summed slot subtracts count 2^(value_bits - 1) and divides by 2^bits: the result is exactly the sum of
the rounded values, the same number the one-coordinate-per-ciphertext encoding gives. A value beyond `max_abs`
is refused (it could corrupt a neighbour), never wrapped silently.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SlotPacking:
    """The layout for sums of `count` values of magnitude <= `max_abs` in fixed point with `bits` fraction bits."""

    n: int
    bits: int
    max_abs: float
    count: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_abs) and self.max_abs >= 0):
            raise ValueError(f"max_abs must be finite and >= 0, got {self.max_abs!r}")
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        if self.slots < 1:
            raise ValueError(f"a slot of {self.width} bits does not fit a {self.n.bit_length()}-bit modulus (use a "
                             "larger key or fewer fraction bits)")

    @property
    def value_bits(self) -> int:
        """Bits of one offset encoding: |round(v 2^bits)| <= max_abs 2^bits + 1/2, plus the sign's offset."""
        return math.ceil(math.log2(math.floor(self.max_abs * 2**self.bits + 0.5) + 1)) + 1

    @property
    def width(self) -> int:
        return self.value_bits + math.ceil(math.log2(self.count))

    @property
    def slots(self) -> int:
        """Slots per plaintext: the packed sum stays below 2^(slots width) <= 2^(bit length of n - 1) < n."""
        return (self.n.bit_length() - 1) // self.width

    def ciphertexts(self, values: int) -> int:
        """How many plaintexts `values` coordinates take."""
        return -(-values // self.slots)

    def pack(self, values: Sequence[float]) -> list[int]:
        """Plaintexts holding `values` in order, `slots` per plaintext (slot 0 in the lowest bits)."""
        offset, limit, scale = 1 << (self.value_bits - 1), self.max_abs * 2**self.bits + 0.5, 2**self.bits
        out = []
        for start in range(0, len(values), self.slots):
            packed = 0
            for v in reversed(values[start:start + self.slots]):
                x = v * scale
                if not abs(x) <= limit:  # also refuses NaN
                    raise ValueError(f"cannot pack {v!r}: beyond the layout's bound {self.max_abs:g}")
                packed = (packed << self.width) | (round(x) + offset)
            out.append(packed)
        return out

    def unpack_sum(self, plaintexts: Sequence[int], values: int) -> list[float]:
        """The `values` coordinate sums from the decrypted sums of `count` packed plaintexts."""
        mask, bias, scale = (1 << self.width) - 1, self.count << (self.value_bits - 1), 2**self.bits
        out: list[float] = []
        for p in plaintexts:
            for _ in range(min(self.slots, values - len(out))):
                out.append(((p & mask) - bias) / scale)
                p >>= self.width
        if len(out) != values:
            raise ValueError(f"{len(plaintexts)} plaintexts hold {len(out)} values, expected {values}")
        return out
