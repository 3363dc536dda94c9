"""The cost model and the data-parallel search, on synthetic profiles (exact values)."""
import pytest

from hcomm.parallel.cluster import ClusterView, SAMPLE_BYTES, interpolated
from hcomm.parallel.plan import Plan
from hcomm.parallel.planner import cost
from hcomm.parallel.planner.data import PlanningError, lpt_counts, micro_batch_limits, plan_data_parallel
from hcomm.parallel.profile import DeviceProfile, LayerCost

MiB = 1 << 20


def profile(rank, seconds_per_piece=(0.1, 0.2, 0.2, 0.1), grad_mib=(4, 8, 8, 4), micro_batch=1, speed=1.0,
            budget=8 << 30, act_per_sample=MiB):
    layers = [LayerCost(f"p{i}", s / speed / 3, 2 * s / speed / 3, g * MiB, g * MiB, 2 * g * MiB, act_per_sample)
              for i, (s, g) in enumerate(zip(seconds_per_piece, grad_mib))]
    # fwd + bwd of piece i = seconds_per_piece[i] / speed for `micro_batch` samples
    return DeviceProfile(rank, "X", micro_batch, 16, layers, budget, 0, "test", 0.0, "measured")


def view(speeds, islands=None, allreduce=lambda n: 0.001 + n / 1e9, optimizer=0.0, **kw):
    profiles = [profile(r, speed=s, **kw) for r, s in enumerate(speeds)]
    islands = islands or [list(range(len(speeds)))]
    return ClusterView(["X"] * len(speeds), islands, profiles, allreduce, [allreduce] * len(islands),
                       [optimizer] * len(speeds), None, [f"i{i}" for i in range(len(islands))])


def test_bucket_plan_splits_pieces_at_bucket_boundaries():
    # backward order: 4, 8, 8, 4 MiB with 6 MiB buckets
    assert cost.bucket_plan([4 * MiB, 8 * MiB, 8 * MiB, 4 * MiB], 6 * MiB) == [
        (6 * MiB, 1), (6 * MiB, 1), (6 * MiB, 2), (6 * MiB, 3)]
    assert cost.bucket_plan([4 * MiB, 8 * MiB], 64 * MiB) == [(12 * MiB, 1)]


def test_dp_step_overlap_by_hand():
    # One rank, 1 sample, pieces 0.1/0.2/0.2/0.1 s (fwd 1/3, bwd 2/3), all-reduce 0.5 s per bucket of any size.
    p = profile(0)
    est = cost.dp_step([p], [1], 12 * MiB, lambda n: 0.5)
    # fwd = 0.2 s; backward runs pieces 3,2,1,0 (bwd 0.0667, 0.1333, 0.1333, 0.0667).
    # bucket 0 (pieces 3 + 2 = 12 MiB) ready at 0.2 + 0.2 = 0.4, ends 0.9; bucket 1 ready 0.6 (8 MiB of
    # piece 1 completes the first 12? no: piece 3 = 4 MiB, piece 2 = 8 MiB -> 12 MiB at piece index 1).
    assert est.buckets == 2
    assert est.compute_s == [pytest.approx(0.6)]
    # bucket 0 ready when backward piece index 1 (model piece 2) ends: 0.2 + 0.0667 + 0.1333 = 0.4
    # bucket 1 (12 MiB: pieces 1, 0) ready at 0.6; starts at max(0.6, 0.9) = 0.9, ends 1.4
    assert est.step_s == pytest.approx(1.4)
    assert est.comm_exposed_s == pytest.approx(0.8)


def test_dp_step_zero_share_rank_is_ready_at_once_and_micro_batches():
    fast, idle = profile(0), profile(1)
    est = cost.dp_step([fast, idle], [2, 0], 1 << 30, lambda n: 0.1)
    assert est.compute_s == [pytest.approx(1.2), 0.0]
    assert est.step_s == pytest.approx(1.3)
    # two micro-batches of 1: only the last one's backward overlaps; the bucket is ready at the end anyway
    est2 = cost.dp_step([fast], [2], 1 << 30, lambda n: 0.1, micro_batches=[1])
    assert est2.step_s == pytest.approx(1.3)


def test_lpt_counts_are_speed_proportional_and_exact():
    assert lpt_counts([1.0, 1.0, 2.0, 2.0], 24, [True] * 4) == [8, 8, 4, 4]
    assert lpt_counts([1.0, 2.0], 7, [True, True]) == [5, 2]
    assert lpt_counts([1.0, 2.0], 7, [False, True]) == [0, 7]
    with pytest.raises(PlanningError):
        lpt_counts([1.0], 3, [False])


