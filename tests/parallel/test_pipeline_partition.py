"""Pipeline step-time model and partitioner: hand-computed cases, brute force, every error message."""
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcomm.parallel.pipeline import schedule_cost as sc
from hcomm.parallel.pipeline.costs import PipelineCosts, interchangeable
from hcomm.parallel.pipeline.partition import (evaluate, parameter_cuts, parameter_partition, partition,
                                               uniform_cuts, uniform_partition)
from hcomm.parallel.pipeline.schedule_choice import choose_schedule
from hcomm.parallel.profile import DeviceProfile, LayerCost

MiB = 1 << 20
GiB = 1 << 30
FAST = settings(max_examples=50, deadline=None)


def layer(name, f, b, param=MiB, act=MiB):
    # AdamW in fp32: gradients as large as the parameters, two states -> 4x the parameter bytes in all
    return LayerCost(name, f, b, param, param, 2 * param, act)


def profile(rank, layers, budget=GiB, device="X", micro_batch=1):
    return DeviceProfile(rank, device, micro_batch, 8, list(layers), budget, 0, "test", 0.0, "file")


def same_pieces(rank, n, f=1.0, b=2.0, **kw):
    return profile(rank, [layer(f"p{j}", f, b) for j in range(n)], **kw)


# ---------------------------------------------------------------- the simulator

@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (2, 4), (4, 8), (4, 2), (3, 7)])
def test_equal_stages_give_the_textbook_bubble(schedule, p, m):
    # f = 1, b = 2, free links: (M + p - 1) slots of 3 s, bubble (p-1)/(M+p-1)
    sim = sc.simulate([1.0] * p, [2.0] * p, [0.0] * (p - 1), m, schedule)
    assert sim.step_s == 3 * (m + p - 1)
    assert sim.busy_s == [3.0 * m] * p
    assert sim.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_unequal_two_stages_by_hand():
    # Stage 0: f=1 b=2; stage 1: f=2 b=3; M=3; each transfer 0.5 s.
    # 1F1B, stage 0: F0 [0,1] F1 [1,2] -> stage 1 F0 [1.5,3.5] B0 [3.5,6.5] -> grad at 7 -> stage 0 B0 [7,9]
    # F2 [9,10]; stage 1: F1 [6.5,8.5] B1 [8.5,11.5] (grad at 12), F2 [11.5,13.5] B2 [13.5,16.5] (grad at 17);
    # stage 0: B1 [12,14], B2 [17,19].  Step 19 = stage 1's start (1 + 0.5) + 3 x 5 + back (0.5 + 2).
    f, b = [1.0, 2.0], [2.0, 3.0]
    sim = sc.simulate(f, b, [0.5], 3, "1f1b", timeline=True)
    assert sim.step_s == 19.0
    assert sim.busy_s == [9.0, 15.0] and sim.peak_in_flight == [2, 1]
    assert sim.start_s[sc.Action("B", 0, 0)] == 7.0 and sim.start_s[sc.Action("F", 2, 0)] == 9.0
    assert sim.start_s[sc.Action("F", 2, 1)] == 11.5
    assert sc.step_time(f, b, [0.5], 3, "gpipe") == (19.0, [9.0, 15.0], [3, 3])
    # A 1.5 s link is slower than stage 0's forward: transfers queue on it (FIFO), so F1 arrives at 4.
    # 1F1B: stage 0 waits for B0's gradient (7.5 + 1.5 = 9) before F2, delaying everything: 22.
    # GPipe sends all three forwards first (arriving 2.5, 4, 5.5): stage 1 runs F0-F2 [2.5,8.5],
    # B0-B2 [8.5,17.5], gradients queue back (13, 16, 19), stage 0 B2 [19,21]: 21.
    sim = sc.simulate(f, b, [1.5], 3, "1f1b", timeline=True)
    assert sim.step_s == 22.0 and sim.start_s[sc.Action("F", 1, 1)] == 7.5
    assert sc.step_time(f, b, [1.5], 3, "gpipe")[0] == 21.0


def test_interleaved_equal_chunks_give_the_megatron_bubble():
    # v stages per rank of f=1, b=2: (v*M + p - 1) x 3 s when p divides M (bubble (p-1)/(v*M))
    for p, v, m in [(4, 2, 8), (2, 2, 4), (4, 3, 8), (4, 2, 12)]:
        sim = sc.simulate([1.0] * (p * v), [2.0] * (p * v), [0.0] * (p * v - 1), m, "interleaved-1f1b", v)
        assert sim.step_s == 3 * (v * m + p - 1)


