"""privacy.json: what a finished (or stopped) run promises, and why every other epsilon it reports differs.

The declared threat model, each client's budget, noise and spent epsilon from the ledger, and the views that
are not the run's guarantee (per participation, the aggregate-only observer, Noisy-FedAvg's f-DP block); then
the ONE epsilon per client that is the guarantee, and where it comes from. Apart from the round loop because it
only reads a run's fields and its ledger after the rounds: nothing here is charged or changes what runs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import dp_accounting as dpa
import numpy as np

from dpfl.algorithms.algorithm import Algorithm
from dpfl.experiment.run_evaluation import PER_CLIENT_LIMIT
from dpfl.privacy.accountant import epsilon, guarantee
from dpfl.privacy.budgets import Budgets, ClientBudget
from dpfl.privacy.adaptive_clipping import update_noise_multiplier
from dpfl.privacy.ledger import group_keys, group_rows
from dpfl.privacy.prv import PRV_DELTA_ERROR_FRACTION, PRV_EPS_ERROR

if TYPE_CHECKING:
    from dpfl.experiment.federated_run import FederatedRun


def privacy_summary(run: FederatedRun, stop_reason: str, rounds_run: int | None = None,
                    history: Sequence[Mapping[str, Any]] = (), retired: Collection[int] = (),
                    server_state: Any = None) -> dict[str, Any]:
    """The declared threat model and each client's budget, noise and spent epsilon (`history`: the rounds run,
    whose participants the f-DP report of Noisy-FedAvg/FedProx needs; `retired`: the clients that left the run
    on their budgets, which raised the others' sampling rate under fixed-K selection; `server_state`: the server
    step's state after the last round, from which it states its own releases).

    Reads the run's algorithm, accountant, ledger, budgets, rounds and its clients' noise, batch sizes, records,
    reported epsilons and steps done; its calibration (calibrate_to, calibration, calibrated, heuristic_steps); and,
    for sample-level runs, the events a participation costs (`run.events`).
    """
    alg = run.algorithm
    out: dict[str, Any] = {
        "algorithm": alg.name,
        "unit": alg.unit,
        "observer": alg.observer,
        "mechanism": alg.mechanism,
        "accountant": run.accountant if run.ledger is not None else None,
        "client_sampling": {"kind": alg.selection.kind, "k": alg.selection.k, "rate": alg.selection.rate},
        "local_sampling": alg.local.sampling,
        "stop_reason": stop_reason,
        "accounted": run.ledger is not None,
        "oracle": alg.aggregator.privileged,
    }
    protocol = alg.aggregator.protocol_description()
    if alg.aggregator.secure and protocol is not None:
        out["secure_aggregation"] = protocol
    notes = alg.aggregator.privacy_notes(server_state, [dict(row) for row in history])
    if alg.unit is not None and run.ledger is None:
        out["warning"] = ("no epsilon in dpfl's per-client ledger: the method states its own guarantee in `stage` "
                          "(read its `guarantee` and `label`)" if notes is not None and "guarantee" in notes else
                          "a privacy mechanism ran for which dpfl computes no epsilon; no guarantee is reported")
    summary = False
    if run.ledger is not None and run.budgets is not None:
        spent_array = run.ledger.spent_array()
        budgets = Budgets.of(run.budgets, run.n_clients)
        fdp = alg.upload.fdp_accounting
        heuristic = None
        if run.heuristic_steps is not None:
            heuristic = run.calibrated.targets.astype(float) * np.sqrt(
                np.minimum(1.0, run.steps_done / run.heuristic_steps))
        summary = run.n_clients > PER_CLIENT_LIMIT and fdp is None
        if summary:  # a population: its classes of alike clients, not a list of millions (docs/scale.md)
            out["clients_summary"] = client_classes(run, budgets, spent_array, heuristic)
        else:
            spent = spent_array.tolist()
            out["clients"] = [
                {"client": i, "epsilon_budget": run.budgets[i].epsilon, "delta": run.budgets[i].delta,
                 "noise_multiplier": float(run.noise[i]) if alg.local.private else None,
                 "batch_size": int(run.batch_sizes[i]), "records": int(run.n_records[i]),
                 "epsilon_spent": spent[i], "epsilon_reported": float(run.eps_reported[i])}
                for i in range(run.n_clients)
            ]
        out["calibrated_to"] = run.calibrate_to if alg.local.private else None
        out["calibration"] = run.calibration if alg.local.private else None
        if heuristic is not None:
            out["heuristic"] = ("noise from PFA's heuristic formula sigma = 10 q sqrt(T* log10(1/delta)) / "
                                "epsilon, which is NOT a DP guarantee; epsilon_spent is the accountant's epsilon "
                                "of that noise, epsilon_heuristic what the formula claims")
            for c in out.get("clients", ()):
                c["epsilon_heuristic"] = float(heuristic[c["client"]])
        over = np.flatnonzero(~(spent_array <= budgets.epsilons * (1 + 1e-9))).tolist()
        out["meets_budgets"] = not over
        if not out["meets_budgets"]:
            out["warning"] = (f"NOT PRIVATE AS PROMISED: clients {over[:10]}{'...' if len(over) > 10 else ''} "
                              "spent more than their budgets (a non-private reference run)")
        if run.calibrated is not None:
            out["noise_calibration"] = run.calibrated.summary()
        if run.accountant == "prv":
            out["prv"] = prv_report(run.ledger.prv_bounds_array(), out.get("clients"))
        if fdp is not None:
            out["fdp"] = fdp_report(fdp, history, run.budgets, run.n_records)
        elif alg.unit == "sample":
            out.update(sample_level_views(run, spent_array))
    simulated = (simulated_cohort_block(alg, run.budgets, run.accountant, run.n_clients, rounds_run or 0)
                 if run.ledger is not None and run.budgets is not None else None)
    if simulated is not None:
        out["noise_cohort"] = simulated
        budgets = Budgets.of(run.budgets, run.n_clients)
        own = np.array([simulated["epsilon"][str(d)] for d in budgets.deltas.tolist()])
        over = np.flatnonzero(~(own <= budgets.epsilons * (1 + 1e-9))).tolist()
        out["meets_budgets"] = not over
        out["warning"] = (f"SIMULATION of a cohort of {simulated['noise_cohort_size']}: epsilon_spent, the ledger and "
                          "the budgets are that simulated run's, NOT this run's guarantee; this run's own epsilon "
                          f"is up to {float(own.max()):.4g} (noise_cohort.epsilon)"
                          + (f", over the budgets of clients {over[:10]}{'...' if len(over) > 10 else ''}" if over
                             else ""))
    view = (aggregate_view(alg, run.budgets, run.accountant, run.n_clients, rounds_run, len(retired))
            if rounds_run and run.budgets is not None else None)
    if view is not None:
        out["aggregate_view"] = view
    if alg.upload.hidden_sampling:
        out["per_upload_amplification"] = (
            "ASSUMED: the server cannot tell which clients took part (Poisson client sampling hidden from it), "
            "so each upload's σ/√K is amplified by the sampling rate. A server that receives the individual "
            "uploads (FedCEO's, UDP-FedAvg's) can tell; against it the unamplified per-upload epsilon holds")
    if notes is not None:  # a stage with releases of its own (R-DPCFL's private selections), MP-DP's guarantee
        out["stage"] = notes
    adaptive = adaptive_clipping_block(alg, server_state, history)
    if adaptive is not None:
        out["adaptive_clipping"] = adaptive
    if "clients" in out:
        out["guarantee"] = run_guarantee(out, run.budgets, run.accountant, alg)
        for c, eps in zip(out["clients"], out["guarantee"].pop("per_client"), strict=True):
            c["epsilon_guarantee"] = eps
    elif summary:
        out["guarantee"] = run_guarantee(out, run.budgets, run.accountant, alg, spent=spent_array)
        out["guarantee"].pop("per_client")  # each class's epsilon_guarantee: its epsilon_spent (no f-DP block)
    return out


def prv_report(bounds: np.ndarray, clients: list[dict[str, Any]] | None) -> dict[str, Any]:
    """privacy.json's `prv` block (accountant 'prv'): the PRV accountant brackets each client's true epsilon,
    lower <= epsilon <= upper, and epsilon_spent is the upper end (a guarantee). `bounds` is the ledger's
    `prv_bounds_array`; each `clients` row also gets its epsilon_prv_lower and epsilon_prv_estimate."""
    if clients is not None:
        for c, (lower, estimate, _, _) in zip(clients, bounds.tolist(), strict=True):
            c["epsilon_prv_lower"], c["epsilon_prv_estimate"] = lower, estimate
    spent = bounds[:, 2] > 0 if len(bounds) else np.zeros(0, dtype=bool)
    span = (lambda v: [float(v.min()), float(v.max())] if len(v) else None)  # noqa: E731
    return {
        "reported": "upper: epsilon_spent is the upper bound of the PRV accountant (Gopi, Lee, Wutschitz 2021), "
                    "a guarantee; the true epsilon lies in [epsilon_prv_lower, epsilon_spent]",
        "eps_error": float(bounds[spent, 3].max()) if spent.any() else PRV_EPS_ERROR,
        "eps_error_nominal": PRV_EPS_ERROR,
        "delta_error_fraction": PRV_DELTA_ERROR_FRACTION,
        "epsilon_lower": span(bounds[:, 0]),
        "epsilon_estimate": span(bounds[:, 1]),
        "epsilon_upper": span(bounds[:, 2]),
    }


def client_classes(run: FederatedRun, budgets: Budgets, spent: np.ndarray,
                   heuristic: np.ndarray | None) -> dict[str, Any]:
    """privacy.json's `clients_summary` for a population above PER_CLIENT_LIMIT clients: each class of clients
    alike in every field a `clients` row has but the client id (budget, delta, noise, batch size, records, spent,
    reported and guarantee epsilons), with its number of clients and its first client, in the order of the first
    clients. The classes are listed up to PER_CLIENT_LIMIT of them; beyond, each field's smallest and largest value."""
    private = run.algorithm.local.private
    columns = {"epsilon_budget": budgets.epsilons, "delta": budgets.deltas,
               "noise_multiplier": np.asarray(run.noise, dtype=float) if private else None,
               "batch_size": np.asarray(run.batch_sizes), "records": np.asarray(run.n_records),
               "epsilon_spent": spent, "epsilon_reported": np.asarray(run.eps_reported, dtype=float),
               "epsilon_guarantee": spent}
    if heuristic is not None:
        columns["epsilon_heuristic"] = heuristic
    _, inverse = group_keys(group_rows([v for v in columns.values() if v is not None]))
    _, first, counts = np.unique(inverse, return_index=True, return_counts=True)  # each class's first client
    order = np.argsort(first, kind="stable")
    first, counts = first[order], counts[order]
    out: dict[str, Any] = {"clients": run.n_clients, "classes_count": len(first),
                           "why": f"more than {PER_CLIENT_LIMIT} clients: each class of alike clients once, not "
                                  "one row per client (docs/scale.md)"}
    if len(first) <= PER_CLIENT_LIMIT:
        cast = {"batch_size": int, "records": int}
        out["classes"] = [
            {"clients": int(n), "first_client": int(j),
             **{k: None if v is None else cast.get(k, float)(v[j]) for k, v in columns.items()}}
            for n, j in zip(counts.tolist(), first.tolist(), strict=True)]
    else:
        out["range"] = {k: None if v is None else [float(v.min()), float(v.max())] for k, v in columns.items()}
    return out


