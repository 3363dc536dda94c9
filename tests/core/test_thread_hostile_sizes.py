"""Thread-rank tier: hostile split sizes for the uneven collectives never move a byte.

The C++ core on its own (no Python wrapper in between): negative, huge and
int64-wrapping sizes, lists of the wrong length and sums that miss the
tensor must raise HCommValueError before any communication, promptly, with
the message the reference model in tests/helpers/hostile.py predicts.  The
issue-19 reproductions check that nothing past the output was written (the
unchecked sum let rank 0 write 2 floats past the output, or segfault).
"""
import time

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import hcomm
from tests.helpers import hostile, local
from tests.helpers.hostile import INT64_MAX, MAX_TOTAL

TIMEOUT_MS = 2000  # a case that slipped past validation times out (an HCommError, not a ValueError) in 2 s


def _z(n):
    return torch.zeros(n)


def _refused(world, kind, inputs, outputs, **counts):
    """Runs `kind` expecting a refusal; returns (rank that reported it, message tail)."""
    t0 = time.monotonic()
    with pytest.raises(hcomm.HCommValueError) as info:
        local.run(world, kind, torch.float32, inputs, outputs, timeout_ms=TIMEOUT_MS, **counts)
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert elapsed < 1.5, f"refused only after {elapsed:.1f} s: {msg}"
    assert msg.startswith(f"hcomm: {kind}("), msg
    head, sep, tail = msg.partition(" on rank ")
    rank, _, tail = tail.partition(": ")
    assert sep and rank.isdigit(), msg
    return int(rank), tail


# ------------------------------------------------------------------ issue 19 reproductions

@pytest.mark.parametrize("first", [12, 1_000_000])
def test_all_gather_v_sum_that_wraps_to_the_output_writes_nothing_past_it(first):
    # [12, 2^63-1, 2^63-1] sums to 10 in int64: rank 0's own entry matched its input, so the
    # old check passed and the ring wrote 12 floats into a 10-float output (a SIGSEGV at 10^6).
    world, total = 3, 10
    sizes = [first, INT64_MAX, hostile.wrap64(total - first - INT64_MAX)]
    assert hostile.wrap64(sum(sizes)) == total
    backing = [torch.full((total + 64,), -7.0) for _ in range(world)]
    outs = [b[:total] for b in backing]  # the real allocation goes on past the output
    inputs = [torch.ones(first), _z(1), _z(1)]
    rank, tail = _refused(world, "all_gather_v", inputs, outs, output_counts=[sizes] * world)
    assert (rank, tail) == (0, f"output_split_sizes[0] = {first} exceeds the output's 10 elements")
    assert all(torch.equal(b, torch.full((total + 64,), -7.0)) for b in backing)


def test_all_gather_v_the_issue_message():
    sizes = [3, INT64_MAX, INT64_MAX, 9]  # wraps to 10
    assert hostile.wrap64(sum(sizes)) == 10
    inputs = [_z(3), _z(1), _z(1), _z(9)]
    rank, tail = _refused(4, "all_gather_v", inputs, [_z(10) for _ in range(4)], output_counts=[sizes] * 4)
    assert (rank, tail) == (0, "output_split_sizes[1] = 9223372036854775807 exceeds the output's 10 elements")


def test_reduce_scatter_v_sum_that_wraps_to_the_input():
    # Used to fail deep in an algorithm with "vector::_M_default_append".
    sizes = [3, INT64_MAX, INT64_MAX, 9]
    inputs = [torch.ones(10) for _ in range(4)]
    outs = [_z(3), _z(1), _z(1), _z(9)]
    rank, tail = _refused(4, "reduce_scatter_v", inputs, outs, input_counts=[sizes] * 4)
    assert (rank, tail) == (0, "input_split_sizes[1] = 9223372036854775807 exceeds the input's 10 elements")


def test_all_to_all_v_receive_splits_that_wrap():
    send = [[1, 1] for _ in range(2)]
    recv = [[INT64_MAX, hostile.wrap64(2 - INT64_MAX)]] * 2  # wraps to 2 (the second entry is negative)
    rank, tail = _refused(2, "all_to_all_v", [_z(2), _z(2)], [_z(2), _z(2)], input_counts=send, output_counts=recv)
    assert (rank, tail) == (0, f"output_split_sizes has a negative entry {hostile.wrap64(2 - INT64_MAX)} at index 1")
    recv = [[INT64_MAX, INT64_MAX, 4]] * 3  # wraps to 2, all non-negative
    rank, tail = _refused(3, "all_to_all_v", [_z(3)] * 3, [_z(2)] * 3, input_counts=[[1, 1, 1]] * 3,
                          output_counts=recv)
    assert (rank, tail) == (0, "output_split_sizes[0] = 9223372036854775807 exceeds the output's 2 elements")


