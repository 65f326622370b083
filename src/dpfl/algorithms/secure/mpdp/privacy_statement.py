"""privacy.json's `stage` block of MP-DP and its baselines: the method's per-round statement (`settings.py`), then
what the rounds run add to it (spec bidirectional.md §8.6, §10): the sensitivity-violation rate, the discarded and
reduced-protection rounds, the conditional audit, and each client's composition over its participations (its rounds,
plus the discarded attempts its upload reached). Computed from the rounds' metrics rows, so a resumed run states
exactly what an uninterrupted one does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpfl.algorithms.secure.mpdp.algorithm import RoundSettings
from dpfl.algorithms.secure.mpdp.privacy import composed

REDUCED_PROTECTION = ("in these rounds clients dropped after key agreement and the server rebuilt their pairwise noise "
                      "from the survivors' key shares: their neighbours' uploads had less pairwise noise than the "
                      "calculator assumed")


def participations(history: Sequence[Mapping[str, Any]], clients: int) -> list[int]:
    """Uploads each client was charged for: every round it was selected in, and every discarded attempt its upload
    reached."""
    count = [0] * clients
    for row in history:
        for k in row.get("selected", []):
            count[k] += 1
        for uploaded in row.get("discarded_attempts", []):
            for k in uploaded:
                count[k] += 1
    return count


def stated_privacy(info: Mapping[str, Any], st: RoundSettings, epsilon: float, clients: int,
                   history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The stage block of a run of `st.method` whose per-round statement is `info`, after the rounds `history`."""
    out = dict(info)
    method = st.method
    uploads = sum(row.get("uploads", 0) for row in history)
    out["violation_rate"] = sum(row.get("violations", 0) for row in history) / max(uploads, 1) if method != "fedavg" \
        else None
    out["discarded_rounds"] = sum(len(row.get("discarded_attempts", [])) for row in history)
    reduced = [row["round"] for row in history if row.get("reduced_protection")]
    if reduced:
        out["reduced_protection_rounds"] = reduced
        out["reduced_protection"] = REDUCED_PROTECTION
    perturbed = method in ("mpdp", "mpdp_naive")
    if perturbed and st.clip_mode != "perturbed_joint":
        out["label"] += (f"; clip_mode {st.clip_mode}: the upload (the perturbed gradient at Ŵ) is not bounded "
                         "by S, so this ε does NOT hold towards the server (the raw upload can be inverted; "
                         "docs/secure.md)")
    if perturbed and not (method == "mpdp" and st.mask_corrections):
        out["label"] += ("; Ψ and Φ are uploaded without noise (W2): the server can reconstruct a client's "
                         "records from Φ (measured, docs/secure.md); mask_corrections hides them")
    if method == "mpdp":
        out["hardening"] = {"mask_corrections": st.mask_corrections, "noise_family": st.noise_family,
                            "clip_mode": st.clip_mode}
    audited = [row for row in history if "epsilon_conditional" in row]
    if audited:
        out["conditional_audit"] = {"epsilon_conditional_max": max(row["epsilon_conditional"] for row in audited),
                                    "min_R_min": min(row["min_R"] for row in audited),
                                    "label": next(row["conditional_audit_label"] for row in audited
                                                  if "conditional_audit_label" in row)}
    if perturbed:
        per_client = [composed(epsilon, st.delta, p) for p in participations(history, clients)]
        out["per_client"] = [{"client": k, **c} for k, c in enumerate(per_client)]
        out["composed_epsilon_max"] = max(c["composed"]["epsilon"] for c in per_client)
    return out
