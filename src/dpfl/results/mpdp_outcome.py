"""What `dpfl run` prints of a run whose method states its own guarantee (MP-DP's family, privacy.json's `stage`
block): the guarantee with its label, then the client attacks as measured.

Every epsilon printed here comes from the run's privacy.json, computed for the run as it ran: NOMINAL for mpdp and
mpdp_naive (the idealised Gaussian model of Theorems 5/6, never in dpfl's accountant), accounted for mp_cdp and
tp_smc (tp_smc under its stated honest-client assumption).
"""

from __future__ import annotations

from typing import Any

from dpfl.results.formatting import or_na

METHOD_NAMES = {"mpdp": "MP-DP", "mpdp_naive": "MP-DP-Naive", "mp_cdp": "MP-CDP (trusted server)",
                "fedsgd": "FedSGD (no privacy)", "tp_smc": "TP-SMC (threshold Paillier)"}


def stated_guarantee_lines(privacy: dict[str, Any], rounds: int) -> list[str]:
    """The lines of a run whose privacy.json has a `stage` block stating a guarantee ([] when it has none)."""
    stage, method = privacy.get("stage") or {}, privacy.get("algorithm", "")
    if "guarantee" not in stage:
        return []
    lines = [f"method: {METHOD_NAMES.get(method, method)}"]
    if stage["guarantee"] == "nominal":
        lines.append(f"guarantee: NOMINAL, per round and client eps = {stage['per_round_epsilon']:g}, "
                     f"delta = {stage['delta']:g} ({stage['label']})")
        lines += list(stage.get("stamps") or [])
        composed = {c["composed"]["epsilon"] for c in stage.get("per_client", []) if "composed" in c}
        if composed:
            lines.append(f"composed over the run per client (nominal, {stage['per_client'][0]['composed']['which']}): "
                         f"eps from {min(composed):.4g} to {max(composed):.4g}")
    elif "epsilon_total" in stage:
        lines.append(f"guarantee: per client, eps = {stage['epsilon_total']:.4g} at delta = {stage['delta']:g} over "
                     f"{rounds} rounds, {stage['guarantee']}; accountant {stage['accountant']}")
    else:
        lines.append("no privacy: a non-private reference")
    hiding = privacy.get("model_hiding")
    if hiding:
        lines.append(f"model hiding, measured (W3): client 0's last received model scores "
                     f"{or_na(hiding.get('perturbed_accuracy'), '.3f')} as received, "
                     f"{or_na(hiding.get('demasked_accuracy'), '.3f')} after it demasked it with its own labels")
    membership = privacy.get("membership")
    if membership:
        adaptive = membership.get("adaptive")
        lines.append(f"membership inference by a client, measured: ASR {or_na(membership['plain']['asr'], '.3f')} on "
                     + ("the model as received" if adaptive else "the global model")
                     + (f", {or_na(adaptive['asr'], '.3f')} after demasking" if adaptive else "") + " (0.5 = guessing)"
                     + "".join(f"; {part['skipped']}" for part in (membership["plain"], adaptive)
                               if part and "skipped" in part))
    return lines