def run_guarantee(privacy: Mapping[str, Any], budgets: Sequence[ClientBudget] | None, accountant: str,
                  algorithm: Algorithm, spent: np.ndarray | None = None) -> dict[str, Any]:
    """The run's ONE epsilon per client, which number it is, and why any other epsilon in privacy.json differs.

    Accounted runs: the per-client ledger's epsilon, except for Noisy-FedAvg/FedProx, whose guarantee is the
    f-DP block's headline bound (spec fdp_accounting.md §4.5): the exact GDP conversion of the composition, or the
    shifted-interpolation bound where it applies (aggregate view, final release, an ASSUMED smoothness L).
    """
    assert budgets is not None
    spent = [c["epsilon_spent"] for c in privacy["clients"]] if spent is None else spent.tolist()
    others: list[dict[str, Any]] = []
    fdp = privacy.get("fdp")
    simulated = privacy.get("noise_cohort")
    if simulated is not None:  # the run's own noise is the guarantee; the ledger's epsilon is the simulation's
        per_client = [simulated["epsilon"][str(b.delta)] for b in budgets]
        source = (f"this run's own noise (noise_cohort.epsilon: multiplier {simulated['noise_multiplier_own']:.4g} at "
                  f"the run's client sampling, {accountant} accountant)")
        others.append({"field": "clients[].epsilon_spent", "epsilon_max": max(spent),
                       "why_it_differs": f"a SIMULATION: the ledger accounts a cohort of "
                                         f"{simulated['noise_cohort_size']} (noise_cohort_size), not this run"})
    elif fdp is None:
        per_client = spent
        source = f"the per-client ledger ({accountant} accountant): epsilon_spent"
        if "per_upload_amplification" in privacy:
            source += (", amplified by client sampling under an ASSUMPTION (per_upload_amplification: the server "
                       "cannot tell who took part)")
    else:
        per_client = [c["epsilon"][str(budgets[c["client"]].delta)] for c in fdp["clients"]]
        head = fdp["headline"]
        source = f"the f-DP block's headline bound, {fdp['labels'][head]}, converted exactly to (epsilon, delta)"
        same = head == "composition" and accountant == "gdp"
        if not same:
            if head == "composition":
                why = (f"the ledger composes the same per-round Gaussians with the {accountant} accountant, "
                       "whose conversion to (epsilon, delta) is not exact, so it is larger; budgets are enforced "
                       "on it, which is conservative")
            else:
                why = ("the ledger composes the per-round Gaussians (the composition bound, on which budgets are "
                       f"enforced, {accountant} accountant); the shifted-interpolation bound is smaller "
                       "because only the final model is released and the loss is ASSUMED smooth "
                       f"(L = {fdp['params']['smoothness_L']:g})")
            others.append({"field": "clients[].epsilon_spent", "epsilon_max": max(spent), "why_it_differs": why})
    if "aggregate_view" in privacy:
        others.append({"field": "aggregate_view.epsilon", "epsilon_max": privacy["aggregate_view"]["epsilon"],
                       "why_it_differs": "a different observer: one who sees only the sum of each round's uploads, "
                                         "not the run's server"})
    if "eps_per_participation" in privacy:
        others.append({"field": "eps_per_participation", "epsilon_max": privacy["eps_per_participation"],
                       "why_it_differs": "one round of one client only, not the whole run"})
    return {"epsilon_max": max(per_client), "source": source, "unit": algorithm.unit,
            "observer": algorithm.observer, "per_client": per_client, "other_epsilons": others,
            "note": "each client's guarantee is clients[].epsilon_guarantee at its own delta; the other epsilons "
                    "listed are computed for the run too but are not its guarantee"}


