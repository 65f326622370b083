"""What `dpfl run` prints after an MP-DP run: accuracy, the guarantee with its label, the client attacks as measured.

Every epsilon printed here comes from the run's privacy.json, computed for the run as it ran: NOMINAL for mpdp and
mpdp_naive (the idealised Gaussian model of Theorems 5/6, never in dpfl's accountant), accounted for mp_cdp and
tp_smc (tp_smc under its stated honest-client assumption).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from dpfl.results.formatting import or_na

METHOD_NAMES = {"mpdp": "MP-DP", "mpdp_naive": "MP-DP-Naive", "mp_cdp": "MP-CDP (trusted server)",
                "fedavg": "FedSGD-FedAvg (no privacy)", "tp_smc": "TP-SMC (threshold Paillier)"}


def print_mpdp_outcome(out: Path, console: Console, summary: dict[str, Any]) -> None:
    privacy = json.loads((Path(out) / "privacy.json").read_text())
    method = summary["method"]
    say = lambda text: console.print(text, markup=False, highlight=False)  # noqa: E731
    say(f"\n{summary['name']} ({METHOD_NAMES.get(method, method)}): {summary['rounds_done']} rounds, "
        f"accuracy of the true model {or_na(summary.get('accuracy'), '.3f')}")
    if method in ("mpdp", "mpdp_naive"):
        say(f"guarantee: NOMINAL, per round and client eps = {privacy['per_round_epsilon']:g}, "
            f"delta = {privacy['delta']:g} ({privacy['label']})")
        for stamp in privacy.get("stamps") or []:
            say(stamp)
        composed = {c["composed"]["epsilon"] for c in privacy.get("per_client", []) if "composed" in c}
        if composed:
            say(f"composed over the run per client (nominal, {privacy['per_client'][0]['composed']['which']}): "
                f"eps from {min(composed):.4g} to {max(composed):.4g}")
        say(f"model hiding, measured (W3): client 0's last received model scores "
            f"{or_na(summary.get('perturbed_accuracy'), '.3f')} as received, "
            f"{or_na(summary.get('demasked_accuracy'), '.3f')} after it "
            "demasked it with its own labels")
    elif method in ("mp_cdp", "tp_smc"):
        say(f"guarantee: per client, eps = {privacy['epsilon_total']:.4g} at delta = {privacy['delta']:g} over "
            f"{summary['rounds_done']} rounds, {privacy['guarantee']}; accountant {privacy['accountant']}")
    else:
        say("no privacy: a non-private reference")
    membership = privacy.get("membership")
    if membership:  # runs written before the attack was added have none
        adaptive = membership.get("adaptive")
        say(f"membership inference by a client, measured: ASR {or_na(membership['plain']['asr'], '.3f')} on "
            + ("the model as received" if adaptive else "the global model")
            + (f", {or_na(adaptive['asr'], '.3f')} after demasking" if adaptive else "") + " (0.5 = guessing)"
            + "".join(f"; {part['skipped']}" for part in (membership["plain"], adaptive) if part and "skipped" in part))
    say(f"round time {or_na(summary.get('round_seconds'), '.4f')} s; run directory {out}")