def test_in_flight_counts_match_the_stated_formulas():
    for p in range(1, 6):
        for m in range(1, 10):
            for schedule, v in [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3)]:
                if not sc.allowed_micro_batches(schedule, m, p, v):
                    continue
                orders = sc.action_orders(schedule, p, m, v)
                assert [len(o) for o in orders] == [2 * m * v] * p
                expected = [sc.in_flight_formula(schedule, r, p, m, v) for r in range(p)]
                assert sc.rank_in_flight(orders) == expected, (schedule, p, m, v)
    assert [sc.in_flight_formula("1f1b", s, 4, 8) for s in range(4)] == [4, 3, 2, 1]
    assert [sc.in_flight_formula("1f1b", s, 4, 2) for s in range(4)] == [2, 2, 2, 1]


def test_interleaved_order_is_torchs():
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for p, v, m in [(2, 2, 4), (4, 2, 8), (4, 2, 10), (4, 2, 3), (3, 3, 6), (4, 3, 5)]:
        torch_schedule = object.__new__(schedules.ScheduleInterleaved1F1B)
        rounds = max(1, m // p)
        torch_schedule.__dict__.update(n_local_stages=v, pp_group_size=p, _n_microbatches=m,
                                       number_of_rounds=rounds, microbatches_per_round=m // rounds)
        mine = sc.action_orders("interleaved-1f1b", p, m, v)
        for r in range(p):
            theirs = [("F" if a.computation_type.name == "FORWARD" else "B", a.microbatch_index, a.stage_index)
                      for a in torch_schedule._calculate_single_rank_operations(r) if a is not None]
            assert theirs == [tuple(a) for a in mine[r]], (p, v, m, r)


def test_transfers_between_islands_share_the_uplinks_by_hand():
    """GPipe, 4 one-stage ranks, 3 micro-batches, forward 1 s, backward and gradients free, 10 s per
    activation.  Each ordered pair its own link: stage 2's sends (mb0 at 23 s) never wait -> 54 s.
    Islands [A, B, A, B]: stage 0's and stage 2's sends both cross A -> B, so stage 2's mb0 (ready at
    23 s) waits for stage 0's mb2 (on the uplink 21-31 s): 31-41, 41-51, 51-61; the last forward ends at 62."""
    fwd, bwd, send, grad = [1.0] * 4, [0.0] * 4, [10.0] * 3, [0.0] * 3
    assert sc.simulate(fwd, bwd, send, 3, "gpipe", 1, grad).step_s == 54.0
    island = "ABAB"

    def uplinks(src, dst):
        return ((src, dst),) if island[src] == island[dst] else (("out", island[src]), ("in", island[dst]))

    sim = sc.simulate(fwd, bwd, send, 3, "gpipe", 1, grad, channels=uplinks, timeline=True)
    assert sim.step_s == 62.0
    assert [sim.start_s[sc.Action("F", m, 3)] for m in range(3)] == [41.0, 51.0, 61.0]
    # the lower bound ignores the sharing and stays below
    assert sc.lower_bound(fwd, bwd, send, 3, "gpipe", 1, grad) <= 54.0


def test_a_remembered_simulation_is_the_simulation():
    """The simulation remembers results for the schedule's own orders (the planner asks again and again):
    a repeat equals a fresh run (the same orders passed explicitly are never remembered), a caller that
    changes what it got back changes nothing remembered, and two channel sharings of the same seconds
    are two results (the ABAB uplinks above: 62 s shared, 54 s a link per pair)."""
    fwd, bwd, send = [1.0, 2.0, 1.5], [2.0, 3.0, 2.5], [0.25, 0.5]
    first = sc.simulate(fwd, bwd, send, 5)
    first.busy_s[0] = -1.0
    again = sc.simulate(fwd, bwd, send, 5)
    fresh = sc.simulate(fwd, bwd, send, 5, orders=sc.action_orders("1f1b", 3, 5))
    assert (again.step_s, again.busy_s, again.peak_in_flight) == (fresh.step_s, fresh.busy_s, fresh.peak_in_flight)
    assert again.orders == fresh.orders == sc.action_orders("1f1b", 3, 5)
    island = "ABAB"

    def uplinks(src, dst):
        return ((src, dst),) if island[src] == island[dst] else (("out", island[src]), ("in", island[dst]))

    gpipe = ([1.0] * 4, [0.0] * 4, [10.0] * 3, 3, "gpipe", 1, [0.0] * 3)
    for _ in range(2):
        assert sc.simulate(*gpipe, channels=uplinks).step_s == 62.0 and sc.simulate(*gpipe).step_s == 54.0


def test_devices_of_different_islands_are_not_interchangeable():
    """Equal devices in islands {0, 1} and {2}: 0 and 1 swap freely, 2 does not (its transfers take
    the uplinks), unless the cost model has no shared links."""
    profiles = [same_pieces(r, 4) for r in range(3)]
    island = {0: 0, 1: 0, 2: 1}
    costs = PipelineCosts(profiles, 2, 1, links_of=lambda a, b: ((a, b),) if island[a] == island[b]
                             else (("out", island[a]), ("in", island[b])))
    assert interchangeable(costs) == [[0, 1], [2]]
    assert interchangeable(PipelineCosts(profiles, 2, 1)) == [[0, 1, 2]]


def test_a_bad_order_is_reported_not_hung():
    orders = [[sc.Action("B", 0, 0), sc.Action("F", 0, 0)], [sc.Action("F", 0, 1), sc.Action("B", 0, 1)]]
    with pytest.raises(ValueError, match="deadlocks: rank 0 at Action.kind='B'"):
        sc.simulate([1.0, 1.0], [1.0, 1.0], [0.0], 1, orders=orders)


@st.composite
def pipelines(draw):
    schedule = draw(st.sampled_from(sc.SCHEDULES))
    v = draw(st.integers(2, 3)) if schedule == "interleaved-1f1b" else 1
    p = draw(st.integers(1, 4))
    m = draw(st.integers(1, 9).filter(lambda m: sc.allowed_micro_batches(schedule, m, p, v)))
    k = p * v
    times = st.floats(0.0, 5.0, allow_nan=False)
    return (draw(st.lists(times, min_size=k, max_size=k)), draw(st.lists(times, min_size=k, max_size=k)),
            draw(st.lists(times, min_size=k - 1, max_size=k - 1)), draw(st.lists(times, min_size=k - 1, max_size=k - 1)),
            m, schedule, v)


@FAST
@given(pipelines())
def test_lower_bound_never_exceeds_the_simulation(case):
    # the partitioner's exactness rests on this: it prunes only with these bounds
    fwd, bwd, send, grad, m, schedule, v = case
    sim = sc.simulate(fwd, bwd, send, m, schedule, v, grad)
    assert sc.lower_bound(fwd, bwd, send, m, schedule, v, grad) <= sim.step_s * (1 + 1e-12) + 1e-12


def test_schedule_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown pipeline schedule 'zb'; supported: gpipe, 1f1b, interleaved-1f1b"):
        sc.check_schedule("zb", 4, 2)
    with pytest.raises(ValueError, match="micro_batches must be >= 1, got 0"):
        sc.check_schedule("1f1b", 0, 2)
    with pytest.raises(ValueError, match=r"cannot run 9 micro-batches: .*max\(1, M // 4\) = 2 rounds.*nearby allowed M: "
                                         r"5, 6, 7, 8, 10, 12"):
        sc.check_schedule("interleaved-1f1b", 9, 4, 2)
    with pytest.raises(ValueError, match="interleaved-1f1b needs virtual_stages >= 2"):
        sc.check_schedule("interleaved-1f1b", 4, 2, 1)
    with pytest.raises(ValueError, match="gpipe runs one stage per rank; virtual_stages must be 1, got 2"):
        sc.check_schedule("gpipe", 4, 2, 2)
    sc.check_schedule("interleaved-1f1b", 10, 4, 2)   # torch's flex rule: 2 rounds of 5
    sc.check_schedule("interleaved-1f1b", 3, 4, 2)    # fewer micro-batches than ranks: 1 round


# ---------------------------------------------------------------- the partitioner against brute force

def brute_force(profiles, **kw):
    """Least simulated step over every device order and every contiguous partition that fits."""
    p, n = len(profiles), len(profiles[0].layers)
    k = p * kw.get("virtual_stages", 1)
    best = math.inf
    for order in itertools.permutations(range(p)):
        for inner in itertools.combinations(range(1, n), k - 1):
            part = evaluate(profiles, [0, *inner, n], order=order, **kw)
            if part.fits:
                best = min(best, part.step_s)
    return best


@st.composite
def clusters(draw, interleaved=False):
    p = draw(st.integers(2, 2) if interleaved else st.integers(1, 3))
    v = 2 if interleaved else 1
    n = draw(st.integers(p * v, p * v + 3))
    schedule = "interleaved-1f1b" if interleaved else draw(st.sampled_from(["gpipe", "1f1b"]))
    m = draw(st.integers(1, 5).filter(lambda m: sc.allowed_micro_batches(schedule, m, p, v)))
    # Multiples of 1/4 keep every sum exact in floating point.  Speeds and budgets are drawn from
    # few values so that identical devices (one class) come up too.
    work = [draw(st.integers(1, 8)) / 4 for _ in range(n)]
    act = [draw(st.integers(0, 3)) * MiB for _ in range(n)]
    profiles = []
    for r in range(p):
        slow, bwd_ratio = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2]))
        budget = draw(st.sampled_from([GiB, 40 * MiB, 24 * MiB]))
        profiles.append(profile(10 + r, [layer(f"p{j}", w * slow, w * slow * bwd_ratio, MiB, act[j])
                                         for j, w in enumerate(work)], budget))
    latency = {(a, b): draw(st.sampled_from([0.0, 0.25, 2.0])) for a in range(10, 10 + p) for b in range(10, 10 + p)}
    per_byte = draw(st.sampled_from([0.0, 0.25]))
    sizes = [draw(st.integers(1, 3)) for _ in range(n - 1)]
    kw = dict(micro_batches=m, micro_batch=1, schedule=schedule, virtual_stages=v, boundary_bytes=sizes,
              link_s=lambda a, b, nbytes: latency[a, b] + per_byte * nbytes)
    if draw(st.booleans()):   # islands whose transfers share the uplinks between them
        island = {r: draw(st.integers(0, 1)) for r in range(10, 10 + p)}
        kw["links_of"] = lambda a, b: ((a, b),) if island[a] == island[b] else (("out", island[a]), ("in", island[b]))
    return profiles, kw


