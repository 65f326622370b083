"""Privacy core: DP events, accountants (on dp_accounting), per-client ledgers, calibration, budgets.

Every epsilon dpfl reports comes from an accountant applied to recorded ``DpEvent``s whose sampling
matches the code: Poisson -> add/remove adjacency; fixed-size without replacement -> replace-one
(RDP only, noise multiplier halved to the replace-one sensitivity); see ``events``.
"""

from dpfl.privacy.accountant import (
    ACCOUNTANTS,
    PLD_VALUE_DISCRETIZATION,
    Accountant,
    Guarantee,
    delta_for,
    epsilon,
    guarantee,
    rdp_epsilon_and_order,
)
from dpfl.privacy.budgets import BUDGET_DISTRIBUTIONS, ClientBudget, draw_budgets, register_budget_distribution
from dpfl.privacy.calibration import calibrate_noise_multiplier, heuristic_pfa_noise
from dpfl.privacy.events import (
    ADD_REMOVE,
    REPLACE_ONE,
    EventInfo,
    Relation,
    Sampling,
    describe_event,
    dpsgd_event,
    gaussian_event,
    neighboring_relation,
    sampled_gaussian_event,
)
from dpfl.privacy.ledger import LedgerEntry, PrivacyLedger
from dpfl.privacy.orders import DEFAULT_RDP_ORDERS
from dpfl.privacy.rdp_curves import RDP_CURVES, RdpCurveCache, rdp_curve
from dpfl.privacy.serialization import event_from_dict, event_to_dict

__all__ = [
    "ACCOUNTANTS",
    "ADD_REMOVE",
    "BUDGET_DISTRIBUTIONS",
    "DEFAULT_RDP_ORDERS",
    "PLD_VALUE_DISCRETIZATION",
    "RDP_CURVES",
    "REPLACE_ONE",
    "Accountant",
    "ClientBudget",
    "EventInfo",
    "Guarantee",
    "LedgerEntry",
    "PrivacyLedger",
    "RdpCurveCache",
    "Relation",
    "Sampling",
    "calibrate_noise_multiplier",
    "delta_for",
    "describe_event",
    "dpsgd_event",
    "draw_budgets",
    "epsilon",
    "event_from_dict",
    "event_to_dict",
    "gaussian_event",
    "guarantee",
    "heuristic_pfa_noise",
    "neighboring_relation",
    "rdp_curve",
    "rdp_epsilon_and_order",
    "register_budget_distribution",
    "sampled_gaussian_event",
]