def fdp_report(accounting: Any, history: Sequence[Mapping[str, Any]], budgets: Sequence[ClientBudget] | None,
               n_records: np.ndarray) -> dict[str, Any]:
    """The f-DP block of privacy.json from who actually took part in each round (spec fdp_accounting.md §6)."""
    assert budgets is not None
    n_clients = len(n_records)
    part = np.zeros((n_clients, len(history)), dtype=bool)
    for t, row in enumerate(history):
        part[row["selected"], t] = True
    cohorts = [max(1, len(row["selected"])) for row in history]
    deltas = [sorted({budgets[i].delta, 1.0 / (10 * int(n_records[i]))}) for i in range(n_clients)]
    return accounting.report(part, cohorts, deltas, len(history))


def sample_level_views(run: FederatedRun, spent: np.ndarray) -> dict[str, Any]:
    """Per participation and composed, and the plain statement that no user-level guarantee exists.

    Reads the run's budgets, rounds, accountant, its clients' records, batch sizes and noise, and the event one
    participation costs each (`run.events.client`), once per distinct (records, batch size, noise, delta)."""
    assert run.budgets is not None
    deltas = Budgets.of(run.budgets, run.n_clients).deltas
    first, _ = group_keys(group_rows([np.asarray(run.n_records, dtype=float), np.asarray(run.batch_sizes, dtype=float),
                                      np.asarray(run.noise, dtype=float), deltas]))
    per = []
    for i in first.tolist():  # DP-SGD's event depends on neither round nor cohort, except a scheduled round 1
        events = {id(e): e for e in (run.events.client(i, r, 1) for r in range(min(2, run.rounds)))}
        per.append(max(epsilon(e, float(deltas[i]), run.accountant) if e is not None else 0.0 for e in events.values()))
    spent_list = spent.tolist()
    return {"eps_per_participation": max(per), "eps_total_max": max(spent_list),
            "eps_total_mean": float(np.mean(spent)),
            "user_level": None,
            "user_level_note": "sample-level DP only: a client's whole dataset is not protected as a unit"}