def check_against_brute_force(case):
    profiles, kw = case
    best = brute_force(profiles, **kw)
    if best == math.inf:
        with pytest.raises(ValueError, match="fits memory|the smallest piece"):
            partition(profiles, **kw)
        return
    part = partition(profiles, **kw)
    assert part.exact and part.fits
    assert part.step_s == pytest.approx(best, rel=1e-9, abs=0)
    # and the partition it returns really has that time
    again = evaluate(profiles, part.cuts, order=[[q.rank for q in profiles].index(r) for r in part.ranks], **kw)
    assert again.step_s == part.step_s


@FAST
@given(clusters())
def test_partition_finds_the_brute_force_optimum(case):
    check_against_brute_force(case)


@FAST
@given(clusters(interleaved=True))
def test_interleaved_partition_finds_the_brute_force_optimum(case):
    check_against_brute_force(case)


# ---------------------------------------------------------------- memory, links, baselines

def test_memory_forces_fewer_layers_onto_a_small_stage():
    # 4 pieces of f=1 b=2, each 4 MiB of state and 1 MiB of activations per sample; 1F1B, M=4.
    big = same_pieces(0, 4, device="a100")
    free = partition([big, same_pieces(1, 4)], micro_batches=4, micro_batch=1)
    assert free.cuts == [0, 2, 4] and free.step_s == 30.0         # (M + p - 1) x 6 s
    # 6 MiB holds one piece (4 + 1 in flight at the last stage, 4 + 2 at the first) but never two.
    small = same_pieces(1, 4, budget=6 * MiB, device="v100")
    part = partition([big, small], micro_batches=4, micro_batch=1)
    assert part.cuts == [0, 3, 4] and part.ranks == [0, 1]
    # stage 0 (3 pieces: 9 s a micro-batch) never idles, its gradients come back in time: 4 x 9 s
    assert part.step_s == 36.0 and part.memory_bytes == [18 * MiB, 5 * MiB] and part.fits
    assert part.peak_in_flight == [2, 1] and part.stages[1].state_bytes == 4 * MiB
    assert partition([small, big], micro_batches=4, micro_batch=1).ranks == [0, 1]   # order searched too


