"""``hcomm.parallel.simulate``: one model for every plan.

1. Hand-computed step times and memory on small cases (data parallelism, a 2-stage GPipe pipeline,
   a TP pair).
2. Every builder's prediction equals the simulator's for the plan it returns (data parallelism with
   and without an outer sync, ZeRO 1-3, pipelines auto / uniform / interleaved, TP, a pipeline of TP
   groups): the builders choose with the same model the simulator applies to any plan.
No processes.
"""
from __future__ import annotations

import dataclasses

import pytest

from hcomm.parallel import simulate
from hcomm.parallel.cluster import ClusterView
from hcomm.parallel.plan import GroupPlan, Plan, RankPlan
from hcomm.parallel.planner.data import plan_data_parallel
from hcomm.parallel.planner.pipeline import boundary_bytes, plan_pipeline
from hcomm.parallel.planner.pipeline_tensor import plan_pipeline_tensor
from hcomm.parallel.planner.tensor import plan_tensor
from hcomm.parallel.planner.zero import apply_zero
from hcomm.parallel.profile import DeviceProfile, LayerCost

MiB = 1 << 20
DIM, SEQ = 32, 16


def profile(rank, speed=1.0, pieces=(0.03, 0.3, 0.3, 0.03, 0.06), budget=8 << 30):
    """Pieces embed, 2 blocks, norm, head; fwd = 1/3 and bwd = 2/3 of each piece's seconds per sample
    at speed 1; 1 MiB of parameters per piece (4 MiB of state with AdamW), 1 MiB of activations."""
    layers = [LayerCost(f"p{i}", s / speed / 3, 2 * s / speed / 3, MiB, MiB, 2 * MiB, MiB)
              for i, s in enumerate(pieces)]
    return DeviceProfile(rank, "X", 1, SEQ, layers, budget, 0, "test", 0.0, "measured")


def allreduce(nbytes):
    return 1e-3 + nbytes / 1e9


