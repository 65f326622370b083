"""TP-SMC, one FedSGD round (spec bidirectional.md §9; Truex et al., AISec 2019): MP-DP's encrypted baseline.

Each client clips its true gradient to B, adds its share of the Gaussian noise, N(0, (S σ_cdp)^2 / h) per
coordinate (h: the number of honest clients the guarantee assumes, default K), encodes every coordinate in fixed
point and encrypts it under the threshold-Paillier public key (`threshold_paillier.py`), many coordinates per
ciphertext by default (`paillier_packing.py`; `packing=False`: one per ciphertext, the same sums). The aggregator
multiplies the ciphertexts position by position, `threshold` clients partially decrypt the sums, and the
combination gives the exact sum of the encodings; its mean updates the model, which is broadcast in plaintext
(the paper's "plaintext intermediate models", unlike MP-DP). The aggregator never sees one client's update,
only the noisy sum, whose noise has variance (S σ_cdp)^2 K / h >= (S σ_cdp)^2 when every client is honest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import torch

from dpfl.algorithms.secure.mpdp.algorithm import (RoundOutcome, RoundSettings, _flat, _norm, _unflat, clipped,
                                                   true_gradient)
from dpfl.algorithms.secure.mpdp.perturb import FactorPlan
from dpfl.algorithms.secure.mpdp.update import apply_update
from dpfl.algorithms.secure.paillier_packing import SlotPacking
from dpfl.algorithms.secure.threshold_paillier import FixedPoint, ThresholdKeys, combine


def tpsmc_round(weights: list[torch.Tensor], batches: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
                st: RoundSettings, keys: ThresholdKeys, fraction_bits: int, honest: int,
                noise: Mapping[int, torch.Generator], plan: FactorPlan | None = None,
                packing: bool = True) -> RoundOutcome:
    """One round; `noise[k]` is client k's own generator (its noise never leaves it unencrypted)."""
    pub = keys.public
    std = st.S * st.sigma_cdp / math.sqrt(honest)
    t0 = time.perf_counter()
    # every coordinate must survive the sum: |g_j| <= B, noise within 40 std (probability < 1e-300 beyond)
    max_abs = st.clip + 40 * std
    if packing:  # the layout refuses widths that could carry into a neighbour or past n
        codec: SlotPacking | FixedPoint = SlotPacking(pub.n, fraction_bits, max_abs, len(batches))
    else:
        codec = FixedPoint(pub.n, fraction_bits)
        codec.check_headroom(max_abs, len(batches))
    ciphertexts: list[list[int]] = []
    violations = 0
    for k, (x, y) in batches.items():
        g = clipped(true_gradient(weights, x, y, plan), st.clip)
        violations += _norm(g) > st.S * (1 + 1e-9)
        flat = _flat(g)
        if std > 0:
            flat = flat + torch.randn(flat.shape, generator=noise[k], dtype=flat.dtype) * std
        ciphertexts.append([pub.encrypt(m) for m in codec.pack(flat.tolist())])
    t1 = time.perf_counter()
    sums = [pub.add(column) for column in zip(*ciphertexts, strict=True)]
    holders = keys.shares[:keys.threshold]  # the decrypting clients (any `threshold` of them would do)
    parties = len(keys.shares)
    decrypted = [combine(pub, {s.party: s.partial_decrypt(c) for s in holders}, parties, keys.threshold) for c in sums]
    total = codec.unpack_sum(decrypted, sum(w.numel() for w in weights))
    t2 = time.perf_counter()
    mean = torch.tensor(total, dtype=weights[0].dtype) / len(batches)
    ciphertext_bytes = (2 * pub.n.bit_length() + 7) // 8
    return RoundOutcome(apply_update(weights, _unflat(mean, weights), st.lr), {"client": t1 - t0, "decrypt": t2 - t1},
                        ciphertext_bytes * len(sums), violations, len(batches))
