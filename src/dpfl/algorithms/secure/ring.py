"""Fixed-point encoding of real vectors into the ring Z/2^k, where masked sums are computed exactly.

A value x becomes round(x * 2^f) mod 2^k. Summing n encodings and reading the result back as a signed integer gives
the sum of the rounded values exactly, provided every partial sum stays in (-2^(k-1), 2^(k-1)); `encode` therefore
refuses any value with |round(x * 2^f)| > (2^(k-1) - 1) // n, the stated per-client bound. The decoding error of a
sum of n vectors is at most n * 2^-(f+1) per coordinate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpfl.algorithms.secure.errors import RingOverflowError, SecAggConfigError

_DTYPES = {32: (np.uint32, np.int32), 64: (np.uint64, np.int64)}


@dataclass(frozen=True)
class FixedPointRing:
    """Z/2^bits with `frac_bits` fractional bits, for sums of up to `max_summands` vectors."""

    bits: int = 64
    frac_bits: int = 32
    max_summands: int = 1

    def __post_init__(self) -> None:
        if self.bits not in _DTYPES:
            raise SecAggConfigError(f"ring bits must be 32 or 64 (numpy's wrap-around integers), got {self.bits}")
        if not 0 <= self.frac_bits <= self.bits - 2:
            raise SecAggConfigError(f"frac_bits must be in [0, {self.bits - 2}] for a {self.bits}-bit ring, "
                                    f"got {self.frac_bits}")
        if self.max_summands < 1 or self.max_summands > 2 ** (self.bits - 2):
            raise SecAggConfigError(f"max_summands must be in [1, 2^{self.bits - 2}], got {self.max_summands}")

    @property
    def dtype(self) -> type:
        return _DTYPES[self.bits][0]

    @property
    def max_int(self) -> int:
        """The largest |round(x * 2^f)| one client may contribute."""
        return (2 ** (self.bits - 1) - 1) // self.max_summands

    @property
    def _float_limit(self) -> float:
        """The largest float64 that is <= max_int (float(max_int) may round up above 2^53)."""
        limit = float(self.max_int)
        return limit if int(limit) <= self.max_int else float(np.nextafter(limit, 0.0))

    @property
    def max_abs(self) -> float:
        """The largest |x| one client may contribute (a little below max_int / 2^f, to absorb rounding)."""
        return (self._float_limit - 0.5) / 2.0**self.frac_bits

    @property
    def resolution(self) -> float:
        return 2.0**-self.frac_bits

    def encode(self, x: np.ndarray) -> np.ndarray:
        """round(x * 2^f) mod 2^k, or RingOverflowError naming the first offending coordinate."""
        x = np.asarray(x, dtype=np.float64).ravel()
        scaled = np.rint(x * 2.0**self.frac_bits)
        bad = ~(np.abs(scaled) <= self._float_limit)  # also catches NaN and inf
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise RingOverflowError(
                f"value {x[i]!r} at coordinate {i} does not fit the {self.bits}-bit ring: with {self.frac_bits} "
                f"fractional bits and up to {self.max_summands} summands each client's values must satisfy "
                f"|x| <= {self.max_abs:.6g} (clip the update, or use fewer frac_bits or a 64-bit ring)")
        signed = _DTYPES[self.bits][1]
        return scaled.astype(signed).view(self.dtype)

    def decode(self, total: np.ndarray) -> np.ndarray:
        """A ring element (a sum of at most max_summands encodings) as float64."""
        signed = _DTYPES[self.bits][1]
        return np.asarray(total, dtype=self.dtype).view(signed).astype(np.float64) * 2.0**-self.frac_bits
