"""The ZeRO memory model, memory-sized shard fractions, the per-rank check and the ZeRO cost model,
on hand-made profiles (units of 4, 8, 8, 4 MiB; AdamW state 2x the parameters; 1 MiB of activations
per sample)."""
import pytest

from hcomm.parallel.plan import Plan
from hcomm.parallel.planner.zero import zero_step_s
from hcomm.parallel.zero.memory import check_zero_fits, is_replicated, memory_fractions, zero_memory
from hcomm.train.plans import apply_zero, parse_entry
from tests.parallel.test_planner_dp import MiB, profile, view


def test_categories_by_stage():
    p = profile(0)      # params 24 MiB, grads 24 MiB, optimizer 48 MiB, largest unit 8 MiB
    one = zero_memory(p, stage=1, fraction=0.25, micro_samples=2)
    assert one == {"parameters": 24 * MiB, "master shard": 6 * MiB, "gradients": 30 * MiB,
                   "optimizer": 12 * MiB, "activations": 8 * MiB}   # 4 units x 1 MiB x 2
    two = zero_memory(p, stage=2, fraction=0.25, micro_samples=2)
    # the shard's gradient, two whole-unit buffers in flight and their two reduce-scatter results
    assert two["gradients"] == 6 * MiB + 16 * MiB + 2 * 2 * MiB and two["parameters"] == 24 * MiB
    # island layout (HSDP): every unit's result waits for its all-reduce across islands, the shard again
    hsdp = zero_memory(p, stage=2, fraction=0.25, micro_samples=2, replicated=True)
    assert hsdp["gradients"] == 6 * MiB + 16 * MiB + 6 * MiB
    three = zero_memory(p, stage=3, fraction=0.25, micro_samples=2, prefetch=1)
    assert three["parameters"] == 3 * 8 * MiB            # prefetch + 1 in flight + the last unit kept
    kept = zero_memory(p, stage=3, fraction=0.25, micro_samples=2, reshard_after_forward=False)
    assert kept["parameters"] == 24 * MiB


def test_fractions_follow_memory_left_after_fixed_needs():
    fixed = sum(zero_memory(profile(0), stage=3, fraction=0.0, micro_samples=1).values())   # 42 MiB
    profiles = [profile(0, budget=fixed + 300 * MiB), profile(1, budget=fixed + 100 * MiB),
                profile(2, budget=fixed - 1)]
    assert memory_fractions(profiles, stage=3, micro_samples=[1, 1, 1]) == pytest.approx([0.75, 0.25, 0.0])
    # an aggregation-only rank (no activations) has more room
    assert memory_fractions([profile(0), profile(1)], stage=3, micro_samples=[4, 0])[1] > 0.5


def test_check_names_the_rank_and_categories():
    plan = Plan.from_shares([0.5, 0.5], 4, 16, name="z")
    for r, f in zip(plan.ranks, [0.9, 0.1]):
        r.zero_stage, r.shard_fraction = 3, f
    small = [profile(0, budget=100 * MiB), profile(1, budget=1 << 30)]
    with pytest.raises(ValueError, match=r"rank 0 \(A100\) would need 148\.8 MiB under ZeRO-3 with shard fraction "
                                         r"0\.900 \(parameters 24\.0, master shard 21\.6, .*budget is 100\.0 MiB"):
        check_zero_fits(plan, small, ["A100", "V100"])
    check_zero_fits(plan, [profile(0, budget=1 << 30)] * 2, ["A100", "V100"])


def test_the_check_counts_results_waiting_for_the_islands_all_reduce():
    plan = Plan.from_shares([0.25] * 4, 4, 16, name="hsdp")
    for r, island in zip(plan.ranks, "aabb"):
        r.zero_stage, r.shard_fraction, r.island = 2, 0.5, island
    small = [profile(k, budget=10 * MiB) for k in range(4)]
    assert not is_replicated(plan)   # flat layout: one shard group
    with pytest.raises(ValueError, match=r"gradients 36\.0,"):   # 12 + two 8 MiB buffers + two 4 MiB results
        check_zero_fits(plan, small, ["A100"] * 4)
    plan.dp_group().zero_layout = "island"
    assert is_replicated(plan)
    with pytest.raises(ValueError, match=r"gradients 40\.0,"):   # every unit's result: 12 more
        check_zero_fits(plan, small, ["A100"] * 4)