def aggregate_view(algorithm: Algorithm, budgets: Sequence[ClientBudget] | None, accountant: str, n_clients: int,
                   rounds_run: int, n_retired: int = 0) -> dict[str, Any] | None:
    """The client-level epsilon for an observer of the aggregates only (not the run's server). When clients
    retired, every round is charged at the smallest population the run reached (the largest sampling rate under
    fixed-K selection): an upper bound, since a client's epsilon grows with its sampling rate. None where the upload
    mechanism reports no such view."""
    assert budgets is not None
    up, sel = algorithm.upload, algorithm.selection
    population = max(sel.min_candidates(), n_clients - n_retired)  # a stop below k: rate 1, still a bound
    event = up.aggregate_event(sel, population, rounds_run)
    if event is None:
        return None
    delta = float(Budgets.of(budgets).deltas.min())
    g = guarantee(event, delta, accountant, unit="client")
    out = {"epsilon": g.epsilon, "delta": delta, "relation": g.relation, "noise_multiplier": up.noise,
           "sample_rate": sel.participation_rate(population), "rounds": rounds_run,
           "valid_for": "an observer who sees only the sum of each round's uploads and not who took part "
                        "(e.g. behind secure aggregation); NOT the run's server, which sees every upload"}
    if n_retired:
        out["population"] = (f"{n_retired} of {n_clients} clients retired on their budgets during the run; "
                             f"every round is charged at a population of {population} (at least the largest "
                             "sampling rate the run reached): an upper bound for the rounds before they retired")
    return out


