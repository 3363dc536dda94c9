"""The ZeRO engine's buffer pool (hcomm/parallel/zero/buffers.py): a unit's storage keeps its identity
while its memory comes from and goes back to the pool, the pool holds no more than the memory model
counts, and a ZeRO-3 run takes no new parameter block after its first step (equivalence with one
process through the pool: here and in test_zero.py)."""
import pytest
import torch

from hcomm.parallel.zero import buffers
from hcomm.parallel.zero.buffers import BufferPool
from hcomm.parallel.zero.memory import GRAD_BUFFERS_IN_FLIGHT
from tests.parallel import dp_cases, zero_cases
from tests.parallel.test_zero import check, zero_plan


def test_a_storage_keeps_its_views_while_its_memory_is_pooled():
    pool = BufferPool(max_block_bytes=64)
    full = torch.zeros(6)
    weight = full[2:4]                 # a parameter is a view of the unit's flat buffer
    storage = full.untyped_storage()
    pool.empty(storage)
    assert storage.nbytes() == 0 and pool.held_bytes() == 24
    pool.fill(storage, 24)             # the block comes back, not a new one
    assert pool.block_allocations == 0 and pool.held_bytes() == 0
    full.copy_(torch.arange(6.0))      # what a gather writes ...
    assert weight.tolist() == [2.0, 3.0]   # ... the view (and autograd's saved copy of it) sees


def test_blocks_are_reused_by_size_and_new_ones_counted():
    pool = BufferPool(max_block_bytes=128)
    a, b = torch.empty(0).untyped_storage(), torch.empty(0).untyped_storage()
    pool.fill(a, 64)
    first = a.data_ptr()
    pool.empty(a)
    pool.fill(b, 64)                   # another unit of the same size takes the same block
    assert b.data_ptr() == first and pool.block_allocations == 1
    pool.fill(a, 32)                   # another size: a new block
    assert a.nbytes() == 32 and pool.block_allocations == 2
    pool.fill(a, 32)                   # already filled: nothing happens
    assert pool.block_allocations == 2


def test_blocks_in_use_and_kept_stay_within_the_limit():
    """A ZeRO-3 rank's limit is the bytes of the units it holds whole at once (``prefetch + 2`` of the
    largest); past it blocks go back to the allocator."""
    pool = BufferPool(max_block_bytes=32)
    start = [torch.zeros(4).untyped_storage() for _ in range(3)]   # the engine's start: every unit whole
    for storage in start:
        pool.empty(storage)
    assert pool.held_bytes() == 32                # two of 16 bytes kept, the third went back
    units = [torch.empty(0).untyped_storage() for _ in range(3)]
    pool.fill(units[0], 16)
    pool.fill(units[1], 16)
    assert pool.block_allocations == 0 and pool.held_bytes() == 0
    pool.fill(units[2], 16)                      # a third at once: past the limit, allocated ...
    pool.empty(units[2])                         # ... and not kept while two are in use
    assert pool.block_allocations == 1 and pool.held_bytes() == 0
    pool.empty(units[1])
    assert pool.held_bytes() == 16
    pool.fill(units[1], 24)                      # another size: the kept 16-byte block is dropped for it
    assert pool.block_allocations == 2 and pool.held_bytes() == 0


def test_flat_buffers_come_back_zeroed_and_are_trimmed_before_a_forward():
    pool = BufferPool(max_block_bytes=0, max_kept_tensors=1)
    t = pool.tensor(5, torch.float32, "cpu", zero=True)
    t.fill_(3.0)
    pool.give(t)
    again = pool.tensor(5, torch.float32, "cpu", zero=True)
    assert again.data_ptr() == t.data_ptr() and again.tolist() == [0.0] * 5 and pool.tensor_allocations == 1
    assert pool.tensor(5, torch.float64, "cpu").dtype == torch.float64 and pool.tensor_allocations == 2
    small, large = pool.tensor(4, torch.float32, "cpu"), pool.tensor(8, torch.float32, "cpu")
    pool.give(small)
    pool.give(large)                             # within a round every buffer comes back for reuse
    assert pool.held_bytes() == 48
    pool.trim()                                  # before the next forward: the largest one only
    assert pool.held_bytes() == 32 and pool.tensor(8, torch.float32, "cpu").data_ptr() == large.data_ptr()


def test_limits_must_not_be_negative():
    with pytest.raises(ValueError, match="limits must be >= 0"):
        BufferPool(max_block_bytes=-1)


def test_without_the_swap_storages_are_resized_as_before(monkeypatch):
    monkeypatch.setattr(buffers, "_SWAP", False)
    pool = BufferPool(max_block_bytes=64)
    full = torch.ones(4)
    storage = full.untyped_storage()
    pool.empty(storage)
    assert storage.nbytes() == 0 and pool.held_bytes() == 0
    pool.fill(storage, 16)
    assert storage.nbytes() == 16 and pool.block_allocations == 1


@pytest.mark.parametrize("stage", [2, 3])
def test_a_zero_run_reuses_its_buffers(pool3, stage):
    """Micro-batches of 2 over 5/3/0 samples (3, 2 and 0 real rounds, ghost rounds on the rest), SGD, 4
    steps, losses and parameters as one process.  ZeRO-3 takes no parameter block from the allocator at
    all (the blocks of the engine's start are kept, within prefetch + 2 units); the gradient buffers and
    reduction results, without the pool one per unit and round each (2 x units x 3 rounds a step), come
    from it in part: every one is reused within its round, the three largest across rounds."""
    steps = 4
    plan = zero_plan([0.625, 0.375, 0.0], 8, stage, fractions=[0.2, 0.3, 0.5], micro=2)
    results = pool3.run(zero_cases.case_zero_train, plan.to_yaml(), steps)
    check(results, *dp_cases.reference(8, steps))
    for _, _, stats in results:
        units = stats[0]["units"]
        if stage == 3:
            assert [s["block_allocations"] for s in stats] == [0] * steps
        made = [s["tensor_allocations"] for s in stats]
        per_step = [b - a for a, b in zip([0] + made, made)]
        assert 0 < made[0] and all(n < 2 * units * 3 for n in per_step), (per_step, units)
        # whole-unit gradient buffers held at once: what memory.py counts, on computing and ghost-only
        # ranks alike (before the engine waited for the older reduce-scatter, all five were out at once)
        assert all(1 <= s["grad_buffers_peak"] <= GRAD_BUFFERS_IN_FLIGHT for s in stats), stats