def test_apply_zero_auto_equal_uniform():
    v = view([1.0, 1.0, 0.5], budget=1 << 30)
    v.profiles[2].memory_budget_bytes = 300 * MiB
    plan = Plan.from_shares([0.4, 0.4, 0.2], 10, 16, name="auto")
    apply_zero(plan, v, 3, "auto", layout="flat", prefetch=2)
    fractions = [r.shard_fraction for r in plan.ranks]
    assert sum(fractions) == pytest.approx(1.0, abs=1e-9) and fractions[2] < fractions[0] == fractions[1]
    assert plan.groups[0].prefetch == 2 and plan.predicted_step_s > 0 and "ZeRO-3 predicted" in plan.notes[-1]
    uniform = Plan.uniform(3, 9, 16)
    apply_zero(uniform, v, 3, "uniform")
    assert uniform.backend == "fsdp2-gloo" and all(r.shard_fraction is None for r in uniform.ranks)
    uniform1 = Plan.uniform(3, 9, 16)
    apply_zero(uniform1, v, 1, "uniform")
    assert uniform1.backend == "ddp-gloo" and uniform1.validate()


def test_cost_model_prefetch_hides_gathers():
    v = view([1.0, 1.0], allreduce=lambda n: 0.002 + n / 2e8)
    plans = {}
    for k in (0, 2):
        plan = Plan.from_shares([0.5, 0.5], 4, 16)
        for r in plan.ranks:
            r.zero_stage = 3
        plan.groups[0].prefetch = k
        plans[k] = zero_step_s(v, plan)[0]
    compute = sum(l.fwd_s + l.bwd_s for l in v.profiles[0].layers) * 2   # 2 samples, profile at 1
    assert compute < plans[2] < plans[0]


def test_zero_pins():
    assert parse_entry("uniform@zero=3") == ("uniform", {"zero": "3"})
    assert parse_entry("auto@zero=2@prefetch=0") == ("auto", {"zero": "2", "prefetch": "0"})
    with pytest.raises(ValueError, match="zero must be 0, 1, 2 or 3, got '4'"):
        parse_entry("auto@zero=4")
    with pytest.raises(ValueError, match="pins other than zero and the pipeline.s apply to auto and equal only"):
        parse_entry("uniform@prefetch=2")


def test_auto_layout_takes_islands_when_the_link_between_them_is_weak():
    """ZeRO-3 without prefetch (every gather exposed).  The island layout keeps the gathers inside the
    islands but all-reduces every position's shard across them (the whole unit crosses, twice the flat
    reduce-scatter's half), so it wins only where the gathers it saves are exposed; with gathers hidden
    behind compute the flat layout is right even on a weak link (checked too)."""
    from hcomm.parallel.cluster import ClusterView

    slow, fast = (lambda n: 0.001 + n / 1e7), (lambda n: 0.0001 + n / 1e9)
    profiles = [profile(r, budget=1 << 30) for r in range(4)]
    islands = [[0, 1], [2, 3]]

    def make(global_link):
        return ClusterView(["X"] * 4, islands, profiles, global_link, [fast, fast], [0.0] * 4, None, ["a", "b"])

    for link, want in ((slow, "island"), (fast, "flat")):
        plan = Plan.from_shares([0.25] * 4, 8, 16, name="auto")
        apply_zero(plan, make(link), 3, "auto", prefetch=0)
        assert plan.dp_group().zero_layout == want
        assert any(n.startswith("beat ZeRO layout") for n in plan.notes)
        if want == "island":   # positions aligned across islands, summing to 1 inside each
            f = [r.shard_fraction for r in plan.ranks]
            assert f[0] == f[2] and f[1] == f[3] and f[0] + f[1] == pytest.approx(1.0)
    hidden = Plan.from_shares([0.25] * 4, 8, 16, name="auto")
    apply_zero(hidden, make(slow), 1, "auto")   # ZeRO-1 gathers once, ahead of the forward
    assert hidden.dp_group().zero_layout == "flat"
