"""Threshold Paillier for TP-SMC (spec bidirectional.md §9; required test T34: a threshold-Paillier sum of
fixed-point encodings decrypts exactly)."""

import itertools
import random

import pytest

from dpfl.algorithms.secure.threshold_paillier import FixedPoint, combine, keygen


@pytest.fixture(scope="module")
def keys():
    return keygen(256, parties=5, threshold=3)  # two 128-bit safe primes: milliseconds


def test_any_threshold_subset_decrypts_a_sum_exactly(keys):
    pub = keys.public
    values = [random.Random(0).randrange(pub.n) for _ in range(6)]
    total = pub.add([pub.encrypt(v) for v in values])
    for subset in itertools.combinations(keys.shares, 3):
        partials = {s.party: s.partial_decrypt(total) for s in subset}
        assert combine(pub, partials, 5, 3) == sum(values) % pub.n
    with pytest.raises(ValueError, match="needs 3 partial decryptions"):
        combine(pub, {s.party: s.partial_decrypt(total) for s in keys.shares[:2]}, 5, 3)


def test_encryption_is_randomised_and_a_wrong_share_does_not_decrypt(keys):
    pub = keys.public
    assert pub.encrypt(7) != pub.encrypt(7)  # fresh r each time
    c = pub.encrypt(12345)
    partials = {s.party: s.partial_decrypt(c) for s in keys.shares[:3]}
    partials[1] = pow(partials[1], 3, pub.n2)  # a party that lies
    assert combine(pub, partials, 5, 3) != 12345


def test_t34_a_sum_of_fixed_point_encodings_decrypts_exactly(keys):
    pub = keys.public
    fp = FixedPoint(pub.n, bits=24)
    rng = random.Random(1)
    clients = [[rng.uniform(-3, 3) for _ in range(4)] for _ in range(7)]
    fp.check_headroom(3.0, len(clients))
    for coord in range(4):
        encodings = [fp.encode(v[coord]) for v in clients]
        total = pub.add([pub.encrypt(e) for e in encodings])
        plain = combine(pub, {s.party: s.partial_decrypt(total) for s in keys.shares[2:]}, 5, 3)
        exact = sum(round(v[coord] * 2**24) for v in clients)  # the integers that were encrypted, summed
        assert fp.decode(plain) == exact / 2**24
        assert abs(fp.decode(plain) - sum(v[coord] for v in clients)) <= 7 * 2**-25
    assert fp.decode(fp.encode(-1.5)) == -1.5
    with pytest.raises(ValueError, match="could exceed n/2"):
        FixedPoint(pub.n, bits=254).check_headroom(1.0, 2)


def test_bad_keys_are_refused():
    with pytest.raises(ValueError, match="threshold must be in"):
        keygen(128, parties=3, threshold=4)
    with pytest.raises(ValueError, match="even number"):
        keygen(63, parties=3, threshold=2)