def view(speeds, islands=None, optimizer=0.01):
    islands = islands or [list(range(len(speeds)))]
    return ClusterView(["X"] * len(speeds), islands, [profile(r, s) for r, s in enumerate(speeds)], allreduce,
                       [allreduce] * len(islands), [optimizer] * len(speeds), allreduce,
                       [f"i{i}" for i in range(len(islands))], links={"intra": (1e-4, 1e9), "inter": (1e-3, 1e8)},
                       compressed_allreduce_s={"bf16": lambda n: allreduce(n // 2)})


# --- 1. by hand ------------------------------------------------------------------------------------

def test_data_parallel_by_hand():
    """2 ranks, 3 and 1 samples at speed 1 (0.72 s per sample), one 64 MiB bucket: the gradient (5 MiB)
    goes out after the slowest rank's backward ends: 3 x 0.72 + all-reduce + optimizer."""
    v = view([1.0, 1.0])
    plan = Plan.from_shares([0.75, 0.25], 4, SEQ, bucket_bytes=64 * MiB)
    sim = simulate(plan, v, dim=DIM)
    assert sim.kind == "data"
    assert sim.step_s == pytest.approx(3 * 0.72 + allreduce(5 * MiB) + 0.01)
    # state 5 x 4 MiB + activations 5 pieces x 1 MiB per sample, all samples at once (micro_batch 0)
    assert sim.memory_bytes == [20 * MiB + 3 * 5 * MiB, 20 * MiB + 1 * 5 * MiB]
    assert sim.fits


def test_buckets_beside_backward_pay_the_measured_slowdown_by_hand():
    """The same 3 + 1 samples in 1 MiB buckets (one per piece, ready as rank 0's backward passes it: 0.84,
    0.90, 1.50, 2.10, 2.16 s), each all-reduce 0.2 s alone.  Without a slowdown the buckets end at 2.50.

    Measured 3x slower beside every rank's computation; rank 1 (one sample) is done at 0.72 s, before the
    first bucket, so from then only rank 0 presses on the CPU.  Equal weights (no shares measured): 1 +
    (3 - 1) / 2 = 2x until rank 0 ends at 2.16 s: 0.84-1.24, 1.24-1.64, 1.64-2.04, then the fourth from
    2.10 does 0.03 s of its work by 2.16 and the rest alone (2.33), the fifth 2.53.  Rank 0 holding 3/4
    of the measured shares: 2.5x, 0.84-1.34, 1.34-1.84, then 1.84-2.16 does 0.128 s of the third, the
    rest alone (2.232), 2.432, 2.632.  + optimizer."""
    v = view([1.0, 1.0])
    v.allreduce_s = lambda nbytes: 0.2
    plan = Plan.from_shares([0.75, 0.25], 4, SEQ, bucket_bytes=MiB)
    assert simulate(plan, v, dim=DIM).step_s == pytest.approx(2.50 + 0.01)
    v.overlap_slowdown = 3.0
    assert simulate(plan, v, dim=DIM).step_s == pytest.approx(2.53 + 0.01)
    v.cpu_share = [0.75, 0.25]
    assert simulate(plan, v, dim=DIM).step_s == pytest.approx(2.632 + 0.01)


def test_the_slowdown_beside_computation_follows_the_ranks_still_computing():
    """``cost.slowdown_phases``: per rank's end, the slowdown scaled by the weight still computing (a rank
    with nothing to compute never counts); ``cost.beside_phases`` walks them."""
    from hcomm.parallel.planner.cost import beside_phases, slowdown_phases

    # ranks end at 0.5, 0 (no samples), 1.0, 1.0 with weights 1, 1, 2, 0 of 4: 3 of 4 compute to 0.5, 2 to 1.0
    assert slowdown_phases([0.5, 0.0, 1.0, 1.0], 3.0, [1, 1, 2, 0]) == [(0.5, 2.5), (1.0, 2.0)]
    assert slowdown_phases([0.5, 1.0], 1.0) == [] and slowdown_phases([0.5, 1.0], 3.0) == [(0.5, 3.0), (1.0, 2.0)]
    # 0.2 s of work from 0: 0.1 s at 3x does 1/30, 0.2 s at 2x does 0.1, the last 1/15 alone: ends at 0.3667
    assert beside_phases(0.2, 0.0, [(0.1, 3.0), (0.3, 2.0)]) == pytest.approx(0.3 + 0.2 - 0.1 / 3 - 0.1)
    assert beside_phases(0.2, 0.4, [(0.1, 3.0), (0.3, 2.0)]) == pytest.approx(0.2)   # after: alone
    assert beside_phases(0.03, 0.0, [(0.1, 3.0)]) == pytest.approx(0.09)               # inside one phase


@pytest.mark.parametrize("slowdown", [1.0, 2.5])
def test_gpipe_two_stages_one_micro_batch_by_hand(slowdown):
    """Stage 0 = pieces [0, 2) on rank 0, stage 1 = [2, 5) on rank 1, one sample: forward 0.11 then
    send then 0.13, backward 0.26 then send then 0.22; a send is 1e-4 s + 2 KiB / 1e9 (intra link).
    Each of the four actions also spends the host time of the one message it sends or receives: the
    measured host line of the intra tier (2e-5 s + bytes / 4e9) for it, times the slowdown beside
    computation."""
    v = view([1.0, 1.0])
    v.overlap_slowdown = slowdown
    v.links["host@intra"] = (2e-5, 4e9)
    ranks = [RankPlan(0, 1.0, stage=0, layers=(0, 2)), RankPlan(1, 0.0, stage=1, layers=(2, 5))]
    groups = [GroupPlan("dp", [0, 1]), GroupPlan("pp:0", [0, 1], micro_batches=1, schedule="gpipe", cuts=[0, 2, 5])]
    plan = Plan(1, SEQ, ranks, groups).validate()
    sim = simulate(plan, v, dim=DIM)
    send = 1e-4 + boundary_bytes(DIM, SEQ) / 1e9
    f0, f1, b0, b1 = 0.33 / 3, 0.39 / 3, 0.66 / 3, 0.78 / 3
    # one replica: no stage sync; the optimizer on the largest stage's share of the parameters (3/5)
    host = (2e-5 + boundary_bytes(DIM, SEQ) / 4e9) * slowdown
    assert sim.step_s == pytest.approx(f0 + send + f1 + b1 + send + b0 + 4 * host + 0.01 * 3 / 5)
    # each end at its own host's pace (``cpu_share``): rank 1 gets a quarter of a core, so its two ends
    # (F1 receives, B1 sends) take 4x as long, rank 0's two stay
    v.cpu_share = [1.0, 0.25]
    assert simulate(plan, v, dim=DIM).step_s == pytest.approx(f0 + send + f1 + b1 + send + b0 + (2 + 2 * 4) * host
                                                              + 0.01 * 3 / 5)
    v.cpu_share = []
    assert sim.kind == "pipeline"
    assert sim.memory_bytes[0] == 2 * 4 * MiB + 2 * MiB and sim.memory_bytes[1] == 3 * 4 * MiB + 3 * MiB


def test_tensor_pair_by_hand():
    """One TP group of 2 at speeds 1 and 0.5 with fractions 2/3 and 1/3 on 3 rows: each member computes
    2/3 x 3 x 0.72 s; 2 all-reduces forward and 2 backward per block, 1 for the embedding and 1 for the
    head, each of 3 x 16 x 32 x 4 bytes, and the loss's 3 per-token sums of 3 x 16 x 4 bytes; no gradient
    sync (one group); the optimizer on 2/3.  With fixed parts measured, each member runs them whole and
    only the rest shrinks with its fraction."""
    v = view([1.0, 0.5])
    ranks = [RankPlan(0, 1.0, tp_group=0, tp_fraction=2 / 3), RankPlan(1, 0.0, tp_group=0, tp_fraction=1 / 3)]
    plan = Plan(3, SEQ, ranks, [GroupPlan("dp", [0, 1]), GroupPlan("tp:0", [0, 1])]).validate()
    sim = simulate(plan, v, dim=DIM)
    comm = (4 * 2 + 2) * allreduce(3 * SEQ * DIM * 4) + 3 * allreduce(3 * SEQ * 4)
    assert sim.step_s == pytest.approx(2 / 3 * 3 * 0.72 + comm + 0.01 * 2 / 3)
    assert sim.memory_bytes == [int(20 * MiB * 2 / 3) + 15 * MiB, int(20 * MiB / 3) + 15 * MiB]
    # 0.06 s of each rank's whole-model seconds at its micro-batch fixed (rank 1's 0.12 s at half speed):
    # rank 0 runs 0.06 + (0.72 - 0.06) x 3 x 2/3, rank 1 0.12 + (1.44 - 0.12) x 3 x 1/3 -- rank 1 is slower
    for r, fixed in ((0, 0.06), (1, 0.12)):
        layers = v.profiles[r].layers
        per_piece = fixed / len(layers) / 3   # a third forward, two thirds backward
        v.profiles[r].layers = [dataclasses.replace(c, fwd_fixed_s=per_piece, bwd_fixed_s=2 * per_piece)
                                for c in layers]
    sim = simulate(plan, v, dim=DIM)
    assert sim.step_s == pytest.approx(0.12 + (1.44 - 0.12) * 3 / 3 + comm + 0.01 * 2 / 3)
    # members that do not arrive together (a measured 4 ms per meeting): 4 per block, the embedding's,
    # the head's and the loss's three sums back to back as one -- 11 meetings on 2 blocks
    v.island_meeting_s = [4e-3]
    assert simulate(plan, v, dim=DIM).step_s == pytest.approx(sim.step_s + 11 * 4e-3)


def test_tensor_groups_sync_beside_the_backward_by_hand():
    """Two TP pairs [0, 1] and [2, 3] at speed 1, halves, 2 rows each; 1 MiB of gradient per piece.  In 1 MiB
    buckets each piece's gradient goes out when its backward ends in both groups (the ranks of each
    position reduce their half, 0.5 MiB, side by side on the island's curve) and only the embedding's, last
    in backward, is left after the computation; in one bucket the whole sync is; beside the computation a
    bucket runs ``overlap_slowdown`` times slower (``cost.beside_compute``)."""
    v = view([1.0] * 4)
    ranks = [RankPlan(r, 0.5 if r in (0, 2) else 0.0, tp_group=r // 2, tp_fraction=0.5) for r in range(4)]

    def plan(bucket_bytes):
        return Plan(4, SEQ, ranks, [GroupPlan("dp", [0, 1, 2, 3], bucket_bytes=bucket_bytes),
                                    GroupPlan("tp:0", [0, 1]), GroupPlan("tp:1", [2, 3])]).validate()

    def backward_ends(curve):   # (the TP all-reduces run on the island's curve too)
        big, loss = curve(2 * SEQ * DIM * 4), 3 * curve(2 * SEQ * 4)
        # each member: 2 rows x half of (fwd 1/3, bwd 2/3 of 0.03, 0.3, 0.3, 0.03, 0.06 s per row)
        head = 0.01 + big + 2 * (0.1 + 2 * big) + 0.01 + 0.02 + loss + 0.04 + big
        ready = [head, head + 0.02, head + 0.22 + 2 * big, head + 0.42 + 4 * big, head + 0.44 + 4 * big]
        assert ready[-1] == pytest.approx(0.72 + 10 * big + loss)
        return ready       # head, norm, block 1, block 0, embedding

    busy, opt = backward_ends(allreduce)[-1], 0.01 * 0.5
    assert simulate(plan(MiB), v, dim=DIM).step_s == pytest.approx(busy + allreduce(MiB // 2) + opt)
    assert simulate(plan(64 * MiB), v, dim=DIM).step_s == pytest.approx(busy + allreduce(5 * MiB // 2) + opt)

    slow = lambda n: 1e-3 + n / 1e7   # noqa: E731  (53 ms a bucket: longer than the gaps between pieces)
    v.island_allreduce_s, v.overlap_slowdown = [slow], 2.0
    ready = backward_ends(slow)
    busy, t, end = ready[-1], slow(MiB // 2), 0.0
    for r in ready:
        start = max(r, end)
        end = start + (2 * t if start + 2 * t <= busy else (busy - start) + (t - (busy - start) / 2)
                       if start < busy else t)
    assert end > busy + t   # the queue the slowed buckets left reaches past the computation
    assert simulate(plan(MiB), v, dim=DIM).step_s == pytest.approx(end + opt)


def test_each_islands_own_uplink_by_hand():
    """Islands {0, 1}, {2}, {3} with their own uplinks measured (``inter@<island>``: 400, 200 and 100 MB/s):
    a transfer between two islands runs at the slower uplink; two groups reducing at once, [0, 2] with
    3 MiB and [1, 3] with 1 MiB, load island 0's uplink with 4 MiB, island 1's with 3 and island 2's with 1,
    and each hop of a two-rank ring moves half of the busier share for its two uplinks.  Without the
    islands' own figures: the slowest pair's link for every hop, at the busiest uplink's load."""
    from hcomm.parallel.planner.cost import side_by_side_allreduce_s

    v = view([1.0] * 4, islands=[[0, 1], [2], [3]])
    own = {"inter@0": (1e-3, 4e8), "inter@1": (1e-3, 2e8), "inter@2": (2e-3, 1e8)}
    slowest = dict(v.links)
    v.links = {**slowest, **own}
    assert v.p2p_s(0, 2, MiB) == pytest.approx(1e-3 + MiB / 2e8)
    assert v.p2p_s(2, 3, MiB) == pytest.approx(2e-3 + MiB / 1e8)
    assert v.p2p_s(0, 1, MiB) == pytest.approx(1e-4 + MiB / 1e9)   # inside island 0
    jobs = [([0, 2], 3 * MiB), ([1, 3], MiB)]
    first = 2 * (1e-3 + max(4 * MiB / 2 / 4e8, 3 * MiB / 2 / 2e8))
    second = 2 * (2e-3 + max(4 * MiB / 2 / 4e8, MiB / 2 / 1e8))
    assert side_by_side_allreduce_s(v, jobs) == pytest.approx(max(first, second))
    v.links = slowest
    assert side_by_side_allreduce_s(v, jobs) == pytest.approx(2 * (1e-3 + 4 * MiB / 2 / 1e8))


def test_side_by_side_syncs_share_the_uplink_by_hand():
    """Two islands {0, 1} and {2, 3}.  Groups that span them push their bytes through the same uplinks at
    once: two of 3 and 5 MiB each pay a ring on the links (a group of some ranks of several islands) at
    the 8 MiB crossing together; a group of every rank pays the whole group's curve; groups inside an
    island pay their own island's curve at their own bytes; the step waits for the slowest."""
    from hcomm.parallel.planner.cost import group_allreduce_s, side_by_side_allreduce_s

    v = view([1.0] * 4, islands=[[0, 1], [2, 3]])
    v.island_allreduce_s = [lambda n: n / 1e9, lambda n: 2 * n / 1e9]
    across = side_by_side_allreduce_s(v, [([0, 2], 3 * MiB), ([1, 3], 5 * MiB)])
    assert across == pytest.approx(2 * (1e-3 + 4 * MiB / 1e8))   # a ring of 2 on the inter link, 8 MiB
    inside = side_by_side_allreduce_s(v, [([0, 1], 3 * MiB), ([2, 3], 5 * MiB)])
    assert inside == pytest.approx(2 * 5 * MiB / 1e9)
    # groups of some ranks of both islands: a ring on the inter link (1e-3 s + bytes / 1e8), 2 steps of
    # half the bytes that cross together
    v6 = view([1.0] * 6, islands=[[0, 1, 2], [3, 4, 5]])
    pairs = side_by_side_allreduce_s(v6, [([0, 3], 3 * MiB), ([1, 4], 5 * MiB), ([2, 5], 0)])
    assert pairs == pytest.approx(2 * (1e-3 + 4 * MiB / 1e8))
    assert group_allreduce_s(v6, [0, 1, 3], 3 * MiB) == pytest.approx(4 * (1e-3 + MiB / 1e8))
    assert group_allreduce_s(v6, list(range(6)), 3 * MiB) == pytest.approx(allreduce(3 * MiB))
    # a TP pair per island, 2 groups: each position's ranks span the islands; fractions 0.75 / 0.25 of
    # the 5 MiB gradient cross together, 5 MiB in all
    ranks = [RankPlan(0, 0.5, tp_group=0, tp_fraction=0.75), RankPlan(1, 0.0, tp_group=0, tp_fraction=0.25),
             RankPlan(2, 0.5, tp_group=1, tp_fraction=0.75), RankPlan(3, 0.0, tp_group=1, tp_fraction=0.25)]
    plan = Plan(2, SEQ, ranks, [GroupPlan("dp", [0, 1, 2, 3]), GroupPlan("tp:0", [0, 1]),
                                GroupPlan("tp:1", [2, 3])]).validate()
    sim = simulate(plan, v, dim=DIM)
    tp_calls = (4 * 2 + 2)
    sync = 2 * (1e-3 + 2.5 * MiB / 1e8)
    assert sim.step_s == pytest.approx(0.75 * 0.72 + tp_calls * 1 * SEQ * DIM * 4 * 2 / 1e9 + sync + 0.01 * 0.75)


def test_pipeline_transfers_across_islands_share_the_uplinks():
    """Inside an island a transfer has its pair's link; across, the islands' uplinks (out of the sender's,
    into the receiver's), which the schedule's transfers share.  Replicas side by side share them too:
    no step ends before the busiest uplink has carried every replica's bytes (``uplink_floor_s``)."""
    from hcomm.parallel.pipeline.partition import evaluate
    from hcomm.parallel.planner.pipeline import _Replica
    from hcomm.parallel.planner.pipeline_step import transfer_costs, uplink_floor_s

    v = view([1.0, 1.0, 1.0, 1.0], islands=[[0, 1], [2, 3]])
    assert v.transfer_links(0, 1) == ((0, 1),) and v.transfer_links(1, 0) == ((1, 0),)
    assert v.transfer_links(0, 2) == (("out", 0), ("in", 1)) and v.transfer_links(3, 1) == (("out", 1), ("in", 0))
    assert transfer_costs(v) == dict(link_s=v.p2p_s, host_s=v.p2p_host_s, links_of=v.transfer_links)
    # Two replicas [0, 2] and [1, 3] (stage 0 in island 0), 1F1B, 4 micro-batches of 2 samples of 1 MB:
    # each replica sends 4 x 2 MB out of island 0 (activations) and 4 x 2 MB out of island 1 (gradients);
    # at 100 MB/s (latency left out: the floor is occupancy) each uplink carries 2 x 8 MB = 0.16 s.
    boundary = 10**6
    replicas = []
    for ranks in ([0, 2], [1, 3]):
        part = evaluate([v.profiles[r] for r in ranks], [0, 2, 5], micro_batches=4, micro_batch=2,
                        boundary_bytes=boundary, **transfer_costs(v))
        replicas.append(_Replica(ranks, 8, part, ranks))
    assert uplink_floor_s(v, replicas, boundary) == pytest.approx(0.16, rel=1e-12)
    assert uplink_floor_s(v, replicas[:1], boundary) == pytest.approx(0.08, rel=1e-12)
    inside = [_Replica(r, 8, evaluate([v.profiles[x] for x in r], [0, 2, 5], micro_batches=4, micro_batch=2,
                                      boundary_bytes=boundary, **transfer_costs(v)), r) for r in ([0, 1], [2, 3])]
    assert uplink_floor_s(v, inside, boundary) == 0.0


def test_a_plan_that_does_not_fit_says_which_ranks():
    v = view([1.0, 1.0])
    v.profiles[1] = profile(1, budget=30 * MiB - 1)   # needs 20 MiB of state + 2 samples x 5 MiB
    sim = simulate(Plan.from_shares([0.5, 0.5], 4, SEQ), v, dim=DIM)
    assert not sim.fits and sim.over_budget() == [1]


# --- 2. the builders predict what the simulator says ----------------------------------------------------

def _same(plan, v):
    sim = simulate(plan, v, dim=DIM)
    assert sim.step_s == pytest.approx(plan.predicted_step_s, rel=1e-9), (plan.name, sim.account)
    return sim


@pytest.mark.parametrize("sync_every, compression", [(1, "none"), (4, "none"), (1, "bf16")])
def test_data_parallel_builder(sync_every, compression):
    v = view([1.0, 0.5, 0.5], islands=[[0], [1, 2]])
    plan, _ = plan_data_parallel(v, 12, SEQ, sync_every=sync_every, compression=compression)
    _same(plan, v)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_builder(stage):
    v = view([1.0, 0.5, 0.5, 1.0], islands=[[0, 1], [2, 3]])
    plan, _ = plan_data_parallel(v, 8, SEQ, zero_stage=stage)
    apply_zero(plan, v, stage, "auto")
    assert _same(plan, v).kind == "zero"


@pytest.mark.parametrize("split, schedule", [("auto", None), ("uniform", None), ("auto", "interleaved-1f1b"),
                                             ("parameters", "gpipe")])
def test_pipeline_builder(split, schedule):
    v = view([1.0, 0.5, 1.0, 0.5], islands=[[0, 1], [2, 3]])
    plan = plan_pipeline(v, 8, SEQ, stages=2, boundary=boundary_bytes(DIM, SEQ), split=split, schedule=schedule)
    assert _same(plan, v).kind == "pipeline"


@pytest.mark.parametrize("split", ["auto", "uniform"])
def test_tensor_builder(split):
    v = view([1.0, 0.5, 1.0, 0.5])
    plan = plan_tensor(v, 8, SEQ, tp=2, dim=DIM, n_layers=2, split=split)
    assert _same(plan, v).kind == "tensor"


@pytest.mark.parametrize("split", ["auto", "uniform"])
def test_pipeline_of_tensor_groups_builder(split):
    v = view([1.0, 1.0, 0.5, 0.5, 1.0, 1.0, 0.5, 0.5], islands=[[0, 1, 2, 3], [4, 5, 6, 7]])
    plan = plan_pipeline_tensor(v, 8, SEQ, stages=2, tp=2, dim=DIM, boundary=boundary_bytes(DIM, SEQ), split=split)
    assert _same(plan, v).kind == "pipeline+tensor"
