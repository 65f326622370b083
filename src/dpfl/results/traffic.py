"""Communication totals of a run from its metrics rows (spec heterogeneous_dp §4.3, `comm.report()`).

Every row carries `uplink_bytes` / `downlink_bytes` (and per participant `bytes_up` / `bytes_down`);
PFA+ rows also carry `traffic` (full vs code uploads, the subspace broadcast, warm-up). Floats are 4 B.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MIB = 2**20


def traffic_report(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Cumulative uplink/downlink bytes and MiB; for PFA+ the split by kind and the private-uplink reduction.

    `private_uplink_reduction` is 1 − (bytes of the code uploads) / (what those uploads would have cost
    in full); None when no client uploaded codes.
    """
    up = down = full = codes = subspace = code_uploads = warmup = 0
    model_bytes = None
    rounds = 0
    for row in rows:
        rounds += 1
        up += int(row.get("uplink_bytes") or 0)
        down += int(row.get("downlink_bytes") or 0)
        t = row.get("traffic")
        if t:
            full += int(t["uplink_bytes_full"])
            codes += int(t["uplink_bytes_codes"])
            subspace += int(t["downlink_bytes_subspace"])
            code_uploads += int(t["code_uploads"])
            warmup += bool(t["warmup"])
            model_bytes = int(t["model_bytes"])
    out: dict[str, Any] = {"rounds": rounds, "uplink_bytes": up, "downlink_bytes": down,
                           "uplink_mib": up / MIB, "downlink_mib": down / MIB}
    if model_bytes is not None:
        reduction = 1 - codes / (code_uploads * model_bytes) if code_uploads else None
        out.update({"uplink_bytes_full": full, "uplink_bytes_codes": codes, "downlink_bytes_subspace": subspace,
                    "code_uploads": code_uploads, "warmup_rounds": warmup, "private_uplink_reduction": reduction})
    return out
