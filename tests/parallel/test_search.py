"""The joint search (``hcomm.parallel.planner.search``) on synthetic clusters.

- Against exhaustive enumeration under the simulator: every integer batch split x every bucket size
  for data parallelism on small clusters (the builder the search calls must reach the minimum), and
  every (pp, tp) shape the search lists (its winner is the fastest of them).
- Memory: a model that fits no rank whole is planned with ZeRO / pipelines; one that fits nowhere
  gets an error naming the rank and the bytes.
- Bad input: prices missing a device kind.
No processes.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from hcomm.parallel import simulate
from hcomm.parallel.plan import Plan
from hcomm.parallel.planner.data import BUCKET_CANDIDATES, micro_batch_limits, plan_data_parallel
from hcomm.parallel.planner.search import coarser, search, shapes
from tests.parallel.test_simulate import DIM, SEQ, MiB, profile, view


def exhaustive_data_parallel(v, batch):
    """(step, counts, bucket) of the fastest data-parallel plan over every split and bucket size."""
    limits = micro_batch_limits(v)
    best = (math.inf, None, None)
    for counts in itertools.product(range(batch + 1), repeat=v.world_size):
        if sum(counts) != batch:
            continue
        for bucket in BUCKET_CANDIDATES + [v.profiles[0].param_bytes + 4]:
            plan = Plan.from_shares([c / batch for c in counts], batch, SEQ, bucket_bytes=bucket)
            for r, limit in zip(plan.ranks, limits):
                r.micro_batch = int(limit)
            step = simulate(plan, v, dim=DIM).step_s
            if step < best[0] - 1e-12:
                best = (step, counts, bucket)
    return best


@pytest.mark.parametrize("speeds, batch, islands", [
    ([1.0, 0.5, 0.25], 7, None),
    ([1.0, 1.0, 0.3], 9, [[0, 1], [2]]),
    ([1.0, 0.2], 5, None),                    # the slow rank is better left out of compute
    ([1.0, 0.9, 0.5, 0.1], 10, [[0, 1], [2, 3]]),
])
def test_data_parallel_reaches_the_exhaustive_optimum(speeds, batch, islands):
    v = view(speeds, islands=islands)
    plan, _ = plan_data_parallel(v, batch, SEQ)
    best, counts, _ = exhaustive_data_parallel(v, batch)
    assert simulate(plan, v, dim=DIM).step_s == pytest.approx(best, rel=1e-12), (plan.batch_counts(), counts)


def test_search_takes_the_fastest_shape_and_lists_the_rest():
    v = view([1.0, 1.0, 0.5, 0.5], islands=[[0, 1], [2, 3]])
    result = search(v, 8, SEQ, dim=DIM, kv_heads=2)
    listed = {c.label for c in result.candidates}
    # profiles measured at one sample: no pipeline runs micro-batches below it, so no coarser variants
    assert {"dp", "zero-1", "zero-2", "zero-3", "dp, weak tier bf16", "pp=2", "pp=4", "tp=2", "pp=2 tp=2"} == listed
    usable = [c for c in result.candidates if c.usable]
    assert result.best.step_s == min(c.step_s for c in usable)
    assert [c.step_s for c in usable] == sorted(c.step_s for c in usable)
    for c in usable:   # every emitted plan is valid on the cluster and the simulator agrees with its builder
        c.plan.validate(4)
        assert c.sim.step_s == pytest.approx(c.plan.predicted_step_s, rel=1e-9), c.label
    marked = [line for line in result.table(8 * SEQ) if line.startswith("  ->")]
    assert len(marked) == 1 and marked[0][4:].startswith(result.best.label)


def test_pipelines_below_the_profiles_micro_batch_get_a_coarser_variant():
    """Profiles measured at 2 samples: a pipeline shape whose best plan runs one-sample micro-batches is
    offered again with micro-batches of at least 2 (at most rows // 2 of them), which predicts no faster."""
    v = view([1.0, 1.0, 0.5, 0.5], islands=[[0, 1], [2, 3]])
    v.profiles = [dataclasses.replace(p, micro_batch=2) for p in v.profiles]
    result = search(v, 8, SEQ, dim=DIM, kv_heads=2)
    by_label = {c.label: c for c in result.candidates}
    checked = 0
    for label in ("pp=2", "pp=4", "pp=2 tp=2"):
        base = by_label[label]
        counts = base.plan.samples_computed()
        groups = base.plan.pipeline_groups()
        rows = max(counts[g.ranks[0]] for g in groups)
        small = any(counts[g.ranks[0]] < 2 * g.micro_batches for g in groups)
        cap = max(1, rows // 2)
        variant = by_label.get(coarser(label, cap))
        assert (variant is not None) == (small and cap < max(g.micro_batches for g in groups)), label
        if variant is None:
            continue
        checked += 1
        assert variant.variant_of == label and variant.usable
        variant_counts = variant.plan.samples_computed()
        for g in variant.plan.pipeline_groups():   # micro-batches of the profiles' size or more (or just one)
            assert g.micro_batches <= cap
            assert variant_counts[g.ranks[0]] >= 2 * g.micro_batches or g.micro_batches == 1
        assert variant.step_s >= base.step_s * (1 - 1e-12)
        variant.plan.validate(4)
    assert checked >= 1   # the deepest micro-batch counts win on this model: some shape has a variant


def test_shapes_respect_the_model():
    # 8 ranks, 5 pieces, 2 key/value heads: tp in {1, 2}, pp <= 5 and dividing what is left
    assert sorted(shapes(8, 5, 2)) == [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2)]
    assert sorted(shapes(8, 5, 8, max_tp=2)) == [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2)]