def adaptive_clipping_block(algorithm: Algorithm, server_state: Any = None,
                            history: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any] | None:
    """privacy.json's `adaptive_clipping` block for a server step that adapts its client-level clip (Andrew et al.
    2021): its settings, the count's noise sigma_b, the planned z the ledger charges and the sum's z_Delta, why the
    two releases together cost z (Theorem 1), and the clip's trajectory (`history`: the rounds' metrics rows;
    `server_state`: the step's state after the last round). None where the step's clip is fixed."""
    step = algorithm.aggregator
    ac = step.adaptive_clipping
    if ac is None:
        return None
    z, sigma_b = step.noise, ac.count_noise
    clips = [float(row["adaptive_clip"]) for row in history if row.get("adaptive_clip") is not None]
    block: dict[str, Any] = {
        "level": "client",
        "method": "adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021): the clip C_t follows the "
                  "target quantile of the client update norms, C_{t+1} = C_t exp(-learning_rate (b_t - "
                  "target_quantile)), b_t = (sum_i (1[||Delta_i|| <= C_t] - 1/2) + N(0, count_noise^2)) / expected "
                  "clients + 1/2 (the noised fraction of unclipped updates)",
        "target_quantile": ac.target_quantile, "learning_rate": ac.learning_rate, "initial_clip": ac.initial_clip,
        "count_noise": sigma_b, "noise_multiplier": z,
        "update_noise_multiplier": None if z is None or sigma_b is None else update_noise_multiplier(z, sigma_b),
        "accounting": "Theorem 1: the noised count (std count_noise; its indicators centred at 1/2 have sensitivity "
                      "1/2) and the noised sum (update_noise_multiplier z_Delta = (z^-2 - (2 count_noise)^-2)^(-1/2) "
                      "times C_t) are together one Gaussian mechanism with noise_multiplier z, which the ledger "
                      "charges each round as for a fixed clip; C_t depends on released counts only "
                      "(post-processing), so round t's sensitivity is C_t",
        "noise": "with per-client budgets the central noise is the smallest budget's (calibrated as for a fixed "
                 "clip): the adaptive clip changes the clip, never z",
        "clip_first": clips[0] if clips else None, "clip_last": clips[-1] if clips else None,
        "clip_min": min(clips) if clips else None, "clip_max": max(clips) if clips else None,
        "clip_next": float(server_state["clip"]) if isinstance(server_state, dict) and "clip" in server_state else None,
    }
    if step.secure:
        block["secure_aggregation"] = ("the count is summed by secure aggregation with the update: each client "
                                       "appends its indicator plus its share N(0, count_noise^2 / t) of the count "
                                       "noise, so every revealed sum of s >= t clients carries at least the central "
                                       "noise of both")
    return block


