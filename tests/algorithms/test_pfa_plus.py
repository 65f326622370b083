"""PFA+ (spec heterogeneous_dp §4.3; tests §8 items 3 and 4) and PFA's re-drawn rounds (§4.2)."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.pfa import PFA
from dpfl.algorithms.server.pfa_plus import PFAPlus, previous_subspaces
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs
from dpfl.engine import params as P
from dpfl.models import build_model
from same_state import same_state

EPS = torch.tensor([10.0, 8.0, 0.5, 1.0, 2.0, 0.3], dtype=torch.float64)  # clients 0, 1 public
PUBLIC = (0, 1)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _uploads(K: int, seed: int) -> dict[str, torch.Tensor]:
    g = _gen(seed)
    return {"w": torch.randn(K, 4, 5, generator=g), "b": torch.randn(K, 5, generator=g)}


def _view(clients=range(6)) -> ServerView:
    clients = list(clients)
    return ServerView(torch.tensor(clients), torch.full((len(clients),), 100), torch.full((len(clients),), 8),
                      EPS[clients], torch.full((len(clients),), 1e-5, dtype=torch.float64), float(len(clients)))


def _rel(a: dict, b: dict) -> float:
    num = sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in a) ** 0.5
    return num / sum(float(b[n].double().pow(2).sum()) for n in b) ** 0.5


def _plus(**kw) -> PFAPlus:
    return PFAPlus(PFA(split="explicit", public_clients=PUBLIC, **kw))


def _round(plus: PFAPlus, state, uploads, view, round_):
    """One round from `state`: the payload, Δ̄ and the new state."""
    payload = plus.client_payload(state, uploads, view, seed=0)
    return (payload, *plus.mean_update(state, payload, view, seed=0, round_=round_))


@pytest.mark.parametrize("mode", ["centered", "second-moment", "mean-outer"])
def test_pfa_plus_equals_pfa_when_the_subspace_does_not_move(mode):
    view, pfa, plus = _view(), PFA(split="explicit", public_clients=PUBLIC, subspace=mode), _plus(subspace=mode)
    r1, r2 = _uploads(6, 1), _uploads(6, 2)
    for n in r2:  # the public clients send the same updates twice: the subspace does not move
        r2[n][:2] = r1[n][:2]
    p1, d1, state = _round(plus, plus.init({}), r1, view, 0)
    assert p1.warmup and bool(p1.full_mask.all()) and not p1.codes  # warm-up: everyone uploads in full
    assert _rel(d1, pfa.mean_update(r1, view, seed=0, round_=0)) < 1e-6  # the warm-up round is PFA
    prev = previous_subspaces(state)
    p2, d2, _ = _round(plus, state, r2, view, 1)
    assert not p2.warmup and p2.full_mask.tolist() == [True, True, False, False, False, False]
    for name, flat in pfa.blocks({n: u[2:] for n, u in r2.items()}).items():  # codes = V_prevᵀ(u − μ_prev)
        want = (flat.double() - prev[name].mu) @ prev[name].V
        torch.testing.assert_close(p2.codes[name].double(), want, rtol=1e-6, atol=1e-6)
        assert p2.codes[name].shape == (4, 1)
    assert _rel(d2, pfa.mean_update(r2, view, seed=0, round_=1)) < 1e-6


def test_pfa_plus_uses_the_previous_subspace_not_the_current_one():
    view, pfa, plus = _view(), PFA(split="explicit", public_clients=PUBLIC), _plus()
    r1, r2 = _uploads(6, 1), _uploads(6, 2)
    _, _, state = _round(plus, plus.init({}), r1, view, 0)
    prev = previous_subspaces(state)
    _, d2, _ = _round(plus, state, r2, view, 1)
    g = pfa.groups(view)
    for name, flat in pfa.blocks(r2).items():  # the formula of §4.3 by hand
        X = flat.double()
        d_pub = g.w_pub @ X[g.pub]
        codes = ((X[g.pri] - prev[name].mu.float().double()) @ prev[name].V.float().double()).float().double()
        d_pri_hat = prev[name].mu + prev[name].V @ (g.w_pri @ codes)
        want = (g.E_pub * d_pub + g.E_pri * d_pri_hat) / (g.E_pub + g.E_pri)
        torch.testing.assert_close(d2[name].double().reshape(-1), want.float().double(), rtol=1e-5, atol=1e-6)
    assert _rel(d2, pfa.mean_update(r2, view, seed=0, round_=1)) > 1e-3  # the subspace moved, so PFA differs


def test_the_server_never_receives_a_private_update_in_full():
    view, plus = _view(), _plus()
    _, _, state = _round(plus, plus.init({}), _uploads(6, 1), view, 0)
    ups = _uploads(6, 2)
    payload = plus.client_payload(state, ups, view, seed=0)
    want, _ = plus.mean_update(state, plus.client_payload(state, _uploads(6, 2), view, seed=0), view, seed=0,
                               round_=1)
    for n in ups:
        ups[n][2:] = float("nan")  # the private rows after encoding must not matter
    assert all(u.shape[0] == 2 for u in payload.full.values())
    got, _ = plus.mean_update(state, payload, view, seed=0, round_=1)
    assert all(torch.equal(got[n], want[n]) for n in want)


def test_round_without_private_clients_is_weiavg_over_the_public_ones_and_keeps_the_state():
    view_all, plus = _view(), _plus()
    _, _, state = _round(plus, plus.init({}), _uploads(6, 1), view_all, 0)
    pub_view = _view([0, 1])
    ups = _uploads(2, 3)
    payload, d, new = _round(plus, state, ups, pub_view, 1)
    w = EPS[:2] / EPS[:2].sum()
    for n in ups:
        torch.testing.assert_close(d[n].double(), torch.einsum("k,k...->...", w, ups[n].double()), rtol=1e-6, atol=1e-7)
    assert payload.bytes_down_subspace == [0, 0]
    assert new["private_rounds"] == 1
    for name, sub in previous_subspaces(new).items():
        assert torch.equal(sub.V, state["previous"][name]["V"])


def test_warmup_rounds_count_rounds_with_private_clients():
    view, plus = _view(), _plus(k=1)
    plus = PFAPlus(plus.pfa, warmup_rounds=2)
    state = plus.init({})
    rounds = [(_uploads(6, 1), view), (_uploads(2, 2), _view([0, 1])), (_uploads(6, 3), view), (_uploads(6, 4), view)]
    warmups = []
    for r, (ups, v) in enumerate(rounds):
        assert plus.in_warmup(state) == (r < 3)
        payload, _, state = _round(plus, state, ups, v, r)
        warmups.append(payload.warmup)
    assert warmups == [True, True, True, False]  # round 2 (public only) does not count
    assert state["private_rounds"] == 3


@pytest.mark.parametrize("model, tensors, code_bytes", [("logr", 2, 8), ("cnn_pfa", 8, 32)])
@pytest.mark.parametrize("broadcast", ["private", "all"])
def test_bytes_per_participant(model, tensors, code_bytes, broadcast):
    net = build_model(model, (1, 28, 28), 10, seed=0)
    params = P.model_params(net)
    p = P.num_parameters(params)
    assert p == {"logr": 7850, "cnn_pfa": 26010}[model] and len(params) == tensors
    K = 6
    g = _gen(0)
    ups = {n: torch.randn((K, *t.shape), generator=g) for n, t in params.items()}
    plus = PFAPlus(PFA(split="explicit", public_clients=PUBLIC), subspace_broadcast=broadcast)
    view = _view()
    state = plus.init(params)
    first = plus.client_payload(state, ups, view)
    assert first.bytes_up == [4 * p] * K and first.bytes_down_subspace == [0] * K
    _, state = plus.mean_update(state, first, view, seed=0, round_=0)
    second = plus.client_payload(state, ups, view)
    sum_pk = sum(s.V.shape[0] * s.V.shape[1] for s in previous_subspaces(state).values())
    assert sum_pk == p  # k = 1 for every tensor
    subspace = 4 * (sum_pk + p)  # V, and μ (centred)
    assert second.bytes_up == [4 * p, 4 * p] + [code_bytes] * 4
    pub_down = subspace if broadcast == "all" else 0
    assert second.bytes_down_subspace == [pub_down, pub_down] + [subspace] * 4


def test_update_is_a_function_of_the_state_passed_in():
    """(a) A round replayed from an earlier state gives the earlier result after later rounds ran; (b) `update`
    leaves the state passed in unchanged; its new parameters are w + server_lr Δ̄."""
    view, plus = _view(), PFAPlus(PFA(split="explicit", public_clients=PUBLIC, server_lr=0.5))
    w = {n: torch.zeros(u.shape[1:]) for n, u in _uploads(6, 0).items()}
    states, outs = [plus.init(w)], []
    for r in range(3):
        state = states[-1]
        before = copy.deepcopy(state)
        payload = plus.client_payload(state, _uploads(6, 10 + r), view, seed=0)
        step = plus.update(state, w, payload, RoundInputs(view, 0, r))
        assert same_state(state, before)  # (b)
        assert step.metrics == {} and step.state["private_rounds"] == r + 1
        mean, _ = plus.mean_update(state, payload, view, seed=0, round_=r)
        assert all(torch.equal(step.params[n], P.axpy(0.5, mean, w)[n]) for n in w)
        states.append(step.state)
        outs.append(step)
    payload = plus.client_payload(states[1], _uploads(6, 11), view, seed=0)  # (a): round 2 again, from its state
    again = plus.update(states[1], w, payload, RoundInputs(view, 0, 1))
    assert not payload.warmup and same_state(again.state, outs[1].state)
    assert all(torch.equal(again.params[n], outs[1].params[n]) for n in w)


def test_fit_split_configures_a_copy_and_the_state_starts_empty():
    plus = PFAPlus(PFA(split="top_fraction", public_fraction=0.34), warmup_rounds=2)
    fitted = plus.fit_split(np.arange(6), EPS.numpy())
    assert fitted is not plus and plus.pfa.public_clients is None and fitted.pfa.public_clients == PUBLIC
    assert fitted.warmup_rounds == 2 and fitted.init({}) == {"previous": None, "private_rounds": 0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        fitted.warmup_rounds = 3  # type: ignore[misc]


def test_selection_rates_given_a_required_group_match_enumeration():
    M, group = 6, {0, 1}
    for K in (1, 2, 4):
        draws = [set(s) for s in itertools.combinations(range(M), K) if set(s) & group]
        for i in (0, 3):
            exact = sum(i in s for s in draws) / len(draws)
            assert Selection("fixed", K).participation_rate_given(M, len(group), i in group) == pytest.approx(exact)
    q = 0.3
    assert Selection("poisson", rate=q).participation_rate_given(6, 2, True) == pytest.approx(q / (1 - (1 - q) ** 2))
    assert Selection("poisson", rate=q).participation_rate_given(6, 2, False) == pytest.approx(q)
    assert Selection().participation_rate_given(6, 2, True) == 1.0


def test_redraw_rates_match_simulated_frequencies():
    sel, M, K = Selection("fixed", 2), 5, 2
    counts = np.zeros(M)
    rounds = 4000
    for r in range(rounds):
        for attempt in range(50):
            s = sel.select(np.arange(M), 0, r, attempt)
            if 0 in s:
                break
        counts[s] += 1
    # binomial standard error at rate ~0.2..1 over 4000 rounds is <= 0.008; 5 SE tolerance
    assert counts[0] / rounds == pytest.approx(sel.participation_rate_given(M, 1, True), abs=0.04)
    assert counts[1:].mean() / rounds == pytest.approx(sel.participation_rate_given(M, 1, False), abs=0.04)
    assert math.isclose(counts.sum(), rounds * K)


def test_bad_options():
    with pytest.raises(ValueError, match="warmup_rounds"):
        PFAPlus(warmup_rounds=0)
    with pytest.raises(ValueError, match="subspace_broadcast"):
        PFAPlus(subspace_broadcast="some")
