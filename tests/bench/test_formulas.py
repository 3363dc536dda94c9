"""busbw factors, algbw/busbw and size rounding against hand-computed values."""
import pytest

from hcomm.bench import definitions
from hcomm.bench.runner import bandwidths

# nccl-tests PERFORMANCE.md, worked by hand for 2, 4 and 8 ranks
HAND = {
    "all_reduce": {2: 1.0, 4: 1.5, 8: 1.75},
    "all_gather": {2: 0.5, 4: 0.75, 8: 0.875},
    "reduce_scatter": {2: 0.5, 4: 0.75, 8: 0.875},
    "all_to_all": {2: 0.5, 4: 0.75, 8: 0.875},
    "broadcast": {2: 1.0, 4: 1.0, 8: 1.0},
    "reduce": {2: 1.0, 4: 1.0, 8: 1.0},
    "pingpong": {2: 1.0, 4: 1.0, 8: 1.0},
    "unidir": {2: 1.0, 4: 1.0, 8: 1.0},
    # uneven shares unit*(r+1): busiest rank moves everything but 1 of n(n+1)/2 units
    "all_gather_v": {2: 2 / 3, 4: 9 / 10, 8: 35 / 36},
    "reduce_scatter_v": {2: 2 / 3, 4: 9 / 10, 8: 35 / 36},
    # rank n-1 receives n units from each of n-1 peers, of a send buffer of n(n+1)/2 units
    "all_to_all_v": {2: 2 / 3, 4: 12 / 10, 8: 56 / 36},
}


def test_every_op_has_a_hand_value():
    assert set(HAND) == set(definitions.op_names())


@pytest.mark.parametrize("op", sorted(HAND))
@pytest.mark.parametrize("n", [2, 4, 8])
def test_busbw_factor(op, n):
    assert definitions.get(op).busbw_factor(n) == pytest.approx(HAND[op][n])


def test_algbw_busbw_all_reduce_1mib_in_1ms_on_4_ranks():
    algbw, busbw = bandwidths(1048576, 1e-3, definitions.get("all_reduce").busbw_factor(4))
    assert algbw == pytest.approx(1.048576)   # GB/s are 1e9 B/s, like nccl-tests
    assert busbw == pytest.approx(1.572864)   # * 2(n-1)/n = 1.5


def test_algbw_all_gather_uses_total_size():
    # 8 ranks gather 1 MB each: size is the 8 MB output; 10 ms -> 0.8 GB/s algbw, 0.7 busbw
    algbw, busbw = bandwidths(8_000_000, 1e-2, definitions.get("all_gather").busbw_factor(8))
    assert (algbw, busbw) == (pytest.approx(0.8), pytest.approx(0.7))


def test_zero_time_gives_zero_not_infinity():
    assert bandwidths(100, 0.0, 1.0) == (0.0, 0.0)


@pytest.mark.parametrize("op,nbytes,n,elsize,count", [
    ("all_reduce", 8, 4, 4, 2),
    ("all_reduce", 10, 4, 4, 2),          # rounded down to whole elements
    ("all_gather", 100, 4, 4, 24),        # 25 elements -> multiple of 4 ranks
    ("all_gather", 8, 4, 4, 4),           # never below one element per rank
    ("all_to_all", 4096, 3, 4, 1023),
    ("all_gather_v", 8, 3, 4, 6),         # one unit per share: 1+2+3
    ("all_to_all_v", 1024, 4, 2, 510),    # 512 elements -> multiple of 10
])
def test_count_rounding(op, nbytes, n, elsize, count):
    assert definitions.get(op).count_for(nbytes, elsize, n) == count