def test_device_order_crosses_the_weak_link_once():
    # Four equal devices; ranks 0, 1 share a node, 2, 3 the other; crossing costs 3 s per micro-batch.
    profiles = [same_pieces(r, 4) for r in (0, 2, 1, 3)]

    def link(a, b, nbytes):
        return 0.0 if a // 2 == b // 2 else 3.0

    kw = dict(micro_batches=4, micro_batch=1, boundary_bytes=1, link_s=link)
    listed = evaluate(profiles, [0, 1, 2, 3, 4], **kw)           # crosses three times
    best = partition(profiles, **kw)
    crossings = sum(a // 2 != b // 2 for a, b in zip(best.ranks, best.ranks[1:]))
    assert crossings == 1 and best.exact
    assert best.step_s == brute_force(profiles, **kw) < listed.step_s
    fixed = partition(profiles, order=[0, 1, 2, 3], **kw)         # keeping the listed order
    assert fixed.ranks == [0, 2, 1, 3] and fixed.step_s == listed.step_s


def test_micro_batch_size_scales_the_profile_linearly():
    measured_at_2 = profile(0, [layer("p0", 1.0, 2.0, act=MiB)], micro_batch=2)
    part = evaluate([measured_at_2], [0, 1], micro_batches=3, micro_batch=4)
    assert (part.stages[0].fwd_s, part.stages[0].bwd_s, part.step_s) == (2.0, 4.0, 18.0)
    assert part.memory_bytes == [4 * MiB + 4 * MiB]               # 1F1B's only stage holds 1 micro-batch of 4
    gpipe = evaluate([measured_at_2], [0, 1], micro_batches=3, micro_batch=4, schedule="gpipe")
    assert gpipe.memory_bytes == [4 * MiB + 3 * 4 * MiB]          # GPipe holds all 3


def test_uniform_and_parameter_baselines_on_a_hand_case():
    assert uniform_cuts(7, 2) == [0, 3, 7]        # embed+2 blocks | 2 blocks+norm+head
    assert uniform_cuts(8, 3) == [0, 3, 5, 8]     # 5 blocks: 2, 2, 1 (first stages take the remainder)
    assert uniform_cuts(5, 1) == [0, 5]
    # parameters 10 | 4 4 4 4 | 0 10: the least largest stage is 14, filled front to back
    assert parameter_cuts([10, 4, 4, 4, 4, 0, 10], 3) == [0, 2, 6, 7]
    params = [10, 4, 4, 4, 4, 0, 10]
    profiles = [profile(r, [layer(f"p{j}", 1.0, 1.0, param=m * MiB, act=0) for j, m in enumerate(params)])
                for r in range(3)]
    kw = dict(micro_batches=2, micro_batch=1)
    by_params, uniform = parameter_partition(profiles, **kw), uniform_partition(profiles, **kw)
    # 4 blocks over 3 stages: 2, 1, 1
    assert (by_params.label, by_params.cuts, uniform.label, uniform.cuts) == ("parameters", [0, 2, 6, 7], "uniform", [0, 3, 4, 7])
    assert [s.state_bytes for s in by_params.stages] == [56 * MiB, 48 * MiB, 40 * MiB]
    assert partition(profiles, **kw).step_s <= min(by_params.step_s, uniform.step_s)


def test_partition_is_readable_and_runnable():
    profiles = [same_pieces(3, 5, device="a100"), same_pieces(7, 5, device="v100", f=2.0, b=4.0)]
    part = partition(profiles, micro_batches=4, micro_batch=2, boundary_bytes=1024, link_s=lambda a, b, n: n / 1e6)
    text = str(part)
    assert "pipeline auto: 1f1b, 4 micro-batches of 2" in text and "a100" in text and "v100" in text
    assert part.orders == sc.action_orders("1f1b", 2, 4)
    assert part.layer_ranges() == {st.rank: [(st.first, st.last)] for st in part.stages}
    assert part.lower_bound_s <= part.step_s and part.simulated >= 1


def test_choose_schedule_sweeps_divisors_and_keeps_the_alternatives():
    # 2 equal devices, 6 pieces of f=1 b=2 per sample, 4 MiB of state and 1 MiB of activations per sample each
    profiles = [same_pieces(r, 6, budget=40 * MiB) for r in range(2)]
    choice = choose_schedule(profiles, global_batch=12, max_micro_batches=6)
    assert sorted({t.micro_batches for t in choice.trials}) == [1, 2, 3, 4, 6]    # divisors of 12 up to 6
    assert len(choice.trials) == 5 * len(sc.SCHEDULES)
    assert all(t.micro_batch * t.micro_batches == 12 for t in choice.trials)
    best = choice.best
    assert (best.schedule, best.virtual_stages, best.micro_batches, best.step_s) == ("interleaved-1f1b", 2, 6, 116.0)
    one_f = {t.micro_batches: t.step_s for t in choice.trials if t.schedule == "1f1b"}
    # M=6 (2 samples): 3 pieces a stage, (M + 1) x 18 s.  M=2 (6 samples): 3 pieces with 2 in flight need
    # 12 + 36 MiB at stage 0, so it takes 2 and the last stage 4: 36 s + 2 x 72 s.
    assert one_f[6] == 126.0 and one_f[2] == 180.0
    # GPipe holds every micro-batch: 3 pieces (12 MiB) + 3 MiB x 12 samples > 40 MiB however M splits them
    gpipe = [t for t in choice.trials if t.schedule == "gpipe"]
    assert all(t.partition is None and "fits memory with gpipe" in t.error for t in gpipe)
    assert choice.trials[-1].partition is None and "alternatives:" in str(choice)


# ---------------------------------------------------------------- errors name the problem and the numbers

def test_more_stages_than_pieces():
    with pytest.raises(ValueError, match=r"3 pipeline stages \(3 devices x 1 per device\) but the model has only 2 pieces"):
        partition([same_pieces(r, 2) for r in range(3)], micro_batches=2, micro_batch=1)
    with pytest.raises(ValueError, match=r"4 pipeline stages \(2 devices x 2 per device\) but the model has only 3"):
        partition([same_pieces(r, 3) for r in range(2)], micro_batches=2, micro_batch=1,
                  schedule="interleaved-1f1b", virtual_stages=2)


def test_a_device_that_cannot_hold_one_piece():
    # smallest piece: 4 MiB of state + 1 MiB of activations for 1 micro-batch in flight (the last stage)
    profiles = [same_pieces(0, 3), same_pieces(3, 3, budget=4 * MiB, device="v100")]
    with pytest.raises(ValueError, match=r"stage 1 \(rank 3, v100\): the smallest piece \(p0\) needs 5.0 MiB with 1 "
                                         r"micro-batch\(es\) of 1 in flight, budget 4.0 MiB"):
        partition(profiles, micro_batches=4, micro_batch=1)


def test_no_feasible_partition():
    # each device holds one piece at most (budget 6 MiB) but there are three
    profiles = [same_pieces(r, 3, budget=6 * MiB) for r in range(2)]
    with pytest.raises(ValueError, match=r"no partition of the 3 pieces over 2 stages fits memory with 1f1b, 2 "
                                         r"micro-batches of 1: parameters\+gradients\+AdamW state total 12.0 MiB"):
        partition(profiles, micro_batches=2, micro_batch=1)


def test_bad_arguments():
    two = [same_pieces(r, 8) for r in range(2)]
    four = [same_pieces(r, 8) for r in range(4)]
    with pytest.raises(ValueError, match="micro_batches must be >= 1, got 0"):
        partition(two, micro_batches=0, micro_batch=1)
    with pytest.raises(ValueError, match="unknown pipeline schedule 'zb'"):
        partition(two, micro_batches=2, micro_batch=1, schedule="zb")
    with pytest.raises(ValueError, match=r"interleaved-1f1b on 4 ranks cannot run 9 micro-batches"):
        partition(four, micro_batches=9, micro_batch=1, schedule="interleaved-1f1b", virtual_stages=2)
    with pytest.raises(ValueError, match="micro_batch must be >= 1 sample, got 0"):
        partition(two, micro_batches=2, micro_batch=0)
    with pytest.raises(ValueError, match="limited to 8 devices, got 9: pass order"):
        partition([same_pieces(r, 12) for r in range(9)], micro_batches=2, micro_batch=1)
    with pytest.raises(ValueError, match=r"order must list each of the 2 stage devices \(0..1\) once, got \[1, 1\]"):
        partition(two, micro_batches=2, micro_batch=1, order=[1, 1])
    with pytest.raises(ValueError, match="boundary_bytes: 8 pieces have 7 cuts, got 2 values"):
        partition(two, micro_batches=2, micro_batch=1, boundary_bytes=[1, 2])
    with pytest.raises(ValueError, match=r"rank 1 \(X\) profiles pieces \['p0'\]"):
        partition([same_pieces(0, 2), same_pieces(1, 1)], micro_batches=2, micro_batch=1)
    with pytest.raises(ValueError, match=r"cuts must rise from 0 to 8 in 2 non-empty stages, got \[0, 0, 8\]"):
        evaluate(two, [0, 0, 8], micro_batches=2, micro_batch=1)
    with pytest.raises(ValueError, match="global_batch must be >= 1, got 0"):
        choose_schedule(two, global_batch=0)
