"""The clients' side of one MP-DP round's uploads (spec bidirectional.md §5, §6): key agreement on the round's graph,
each client's DDP noise on its perturbed gradient (η_k and its pairwise Δ; MP-DP-Naive: one Gaussian) and, with
`mask_corrections`, pairwise zero-sum masks on Ψ_k and Φ_k, the server's running float64 sums, and what dropouts do
to them (the round is discarded, or the survivors' key shares remove the dropped clients' Δ).

Shared by the round loop's upload mechanism (`uploads.PerturbedUploadNoise`) and the single-round driver
(`algorithm.perturbed_round`, the probe rounds of the inversion attack).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from dpfl.algorithms.secure.mpdp.round_settings import RoundSettings
from dpfl.algorithms.secure.mpdp.ddp import (CORRECTION_MASK_STREAM, DELTA_STREAM, DDPClient, MissingPeersError,
                                             NoiseLayout, neighbours, sample_graph)
from dpfl.algorithms.secure.mpdp.lmt import LMTResult
from dpfl.algorithms.secure.mpdp.perturb import FactorPlan, ServerSecrets, recover
from dpfl.algorithms.secure.mpdp.recovery import deal_shares, dropped_noise, recover_key
from dpfl.algorithms.secure.mpdp.tensors import flat, norm, unflat
from dpfl.algorithms.secure.mpdp.update import RunningSums
from dpfl.algorithms.secure.protocol import default_threshold


class UploadRound:
    """One round of `clients` uploading: their keys and private generators (`private_seeds[k]`; None: the OS's
    entropy), the graph they agree on, and the sums the server receives."""

    def __init__(self, st: RoundSettings, plan: FactorPlan, clients: Sequence[int],
                 private_seeds: Mapping[int, int | None], round_: int) -> None:
        self.st, self.round = st, round_
        self.clients = sorted(int(k) for k in clients)
        self.ddp = {k: DDPClient(k, private_seeds.get(k)) for k in self.clients}
        self.edges: set[tuple[int, int]] = set()
        if st.method == "mpdp" and (not math.isinf(st.sigma_delta) or st.mask_corrections):
            self.edges = sample_graph(self.clients, st.graph, st.n, {k: self.ddp[k].rng for k in self.clients})
        self.adj = neighbours(self.edges)
        self.recovering = st.dropout_policy == "secagg_recovery" and bool(self.edges)
        self.threshold = st.recovery_threshold or default_threshold(len(self.clients))
        self.shares = deal_shares(self.ddp, self.threshold, st.run_id, round_) if self.recovering else {}
        self.sums = RunningSums()
        self.d, self.layout = plan.dim(), NoiseLayout.from_plan(plan)
        self.seconds = {"ddp": 0.0, "sum": 0.0}

    def upload(self, k: int, res: LMTResult) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Client k's upload (its noisy perturbed gradient, Ψ and Φ, masked where the method masks them), added to
        the server's sums."""
        st, d, layout, ddp = self.st, self.d, self.layout, self.ddp
        t0 = time.perf_counter()
        psi, phi = res.psi, res.phi
        peers = {v: ddp[v].public for v in self.adj.get(k, [])}
        if st.method == "mpdp":
            family = st.ddp_family
            noise = ddp[k].eta(d, st.S * st.sigma_eta, family, layout) if st.sigma_eta > 0 else np.zeros(d)
            if peers and not math.isinf(st.sigma_delta):
                noise = noise + ddp[k].pairwise(peers, d, st.S * st.sigma_delta, st.run_id, self.round, family,
                                                layout=layout)
            if st.mask_corrections and peers:  # the server learns only Σ Ψ_k and Σ Φ_k
                flat_psi = flat(psi)
                corr = torch.cat([flat_psi, flat(phi)])
                corr = corr + torch.from_numpy(ddp[k].pairwise(peers, corr.numel(), st.mask_std, st.run_id,
                                                               self.round, "gaussian", CORRECTION_MASK_STREAM))
                psi, phi = unflat(corr[:flat_psi.numel()], psi), unflat(corr[flat_psi.numel():], phi)
        else:  # MP-DP-Naive: a true Gaussian on the perturbed gradient
            noise = ddp[k].rng.normal(0.0, st.S * st.sigma_naive, d) if st.sigma_naive > 0 else np.zeros(d)
        upload = unflat(flat(res.grads) + torch.from_numpy(noise), res.grads)
        t1 = time.perf_counter()
        self.sums.add(k, upload, psi, phi)
        self.seconds["ddp"] += t1 - t0
        self.seconds["sum"] += time.perf_counter() - t1
        return upload, psi, phi

    def settle(self) -> list[int]:
        """The clients that agreed on edges and never uploaded: none, or removed by the survivors' key shares (the
        returned list: reduced protection); raises MissingPeersError (the round is discarded) when their peers'
        noise cannot be removed."""
        missing = set(self.clients) - set(self.sums.clients)
        if not missing:
            return []
        affected = {v for m in missing for v in self.adj.get(m, []) if v not in missing}
        if not (self.edges and affected):
            return []
        if not self.recovering or len(self.sums.clients) < self.threshold:
            raise MissingPeersError(self.round, missing, affected, uploaded=self.sums.clients)
        self._remove_dropped(sorted(missing))
        return sorted(missing)

    def _remove_dropped(self, missing: list[int]) -> None:
        """secagg_recovery: rebuild each dropped client's key from the survivors' shares and remove the Δ (and the
        correction masks) its surviving neighbours added for their edges to it."""
        st, sums = self.st, self.sums
        survivors = {k: self.ddp[k] for k in sums.clients}
        assert sums.g is not None and sums.psi is not None and sums.phi is not None
        for m in missing:
            key = recover_key(m, self.ddp[m].public, survivors, self.shares, self.threshold, st.run_id, self.round)
            nb = {v: self.ddp[v].public for v in self.adj.get(m, []) if v in survivors}
            if not math.isinf(st.sigma_delta):
                extra = dropped_noise(m, key, nb, self.d, st.S * st.sigma_delta, st.ddp_family, DELTA_STREAM,
                                      st.run_id, self.round, self.layout)
                sums.g = [g - e for g, e in zip(sums.g, unflat(torch.from_numpy(extra), sums.g), strict=True)]
            if st.mask_corrections:
                size = flat(sums.psi).numel()
                extra = torch.from_numpy(dropped_noise(m, key, nb, size + flat(sums.phi).numel(), st.mask_std,
                                                       "gaussian", CORRECTION_MASK_STREAM, st.run_id, self.round))
                sums.psi = [p - e for p, e in zip(sums.psi, unflat(extra[:size], sums.psi), strict=True)]
                sums.phi = [p - e for p, e in zip(sums.phi, unflat(extra[size:], sums.phi), strict=True)]


def upload_check(res: LMTResult, sec: ServerSecrets, S: float) -> tuple[bool, float]:
    """A simulation's diagnostics of one upload's noise-free terms: whether the gradient it recovers to exceeds the
    sensitivity S, and ||R∘g|| / ||recovered|| (the cancellation the recovery performs)."""
    own = recover(res.grads, res.psi, res.phi, sec)
    ratio = norm([sec.factor(p) * g for p, g in enumerate(res.grads)]) / max(norm(own), 1e-300)
    return norm(own) > S * (1 + 1e-9), ratio
