"""The secure-aggregation protocol end to end: exact sums under dropouts, uniform-looking uploads, refusals."""

import numpy as np
import pytest
from scipy.stats import kstest

from dpfl.algorithms.secure.errors import (
    ProtocolViolation,
    RingOverflowError,
    SecAggConfigError,
    TooFewSurvivorsError,
)
from dpfl.algorithms.secure.protocol import (
    STAGES,
    SecAggClient,
    SecAggParams,
    SecAggServer,
    default_threshold,
)
from dpfl.algorithms.secure.ring import FixedPointRing
from dpfl.algorithms.secure.simulate import secure_sum

N, D = 30, 400


def _params(n=N, d=D, t=None, bits=64, frac=32, ids=None):
    ids = tuple(ids if ids is not None else range(n))
    return SecAggParams(ids, t if t is not None else default_threshold(len(ids)), d,
                        FixedPointRing(bits, frac, len(ids)))


def _shared_keys(params):
    """A server and clients through the first two stages: (server, clients, each client's inbox of shares)."""
    server = SecAggServer(params)
    clients = {c: SecAggClient(c, params) for c in params.clients}
    roster = server.collect_keys({c: clients[c].advertise_keys() for c in clients})
    return server, clients, server.route_shares({c: clients[c].share_keys(roster) for c in clients})


def _vectors(ids, d=D, seed=0):
    rng = np.random.default_rng(seed)
    return {c: rng.normal(scale=3.0, size=d) for c in ids}


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("fraction", [0.0, 0.1, 1 / 3])
def test_unmasked_sum_equals_the_plain_sum_under_dropouts(stage, fraction):
    ids = list(range(5, 5 + N))  # ids need not start at 0
    params = _params(ids=ids)
    vectors = _vectors(ids)
    gone = ids[1::3][: int(fraction * N)]  # 0, 3 or 10 of 30 clients
    result = secure_sum(vectors, params, {stage: gone})
    survivors_of_upload = [c for c in ids if c not in gone or stage == "unmasking"]
    assert list(result.included) == survivors_of_upload
    assert set(result.dropped_after_sharing) == (set(gone) if stage == "masked_input" else set())
    plain = np.sum([vectors[c] for c in result.included], axis=0)
    assert np.abs(result.total - plain).max() <= len(result.included) * params.ring.resolution / 2


def test_dropouts_at_every_stage_at_once():
    params = _params()
    vectors = _vectors(range(N))
    drop = {"advertise_keys": [0, 1], "share_keys": [2, 3], "masked_input": [4, 5, 6], "unmasking": [7, 8, 9]}
    result = secure_sum(vectors, params, drop)
    assert result.included == tuple(range(7, N))  # 7-9 uploaded, then left: their inputs are in the sum
    assert result.dropped_after_sharing == (4, 5, 6)
    plain = np.sum([vectors[c] for c in range(7, N)], axis=0)
    assert np.abs(result.total - plain).max() <= N * params.ring.resolution


def test_a_single_masked_upload_looks_uniform_and_the_unmasked_encoding_does_not():
    d = 200_000
    params = SecAggParams((0, 1, 2), 2, d, FixedPointRing(64, 32, 3))
    x = np.full(d, 1.25)  # a constant vector: the most structured input there is
    server, clients, inboxes = _shared_keys(params)
    y = clients[1].masked_input(x, inboxes[1])

    def top_bits(words):  # the 53 high bits as a float in [0, 1)
        return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53
    # The masks come from real X25519 keys and `secrets`, which no seed fixes, so each uniformity check is a fresh
    # draw: at a 1e-3 level a false alarm had probability ~2e-3 per run (CI saw p = 0.00093). At 1e-6 per check a false
    # alarm is ~2e-6 per run, and the power is untouched: the structured input's p-value is below 1e-300.
    assert kstest(top_bits(y), "uniform").pvalue > 1e-6
    assert kstest(top_bits(params.ring.encode(x)), "uniform").pvalue < 1e-300  # the test has power
    # the low 32 bits too (where the fixed-point fraction lives)
    low = (y & np.uint64(0xFFFFFFFF)).astype(np.float64) / 2**32
    assert kstest(low, "uniform").pvalue > 1e-6


def test_pairwise_masks_cancel_and_self_masks_hide_each_upload():
    params = _params(n=3, d=50)
    server, clients, inboxes = _shared_keys(params)
    zero = np.zeros(50)
    ys = [clients[c].masked_input(zero, inboxes[c]) for c in clients]
    assert all(np.count_nonzero(y) > 45 for y in ys)  # an all-zero input is not visible
    for c, y in zip(clients, ys, strict=True):
        server.receive_masked(c, y)
    result = server.unmask({c: clients[c].unmask(server.uploaded()) for c in clients})
    assert np.array_equal(result.total, zero)


@pytest.mark.parametrize("n,t,match", [(10, 11, "exceeds the number"), (10, 5, "must exceed n/2"),
                                       (10, 3, "must exceed n/2"), (1, 1, "at least 2")])
def test_bad_thresholds_are_refused(n, t, match):
    with pytest.raises(SecAggConfigError, match=match):
        _params(n=n, t=t)


