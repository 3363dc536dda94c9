"""The ZeRO engine's buffer pool (hcomm/parallel/zero/buffers.py): a unit's storage keeps its identity
while its memory comes from and goes back to the pool, and after the first step no unit-sized block
is allocated again once each unit has its set (equivalence with one process through the pool: test_zero.py)."""
import pytest
import torch

from hcomm.parallel.zero import buffers
from hcomm.parallel.zero.buffers import BufferPool
from tests.parallel import dp_cases, zero_cases
from tests.parallel.test_zero import check, zero_plan


def test_a_storage_keeps_its_views_while_its_memory_is_pooled():
    pool = BufferPool()
    full = torch.zeros(6)
    weight = full[2:4]                 # a parameter is a view of the unit's flat buffer
    storage = full.untyped_storage()
    pool.empty(storage)
    assert storage.nbytes() == 0 and pool.held_bytes() == 24
    pool.fill(storage, 24)             # the block comes back, not a new one
    assert pool.allocations == 0 and pool.held_bytes() == 0
    full.copy_(torch.arange(6.0))      # what a gather writes ...
    assert weight.tolist() == [2.0, 3.0]   # ... the view (and autograd's saved copy of it) sees


def test_blocks_are_reused_by_size_and_new_ones_counted():
    pool = BufferPool()
    a, b = torch.empty(0).untyped_storage(), torch.empty(0).untyped_storage()
    pool.fill(a, 64)
    first = a.data_ptr()
    pool.empty(a)
    pool.fill(b, 64)                   # another unit of the same size takes the same block
    assert b.data_ptr() == first and pool.allocations == 1
    pool.fill(a, 32)                   # another size: a new block
    assert a.nbytes() == 32 and pool.allocations == 2
    pool.fill(a, 32)                   # already filled: nothing happens
    assert pool.allocations == 2


def test_flat_tensors_come_back_zeroed_when_asked():
    pool = BufferPool()
    t = pool.tensor(5, torch.float32, "cpu", zero=True)
    t.fill_(3.0)
    pool.give(t)
    again = pool.tensor(5, torch.float32, "cpu", zero=True)
    assert again.data_ptr() == t.data_ptr() and again.tolist() == [0.0] * 5 and pool.allocations == 1
    other = pool.tensor(5, torch.float64, "cpu")   # another dtype is another buffer
    assert other.dtype == torch.float64 and pool.allocations == 2


def test_without_the_swap_storages_are_resized_as_before(monkeypatch):
    monkeypatch.setattr(buffers, "_SWAP", False)
    pool = BufferPool()
    full = torch.ones(4)
    storage = full.untyped_storage()
    pool.empty(storage)
    assert storage.nbytes() == 0 and pool.held_bytes() == 0
    pool.fill(storage, 16)
    assert storage.nbytes() == 16 and pool.allocations == 1


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_blocks_stay_within_one_set_per_unit(pool3, stage):
    """Micro-batches of 2 over 5/3/0 samples (3, 2 and 0 real rounds, ghost rounds on the rest), SGD, 4
    steps: the engine takes at most one parameter block, one gradient buffer and one reduction result
    per unit from the allocator over the whole run (without the pool: about that many per round, 12
    rounds), and the losses and parameters still match one process.  How many of those it needs
    depends on which reductions finish before which gradients arrive (timing), so the bound is per unit,
    not an exact count."""
    steps = 4
    plan = zero_plan([0.625, 0.375, 0.0], 8, stage, fractions=[0.2, 0.3, 0.5], micro=2)
    results = pool3.run(zero_cases.case_zero_train, plan.to_yaml(), steps)
    check(results, *dp_cases.reference(8, steps))
    for _, _, stats in results:
        counts = [s["pool_allocations"] for s in stats]
        units = stats[0]["units"]
        assert 0 < counts[0] and counts == sorted(counts), counts
        assert counts[-1] <= (3 if stage == 3 else 2) * units, (counts, units)
