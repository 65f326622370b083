"""ChaCha20 (the `cryptography` package) as the pseudorandom generator that expands 32-byte seeds into masks.

The 16-byte nonce is a 4-byte zero block counter, an 8-byte stream id and 4 zero bytes (MP-DP spec §5.3), so one
seed yields independent streams for different purposes. The counter is 32 bits of 64-byte blocks: one stream
covers at most 2^38 bytes, which bounds the dimension (`max_elements`).
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

STREAM_BYTES = 2**32 * 64
_zeros = bytes(0)  # a reusable all-zero plaintext, grown on demand


def max_elements(dtype: type) -> int:
    return STREAM_BYTES // np.dtype(dtype).itemsize


def nonce(stream_id: int) -> bytes:
    return bytes(4) + int(stream_id).to_bytes(8, "big") + bytes(4)


class Expander:
    """Expands seeds into `count` little-endian words of `dtype`, reusing one output buffer (fresh 8 MB buffers
    cost a quarter of the time in page faults). The array `expand` returns is overwritten by the next call."""

    def __init__(self, count: int, dtype: type = np.uint64) -> None:
        if not 0 <= count <= max_elements(dtype):
            raise ValueError(f"a ChaCha20 stream holds at most {max_elements(dtype)} words of {np.dtype(dtype)}, "
                             f"asked for {count}")
        global _zeros
        self.n = count * np.dtype(dtype).itemsize
        if len(_zeros) < self.n:
            _zeros = bytes(self.n)
        self._zeros = memoryview(_zeros)[: self.n]
        self._out = bytearray(self.n + 16)  # update_into wants room for a block's slack
        self._words = np.frombuffer(self._out, dtype=np.dtype(dtype).newbyteorder("<"), count=count)

    def expand(self, seed: bytes, stream_id: int = 0) -> np.ndarray:
        if len(seed) != 32:
            raise ValueError(f"a PRG seed is 32 bytes, got {len(seed)}")
        Cipher(algorithms.ChaCha20(seed, nonce(stream_id)), mode=None).encryptor().update_into(self._zeros, self._out)
        return self._words


def expand(seed: bytes, count: int, dtype: type = np.uint64, stream_id: int = 0) -> np.ndarray:
    """`count` pseudorandom words of `dtype` (little-endian) from ChaCha20(seed, stream_id) over zero bytes."""
    return Expander(count, dtype).expand(seed, stream_id).astype(dtype, copy=False)