def simulated_cohort_block(algorithm: Algorithm, budgets: Sequence[ClientBudget], accountant: str, n_clients: int,
                           rounds_run: int) -> dict[str, Any] | None:
    """privacy.json's `noise_cohort` block where the server step simulates a larger cohort (noise_cohort_size): what
    was simulated, and this run's OWN epsilon per delta: its noise multiplier is z m / M (m the expected cohort, M the
    simulated one) at its own client sampling, composed over the rounds run (an upper bound for a client that
    retired earlier). None where nothing is simulated."""
    step = algorithm.aggregator
    sel = algorithm.selection
    simulated = step.accounted_selection(sel)
    if simulated is sel or step.noise is None:
        return None
    z, m, big = float(step.noise), sel.expected_count(n_clients), simulated.expected_count(n_clients)
    own = z * m / big
    rounds = max(int(rounds_run), 0)
    deltas = sorted({float(d) for d in Budgets.of(budgets, n_clients).deltas.tolist()})
    per_round = sel.client_level_event(own, n_clients)
    eps = {str(d): (epsilon(dpa.SelfComposedDpEvent(per_round, rounds), d, accountant) if rounds else 0.0)
           for d in deltas}
    return {"noise_cohort_size": int(round(big)), "expected_cohort": m, "noise_multiplier_simulated": z,
            "noise_multiplier_own": own, "rounds": rounds, "epsilon": eps,
            "what": "a SIMULATION (pfl-research's noise_cohort_size): the noise on the sum of this run's cohort is "
                    "scaled by expected_cohort / noise_cohort_size, so the model trains with the noise a cohort of "
                    "noise_cohort_size would give its average, and the ledger, the budgets and "
                    "clients[].epsilon_spent account that larger cohort. This run's own guarantee is `epsilon` "
                    "(also clients[].epsilon_guarantee)"}