def test_dimension_and_ring_size_are_checked():
    with pytest.raises(SecAggConfigError, match="ChaCha20 mask stream"):
        _params(d=2**35 + 1)
    with pytest.raises(SecAggConfigError, match="dimension"):
        _params(d=0)
    with pytest.raises(SecAggConfigError, match="could wrap around"):
        SecAggParams(tuple(range(10)), 6, 5, FixedPointRing(64, 32, max_summands=9))


@pytest.mark.parametrize("stage", STAGES)
def test_fewer_than_threshold_survivors_abort_without_revealing_a_sum(stage):
    params = _params(n=10, t=7)
    with pytest.raises(TooFewSurvivorsError, match=stage) as err:
        secure_sum(_vectors(range(10)), params, {stage: [0, 1, 2, 3]})
    assert err.value.survivors == 6 and err.value.threshold == 7


def test_an_overflowing_value_is_refused_and_the_client_can_retry():
    params = _params(n=3, d=4, t=2)
    server, clients, inboxes = _shared_keys(params)
    with pytest.raises(RingOverflowError, match="coordinate 2"):
        clients[0].masked_input(np.array([0.0, 1.0, 1e12, 0.0]), inboxes[0])
    xs = {c: np.full(4, float(c)) for c in clients}
    for c in clients:  # nothing half-done: client 0 can still take part with a valid input
        server.receive_masked(c, clients[c].masked_input(xs[c], inboxes[c]))
    result = server.unmask({c: clients[c].unmask(server.uploaded()) for c in clients})
    assert np.array_equal(result.total, np.full(4, 3.0))


def test_server_refuses_bad_uploads_without_changing_its_sum():
    params = _params(n=3, d=4, t=2)
    server, clients, inboxes = _shared_keys(params)
    ys = {c: clients[c].masked_input(np.ones(4), inboxes[c]) for c in clients}
    with pytest.raises(ProtocolViolation, match="expected"):
        server.receive_masked(0, ys[0][:3])
    for c in clients:
        server.receive_masked(c, ys[c])
    with pytest.raises(ProtocolViolation, match="already uploaded"):
        server.receive_masked(0, ys[0])
    result = server.unmask({c: clients[c].unmask(server.uploaded()) for c in clients})
    assert np.array_equal(result.total, np.full(4, 3.0))


def test_a_client_never_reveals_both_shares_of_one_peer():
    params = _params(n=5, d=3, t=3)
    server, clients, inboxes = _shared_keys(params)
    for c in (0, 1, 2):
        server.receive_masked(c, clients[c].masked_input(np.ones(3), inboxes[c]))
    response = clients[0].unmask(server.uploaded())
    assert set(response.s_key_shares) == {3, 4} and set(response.self_seed_shares) == {0, 1, 2}
    with pytest.raises(ProtocolViolation, match="out of order"):
        clients[0].unmask(server.uploaded())  # asked twice (e.g. with another uploader list): refused
    with pytest.raises(ProtocolViolation, match="must be sharers"):
        clients[1].unmask([1, 2, 7])


def test_tampered_share_ciphertext_is_detected():
    params = _params(n=3, d=3, t=2)
    server, clients, inboxes = _shared_keys(params)
    forged = dict(inboxes[0])
    forged[1] = bytes([forged[1][0] ^ 1]) + forged[1][1:]
    with pytest.raises(ProtocolViolation, match="does not authenticate"):
        clients[0].masked_input(np.ones(3), forged)


def test_masks_differ_between_rounds_of_the_same_clients():
    ids = tuple(range(3))
    ys = []
    for r in (0, 1):
        params = SecAggParams(ids, 2, 8, FixedPointRing(64, 32, 3), run_id=b"run", round_index=r)
        server = SecAggServer(params)
        clients = {c: SecAggClient(c, params) for c in ids}
        roster = server.collect_keys({c: clients[c].advertise_keys() for c in clients})
        inboxes = server.route_shares({c: clients[c].share_keys(roster) for c in clients})
        ys.append(clients[0].masked_input(np.zeros(8), inboxes[0]))
    assert not np.array_equal(ys[0], ys[1])


def test_32_bit_ring_sum():
    params = _params(n=12, d=100, bits=32, frac=16)
    vectors = {c: np.random.default_rng(c).uniform(-50, 50, 100) for c in range(12)}
    result = secure_sum(vectors, params, {"masked_input": [3, 4]})
    plain = np.sum([vectors[c] for c in result.included], axis=0)
    assert np.abs(result.total - plain).max() <= 10 * params.ring.resolution / 2


def test_server_workers_give_the_same_sum():
    params = _params(n=12, d=300)
    vectors = _vectors(range(12), d=300)
    drop = {"masked_input": [1, 2, 3, 4]}
    one = secure_sum(vectors, params, drop)
    two = secure_sum(vectors, params, drop, server_workers=2)
    plain = np.sum([vectors[c] for c in one.included], axis=0)
    assert np.abs(one.total - plain).max() <= 12 * params.ring.resolution / 2
    assert np.array_equal(one.total, two.total)
