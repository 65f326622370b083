"""Slot packing for TP-SMC: sums of packed plaintexts decode to the exact sums of the rounded values, at the
layout's extremes, and values beyond the bound are refused instead of corrupting a neighbouring slot."""

import random

import pytest

from dpfl.algorithms.secure.paillier_packing import SlotPacking
from dpfl.algorithms.secure.threshold_paillier import FixedPoint

N = (1 << 1023) + 12345  # any 1024-bit modulus: packing is plain integer arithmetic below n


def _sum_mod_n(plaintexts_by_party):
    return [sum(column) % N for column in zip(*plaintexts_by_party, strict=True)]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 8, 9])
def test_packed_sums_equal_the_fixed_point_sums_exactly(count):
    rng = random.Random(count)
    layout = SlotPacking(N, 32, 41.0, count)
    parties = [[rng.uniform(-41.0, 41.0) for _ in range(301)] for _ in range(count)]
    parties[0][:4] = [41.0, -41.0, 0.0, 2**-33]  # both extremes, zero, a value that rounds to a tie
    if count > 1:
        parties[1][:2] = [41.0, -41.0]
    got = layout.unpack_sum(_sum_mod_n([layout.pack(p) for p in parties]), 301)
    fp = FixedPoint(N, 32)
    expected = [fp.decode(sum(fp.encode(v) for v in column)) for column in zip(*parties, strict=True)]
    assert got == expected
    assert fp.unpack_sum(_sum_mod_n([fp.pack(p) for p in parties]), 301) == expected  # the unpacked codec agrees
    with pytest.raises(ValueError, match="expected 300"):
        fp.unpack_sum([0] * 301, 300)
    assert layout.ciphertexts(301) == len(layout.pack(parties[0])) < 301 // 10


def test_all_slots_at_the_bound_do_not_carry():
    """count values at +max_abs (or -max_abs) in every slot: the largest and smallest slot sums."""
    layout = SlotPacking(N, 16, 3.5, 5)
    for v in (3.5, -3.5):
        got = layout.unpack_sum(_sum_mod_n([layout.pack([v] * 50)] * 5), 50)
        assert got == [5 * v] * 50
    assert layout.slots * layout.width <= N.bit_length() - 1


def test_widths_follow_the_bound_and_the_count():
    layout = SlotPacking(N, 32, 1.0, 10)
    assert layout.value_bits == 34  # |round(v 2^32)| <= 2^32 needs 33 bits, plus one for the offset
    assert layout.width == 38 and layout.slots == 1023 // 38
    assert SlotPacking(N, 32, 1.0, 16).width == 38 and SlotPacking(N, 32, 1.0, 17).width == 39


def test_out_of_bound_values_and_layouts_that_do_not_fit_are_refused():
    layout = SlotPacking(N, 8, 1.0, 2)
    with pytest.raises(ValueError, match="beyond the layout's bound"):
        layout.pack([0.5, 1.01])
    with pytest.raises(ValueError, match="beyond the layout's bound"):
        layout.pack([float("nan")])
    with pytest.raises(ValueError, match="does not fit"):
        SlotPacking(1 << 40, 32, 1e3, 4)
    with pytest.raises(ValueError, match="count"):
        SlotPacking(N, 8, 1.0, 0)
    with pytest.raises(ValueError, match=f"hold {layout.slots} values, expected 200"):
        layout.unpack_sum([0], 200)  # one plaintext holds `slots` values
