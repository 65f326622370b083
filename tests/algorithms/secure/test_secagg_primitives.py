"""The building blocks of secure aggregation: ring encoding, ChaCha20 masks, Shamir sharing, key agreement."""

import itertools

import numpy as np
import pytest

from dpfl.algorithms.secure import prg, shamir
from dpfl.algorithms.secure.errors import RingOverflowError, SecAggConfigError
from dpfl.algorithms.secure.keys import KeyPair, edge_info, round_salt
from dpfl.algorithms.secure.ring import FixedPointRing


def test_ring_round_trip_and_sum_to_resolution():
    ring = FixedPointRing(64, 32, max_summands=50)
    rng = np.random.default_rng(0)
    xs = [rng.normal(scale=100, size=1000) for _ in range(50)]
    total = np.zeros(1000, dtype=np.uint64)
    for x in xs:
        total += ring.encode(x)
    assert np.abs(ring.decode(total) - np.sum(xs, axis=0)).max() <= 50 * ring.resolution / 2
    assert np.array_equal(ring.decode(ring.encode(np.array([-1.5, 0.0, 2.25]))), [-1.5, 0.0, 2.25])


@pytest.mark.parametrize("bits,frac", [(64, 32), (32, 12)])
def test_ring_bound_is_tight_and_sums_at_the_bound_do_not_wrap(bits, frac):
    n = 7
    ring = FixedPointRing(bits, frac, max_summands=n)
    edge = np.array([ring.max_abs, -ring.max_abs])
    total = np.zeros(2, dtype=ring.dtype)
    for _ in range(n):
        total += ring.encode(edge)  # accepted
    assert np.allclose(ring.decode(total), n * edge, rtol=0, atol=n * ring.resolution)
    with pytest.raises(RingOverflowError, match="coordinate 1"):
        ring.encode(np.array([0.0, np.nextafter(ring._float_limit + 1, np.inf) * ring.resolution]))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e30])
def test_ring_refuses_values_that_cannot_be_encoded(bad):
    with pytest.raises(RingOverflowError, match="does not fit"):
        FixedPointRing(64, 32, 10).encode(np.array([1.0, bad]))


@pytest.mark.parametrize("kwargs", [dict(bits=16), dict(frac_bits=63), dict(max_summands=0)])
def test_ring_parameters_are_checked(kwargs):
    with pytest.raises(SecAggConfigError):
        FixedPointRing(**kwargs)


def test_prg_known_answer_rfc7539():
    # RFC 7539 A.1 test vector 1: all-zero key, nonce and counter; keystream starts 76 b8 e0 ad a0 f1 3d 90.
    words = prg.expand(bytes(32), 2, np.uint64, stream_id=0)
    assert words[0] == int.from_bytes(bytes.fromhex("76b8e0ada0f13d90"), "little")
    assert words[1] == int.from_bytes(bytes.fromhex("405d6ae55386bd28"), "little")


def test_prg_streams_are_deterministic_and_distinct():
    seed = bytes(range(32))
    a = prg.expand(seed, 1000, np.uint64, 1)
    assert np.array_equal(a, prg.expand(seed, 1000, np.uint64, 1))
    assert np.array_equal(a[:10], prg.expand(seed, 10, np.uint64, 1))  # a prefix of the same stream
    assert not np.array_equal(a, prg.expand(seed, 1000, np.uint64, 2))
    assert not np.array_equal(a, prg.expand(bytes(31) + b"\x01", 1000, np.uint64, 1))
    with pytest.raises(ValueError, match="at most"):
        prg.expand(seed, prg.max_elements(np.uint64) + 1)


def test_shamir_any_threshold_subset_reconstructs_and_fewer_do_not():
    secret = bytes(range(1, 33))
    holders = [0, 3, 4, 8, 11, 12]
    shares = shamir.split(secret, holders, threshold=4)
    for subset in itertools.combinations(holders, 4):
        assert shamir.reconstruct({h: shares[h] for h in subset}) == secret
    three = {h: shares[h] for h in holders[:3]}
    try:
        assert shamir.reconstruct(three) != secret
    except ValueError:
        pass  # an interpolant above 2^256 is refused outright


def test_shamir_shares_below_threshold_carry_no_information():
    # With t = 2 one share is the secret plus a uniform field element: two secrets give indistinguishable shares.
    a = [int.from_bytes(shamir.split(bytes(32), [0, 1], 2)[0], "big") for _ in range(400)]
    b = [int.from_bytes(shamir.split(b"\xff" * 32, [0, 1], 2)[0], "big") for _ in range(400)]
    from scipy.stats import ks_2samp
    # `secrets` draws the coefficients and no seed fixes it: at 1e-6 a false alarm is negligible, while shares that
    # leaked the secret (a constant per secret) would give p ~ 1e-230 with 400 + 400 draws.
    assert ks_2samp([x / shamir.PRIME for x in a], [x / shamir.PRIME for x in b]).pvalue > 1e-6


def test_key_agreement_is_symmetric_and_bound_to_round_and_edge():
    a, b = KeyPair(), KeyPair()
    salt = round_salt(b"run", 3)
    k_ab = a.agree(b.public_bytes, salt, edge_info(b"p", 1, 2))
    assert k_ab == b.agree(a.public_bytes, salt, edge_info(b"p", 2, 1))
    assert k_ab != a.agree(b.public_bytes, round_salt(b"run", 4), edge_info(b"p", 1, 2))
    assert k_ab != a.agree(b.public_bytes, salt, edge_info(b"p", 1, 3))
    assert KeyPair.from_private_bytes(a.private_bytes).public_bytes == a.public_bytes