# ------------------------------------------------------------------ property tests

@settings(max_examples=60, deadline=None)
@given(data=st.data(), world=st.integers(1, 4), total=st.integers(0, MAX_TOTAL))
def test_all_gather_v_hostile_sizes_are_refused(data, world, total):
    sizes = data.draw(hostile.sizes(world, total))
    want = hostile.problem("output_split_sizes", sizes, total, "output", world)
    assume(want is not None)
    inputs = [_z(hostile.fits(sizes[r] if r < len(sizes) else 1)) for r in range(world)]
    # Every rank sees the same sizes and tensors, so every rank refuses; rank 0 reports first.
    assert _refused(world, "all_gather_v", inputs, [_z(total) for _ in range(world)],
                    output_counts=[sizes] * world) == (0, want)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), world=st.integers(1, 4), total=st.integers(0, MAX_TOTAL))
def test_reduce_scatter_v_hostile_sizes_are_refused(data, world, total):
    sizes = data.draw(hostile.sizes(world, total))
    want = hostile.problem("input_split_sizes", sizes, total, "input", world)
    assume(want is not None)
    outs = [_z(hostile.fits(sizes[r] if r < len(sizes) else 1)) for r in range(world)]
    assert _refused(world, "reduce_scatter_v", [_z(total) for _ in range(world)], outs,
                    input_counts=[sizes] * world) == (0, want)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), world=st.integers(1, 4), n_in=st.integers(0, MAX_TOTAL), n_out=st.integers(0, MAX_TOTAL),
       hostile_side=st.sampled_from(["send", "receive", "both"]))
def test_all_to_all_v_hostile_splits_are_refused(data, world, n_in, n_out, hostile_side):
    def sane(n):  # a valid split of n elements: the gaps between sorted cut points
        cuts = sorted(data.draw(st.lists(st.integers(0, n), min_size=world - 1, max_size=world - 1)))
        return [b - a for a, b in zip([0] + cuts, cuts + [n])]

    send = data.draw(hostile.sizes(world, n_in)) if hostile_side != "receive" else sane(n_in)
    recv = data.draw(hostile.sizes(world, n_out)) if hostile_side != "send" else sane(n_out)
    # The core checks the send splits first.
    want = (hostile.problem("input_split_sizes", send, n_in, "input", world)
            or hostile.problem("output_split_sizes", recv, n_out, "output", world))
    assume(want is not None)
    assert _refused(world, "all_to_all_v", [_z(n_in) for _ in range(world)], [_z(n_out) for _ in range(world)],
                    input_counts=[send] * world, output_counts=[recv] * world) == (0, want)


# ------------------------------------------------------------------ what only some ranks can see

def test_own_entry_that_differs_from_the_input_is_refused_by_that_rank_alone():
    # Sizes valid on every rank, but rank 2 passes 3 elements where its entry says 4: only rank 2
    # can know.  The harness (like a real job's timeout) must not leave the others hanging.
    sizes = [3, 3, 4]
    rank, tail = _refused(3, "all_gather_v", [_z(3)] * 3, [_z(10) for _ in range(3)], output_counts=[sizes] * 3)
    assert (rank, tail) == (2, "output_split_sizes[2] is 4 but this rank's input has 3 elements")
    rank, tail = _refused(3, "reduce_scatter_v", [_z(10) for _ in range(3)], [_z(3)] * 3, input_counts=[sizes] * 3)
    assert (rank, tail) == (2, "input_split_sizes[2] is 4 but this rank's output has 3 elements")


def test_all_to_all_v_splits_that_disagree_across_ranks_fail_in_the_transport_not_in_memory():
    # Each rank's splits fit its own tensors, so no rank can refuse the call: rank 0 sends 3
    # elements to rank 1, which expects 1.  The transport compares sizes before copying.
    backing = torch.full((64,), -7.0)
    outs = [torch.zeros(2), backing[:4]]
    with pytest.raises(hcomm.HCommError, match=r"^hcomm: rank 1 expected 4 bytes from rank 0 but got 12$") as info:
        local.run(2, "all_to_all_v", torch.float32, [torch.ones(4), torch.ones(4)], outs,
                  input_counts=[[1, 3], [1, 3]], output_counts=[[1, 1], [1, 3]], algorithm="pairwise",
                  timeout_ms=TIMEOUT_MS)
    assert not isinstance(info.value, ValueError)
    assert torch.equal(backing[4:], torch.full((60,), -7.0))