def test_async_sync_is_searched_only_when_allowed():
    v = view([1.0, 0.5], islands=[[0], [1]])
    assert not any("sync every" in c.label for c in search(v, 4, SEQ, dim=DIM, kv_heads=1).candidates)
    assert {"dp, islands sync every 4", "dp, islands sync every 8"} <= {
        c.label for c in search(v, 4, SEQ, dim=DIM, kv_heads=1, allow_async=True).candidates}


def test_a_model_too_big_for_one_rank_is_sharded():
    """20 MiB of training state; 14 MiB per rank: only sharding the state (ZeRO or stages) fits."""
    v = view([1.0, 1.0, 1.0, 1.0])
    for r in range(4):
        v.profiles[r] = profile(r, budget=14 * MiB)
    result = search(v, 4, SEQ, dim=DIM, kv_heads=2)
    assert result.best.label in ("zero-3", "pp=2", "pp=4", "tp=2", "pp=2 tp=2")
    refused = {c.label for c in result.candidates if not c.usable}
    assert "dp" in refused


def test_nothing_fits_names_the_rank_and_the_bytes():
    v = view([1.0, 1.0])
    for r in range(2):
        v.profiles[r] = profile(r, budget=2 * MiB)
    with pytest.raises(ValueError, match="no plan fits the model on this cluster"):
        search(v, 2, SEQ, dim=DIM, kv_heads=1)


def test_prices_must_name_every_device_kind():
    v = view([1.0, 0.5])
    with pytest.raises(ValueError, match=r"prices name no price for device kind\(s\) \['X'\]"):
        search(v, 4, SEQ, dim=DIM, kv_heads=1, prices={"A100": 2.0})
    result = search(v, 4, SEQ, dim=DIM, kv_heads=1, prices={"X": 2.0})
    assert "cost/Mtok" in result.table(4 * SEQ, {"X": 2.0}, v.devices)[0]



def _candidate(label, step_s, kind, variant_of=""):
    from hcomm.parallel.planner.search import Candidate
    from hcomm.parallel.planner.simulate import Simulation

    return Candidate(label, sim=Simulation(step_s, [1], [2], kind), variant_of=variant_of)


def test_the_trial_measures_each_kind_once_and_the_pipelines_coarser_variants():
    """``trial.distinct_kinds``: the fastest of each kind, never a variant standing for its kind; plain DP
    always; a picked pipeline's variant of fewer micro-batches when predicted within VARIANT_WITHIN
    (1.3) of the best; never a variant of a plan not picked."""
    from hcomm.train.trial import VARIANT_WITHIN, distinct_kinds

    assert VARIANT_WITHIN == 1.3
    candidates = [_candidate("pp=2", 1.00, "pipeline"),
                  _candidate("pp=2, at most 6 micro-batches", 1.05, "pipeline", "pp=2"),
                  _candidate("pp=4", 1.10, "pipeline"),
                  _candidate("pp=2 tp=2", 1.20, "pipeline+tensor"),
                  _candidate("pp=4, at most 8 micro-batches", 1.25, "pipeline", "pp=4"),
                  _candidate("pp=2 tp=2, at most 2 micro-batches", 1.31, "pipeline+tensor", "pp=2 tp=2"),
                  _candidate("zero-1", 1.4, "zero"),
                  _candidate("tp=2", 1.5, "tensor"),
                  _candidate("dp", 1.6, "data")]
    picked = [c.label for c in distinct_kinds(candidates, 3)]
    assert picked == ["pp=2", "pp=2 tp=2", "zero-1", "dp", "pp=2, at most 6 micro-batches"]
    # the variant alone never stands for its kind
    only_variant = [_candidate("pp=2, at most 1 micro-batch", 1.0, "pipeline", "pp=2"), _candidate("dp", 1.1, "data")]
    assert [c.label for c in distinct_kinds(only_variant, 3)] == ["dp"]
