"""TP-SMC, one FedSGD round (spec bidirectional.md §9; Truex et al., AISec 2019): MP-DP's encrypted baseline.

Each client clips its true gradient to B, adds its share of the Gaussian noise, N(0, (S σ_cdp)^2 / h) per
coordinate (h: the number of honest clients the guarantee assumes, default K), encodes every coordinate in fixed
point and encrypts it under the threshold-Paillier public key (`threshold_paillier.py`), many coordinates per
ciphertext by default (`paillier_packing.py`; `packing=False`: one per ciphertext, the same sums). The aggregator
multiplies the ciphertexts position by position, `threshold` clients partially decrypt the sums, and the
combination gives the exact sum of the encodings; its mean updates the model, which is broadcast in plaintext
(the paper's "plaintext intermediate models", unlike MP-DP). The aggregator never sees one client's update,
only the noisy sum, whose noise has variance (S σ_cdp)^2 K / h >= (S σ_cdp)^2 when every client is honest.

`encrypted_uploads` is the clients' side and `decrypted_mean` the aggregator's (the round loop's stages call them:
`mpdp/uploads.EncryptedGradients`, `mpdp/server_steps.ThresholdPaillierServer`); `tpsmc_round` is one round of both.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from dpfl.algorithms.secure.mpdp.algorithm import RoundOutcome, client_gradient
from dpfl.algorithms.secure.mpdp.perturb import FactorPlan
from dpfl.algorithms.secure.mpdp.round_settings import RoundSettings
from dpfl.algorithms.secure.mpdp.tensors import flat, norm, unflat
from dpfl.algorithms.secure.mpdp.update import apply_update
from dpfl.algorithms.secure.paillier_packing import SlotPacking
from dpfl.algorithms.secure.threshold_paillier import FixedPoint, ThresholdKeys, combine


class Ciphertexts(NamedTuple):
    """The clients' encrypted uploads (one list of ciphertexts each), the encoding they share, the values per upload
    and how many of the uploads exceeded S before their noise (a simulation check)."""

    ciphertexts: list[list[int]]
    codec: SlotPacking | FixedPoint
    values: int
    violations: int


def ciphertext_bytes(keys: ThresholdKeys) -> int:
    """One ciphertext's size: an element of Z_{n^2}."""
    return (2 * keys.public.n.bit_length() + 7) // 8


def codec_for(st: RoundSettings, keys: ThresholdKeys, fraction_bits: int, honest: int, clients: int,
              packing: bool) -> SlotPacking | FixedPoint:
    """The fixed-point encoding of a round: every coordinate must survive the sum of `clients` uploads (|g_j| <= B,
    noise within 40 std: probability < 1e-300 beyond); the packed layout refuses widths that could carry into a
    neighbour or past n."""
    max_abs = st.clip + 40 * st.S * st.sigma_cdp / math.sqrt(honest)
    if packing:
        return SlotPacking(keys.public.n, fraction_bits, max_abs, clients)
    codec = FixedPoint(keys.public.n, fraction_bits)
    codec.check_headroom(max_abs, clients)
    return codec


def encrypted_uploads(grads: Sequence[list[torch.Tensor]], st: RoundSettings, keys: ThresholdKeys,
                      fraction_bits: int, honest: int, noise: Sequence[torch.Generator | None],
                      packing: bool = True) -> Ciphertexts:
    """Each client's clipped gradient plus its noise share from its own generator `noise[i]`, encrypted."""
    pub, std = keys.public, st.S * st.sigma_cdp / math.sqrt(honest)
    codec = codec_for(st, keys, fraction_bits, honest, len(grads), packing)
    ciphertexts, violations, values = [], 0, 0
    for g, gen in zip(grads, noise, strict=True):
        violations += norm(g) > st.S * (1 + 1e-9)
        v = flat(g)
        values = v.numel()
        if std > 0:
            v = v + torch.randn(v.shape, generator=gen, dtype=v.dtype) * std
        ciphertexts.append([pub.encrypt(m) for m in codec.pack(v.tolist())])
    return Ciphertexts(ciphertexts, codec, values, int(violations))


def decrypted_sum(uploads: Ciphertexts, keys: ThresholdKeys) -> list[float]:
    """The aggregator's product of the ciphertexts, position by position, decrypted by `threshold` key holders:
    the exact sum of the encoded uploads."""
    pub = keys.public
    sums = [pub.add(column) for column in zip(*uploads.ciphertexts, strict=True)]
    holders = keys.shares[:keys.threshold]  # the decrypting clients (any `threshold` of them would do)
    decrypted = [combine(pub, {s.party: s.partial_decrypt(c) for s in holders}, len(keys.shares), keys.threshold)
                 for c in sums]
    return uploads.codec.unpack_sum(decrypted, uploads.values)


def decrypted_mean(uploads: Ciphertexts, keys: ThresholdKeys, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """The mean of the uploads (`decrypted_sum` over their number), as tensors shaped like `like`."""
    mean = torch.tensor(decrypted_sum(uploads, keys), dtype=like[0].dtype) / len(uploads.ciphertexts)
    return unflat(mean, like)


def tpsmc_round(weights: list[torch.Tensor], batches: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
                st: RoundSettings, keys: ThresholdKeys, fraction_bits: int, honest: int,
                noise: Mapping[int, torch.Generator], plan: FactorPlan | None = None,
                packing: bool = True) -> RoundOutcome:
    """One round; `noise[k]` is client k's own generator (its noise never leaves it unencrypted)."""
    t0 = time.perf_counter()
    grads = [client_gradient(weights, x, y, st, plan) for x, y in batches.values()]
    uploads = encrypted_uploads(grads, st, keys, fraction_bits, honest, [noise.get(k) for k in batches], packing)
    t1 = time.perf_counter()
    mean = decrypted_mean(uploads, keys, weights)
    t2 = time.perf_counter()
    return RoundOutcome(apply_update(weights, mean, st.lr), {"client": t1 - t0, "decrypt": t2 - t1},
                        ciphertext_bytes(keys) * len(uploads.ciphertexts[0]), uploads.violations, len(batches))