def test_auto_plan_on_speeds_1_1_half_half_gives_8_8_4_4():
    v = view([1.0, 1.0, 0.5, 0.5], allreduce=lambda n: 1e-4)
    plan, candidates = plan_data_parallel(v, 24, 16)
    assert plan.batch_counts() == [8, 8, 4, 4]
    assert isinstance(plan, Plan) and plan.name == "auto" and plan.backend == "hcomm"
    equal = min((c for c in candidates if c.label == "equal shares"), key=lambda c: c.step_s)
    # compute-bound: equal shares wait for the half-speed ranks, 6 samples at 1.2 s/sample vs 8 at 0.6
    assert equal.step_s / plan.predicted_step_s == pytest.approx(7.2 / 4.8, rel=0.01)
    assert any("beat equal shares" in n for n in plan.notes)


def test_auto_plan_picks_the_bucket_size_the_model_says_is_fastest():
    # latency-heavy link: few big buckets win; the plan's bucket is the argmin over the candidates
    v = view([1.0, 1.0], allreduce=lambda n: 0.05 + n / 1e9)
    plan, candidates = plan_data_parallel(v, 8, 16)
    best = min(candidates, key=lambda c: c.step_s)
    assert plan.dp_group().bucket_bytes == best.bucket_bytes
    assert plan.predicted_step_s == pytest.approx(best.step_s)


def test_pinned_shares_and_bucket_are_kept():
    v = view([1.0, 0.5])
    plan, candidates = plan_data_parallel(v, 10, 16, shares=[0.5, 0.5], bucket_bytes=4 * MiB)
    assert plan.batch_counts() == [5, 5] and plan.dp_group().bucket_bytes == 4 * MiB
    assert len(candidates) == 1


def test_memory_limits_micro_batch_and_rejects_a_model_that_does_not_fit():
    # state = params + grads + AdamW states = 24 + 24 + 48 = 96 MiB; 4 pieces x 2.5 MiB = 10 MiB per sample
    v = view([1.0, 1.0], act_per_sample=10 * MiB // 4, budget=96 * MiB + 25 * MiB)
    assert micro_batch_limits(v) == [2, 2]  # 25 MiB free // 10 MiB per sample
    small = view([1.0, 1.0], budget=90 * MiB)
    with pytest.raises(PlanningError, match=r"does not fit rank 0 \(X\).*0\.09 GiB"):
        plan_data_parallel(small, 8, 16)


def test_outer_sync_estimate_amortises_the_cross_island_all_reduce():
    slow_link = lambda n: 1.0 + n / 1e7  # noqa: E731
    v = view([1.0, 1.0, 1.0, 1.0], islands=[[0, 1], [2, 3]], allreduce=slow_link)
    v.island_allreduce_s = [lambda n: 1e-4] * 2
    sync, _ = plan_data_parallel(v, 8, 16)
    outer, _ = plan_data_parallel(v, 8, 16, sync_every=8)
    assert outer.predicted_step_s < sync.predicted_step_s / 2
    assert outer.dp_group().sync_every == 8


def test_interpolated_predictor_is_exact_at_samples_and_monotone():
    samples = [1e-5 + n / 1e9 for n in SAMPLE_BYTES]
    f = interpolated(samples)
    assert f(SAMPLE_BYTES[3]) == pytest.approx(samples[3])
    assert f(3 * SAMPLE_BYTES[5]) > f(2 * SAMPLE_BYTES[5])
    assert f(SAMPLE_BYTES[-1] * 4) == pytest.approx(samples[-1] * 4)


def test_rebalanced_counts_follow_measured_compute_and_keep_reduce_only_ranks():
    from hcomm.parallel.planner.data import rebalanced_counts

    # measured 0.1 s/sample on ranks 0-1, 0.3 s on ranks 2-3; rank 3 had no samples and stays out
    assert rebalanced_counts([0.1, 0.1, 0.3, 0.0], 14, [5, 5, 4, 0]) == [6, 6, 2, 0]
    assert rebalanced_counts([0.1, 0.2], 9, [6, 3]) == [6, 3]


def test_auto_plan_asks_for_a_resplit_only_when_shares_are_free():
    v = view([1.0, 0.5])
    assert plan_data_parallel(v, 12, 16, rebalance_after=3)[0].dp_group().rebalance_after == 3
    assert plan_data_parallel(v, 12, 16, shares=[0.5, 0.5], rebalance_after=3)[0].dp_group().rebalance_after == 0
    with pytest.raises(ValueError, match="rebalance_after: re-splitting the batch is not supported with sync_every 8"):
        Plan.from_yaml("global_batch: 8\nseq_len: 4\nshares: [0.5, 0.5]\ngroups:\n"
                       "  - {name: dp, ranks: [0, 1], sync_every: 8, rebalance_after: 3}\n")
