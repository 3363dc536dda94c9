"""New TP fractions mid-run (``tensor.reshard``): the state is put together and cut again, so training
goes on as if the run had started with the new split.

On a pool of 4 ranks (the 9-piece model of test_pipeline_runtime.py): TP groups [0, 1] and [2, 3] split
0.6 / 0.4 with 4 rows each for 3 steps, then groups [1, 0] and [2, 3] (rank 1 first: the members
swap shards) split 0.75 / 0.25 with 5 and 3 rows for 3 more.  Against one process on the whole
batches, with test_pipeline_recut.py's bounds (SGD with momentum: 2e-5 on parameters, 1e-5 on
losses; AdamW: 1e-4 on losses): a moment cut wrongly or lost (zeros) moves the parameters by about
lr x its size, far beyond them.
"""
from __future__ import annotations

import pytest

from hcomm.parallel.plan import GroupPlan, Plan, RankPlan
from tests.parallel import recut_cases
from tests.parallel.test_pipeline_recut import BATCH, STEPS, SWITCH, _check


def tp_plan(groups, fractions, rows) -> Plan:
    ranks = [RankPlan(r, 0.0) for r in range(4)]
    for i, (g, n) in enumerate(zip(groups, rows)):
        for pos, r in enumerate(g):
            ranks[r].tp_group, ranks[r].tp_fraction = i, fractions[pos]
        ranks[g[0]].batch_share = n / BATCH
    return Plan(BATCH, 16, ranks, [GroupPlan("dp", [0, 1, 2, 3])] +
                [GroupPlan(f"tp:{i}", list(g)) for i, g in enumerate(groups)]).validate(4)


A = tp_plan([[0, 1], [2, 3]], [0.6, 0.4], [4, 4])
B = tp_plan([[1, 0], [2, 3]], [0.75, 0.25], [5, 3])


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_new_fractions_and_member_order_train_the_single_process_run(pool4, kind):
    results = pool4.run(recut_cases.case_restage, A.to_yaml(), B.to_yaml(), STEPS, SWITCH, kind, "reshard")
    _check(results, kind)


@pytest.mark.parametrize("backend", ["hcomm", "gloo"])
def test_shards_are_gathered_as_bytes_exactly(pool4, backend):
    """Every member's shards on every member, values, dtypes and the skeleton as sent: uneven sizes, an
    odd-length bf16 tensor before an fp32 one, a plain value beside them (hcomm's uneven gather, or
    torch's padded list form on another backend)."""
    import torch

    results = pool4.run(recut_cases.case_gather_flat, backend)
    for r in range(4):
        rows = [[float(r + c) for c in range(3)]] * (r + 1)
        expect = {"w": (r, 0, rows, torch.float32), "n": (r, None, [float(k) for k in range(2 * r + 3)], torch.bfloat16),
                  "m": [[-v for v in row] for row in rows], "step": 7 + r}
        for got in results:
            assert got[r] == expect, (r, got[r])


def test_reshard_refuses_a_pipeline(pool4):
    from hcomm.parallel.tensor.reshard import reshard

    fake = type("PM", (), {"pipe": object(), "plan": A})()
    with pytest.raises(ValueError, match="re-sharding moves the TP split of plans of TP groups without a pipeline"):
        reshard(fake, None, A, None, 0.1)


# --- the choice: rows or new shards ----------------------------------------------------------------

def _tp_view(state_mib: float = 1.0, beta: float = 1e9):
    """test_simulate.py's 5-piece profiles on 4 ranks, two islands of an A100-like and a half-speed rank;
    the norm sized for its model of dim 32 (what the simulator reads the hidden size from), every other
    piece ``state_mib`` MiB of parameters (3x with AdamW); links 1e-4 s + bytes / ``beta``."""
    import dataclasses

    from tests.parallel.test_simulate import DIM, view

    v = view([1.0, 0.5, 1.0, 0.5], islands=[[0, 1], [2, 3]])
    big = int(state_mib * 2**20)

    def sized(p):
        layers = [dataclasses.replace(c, param_bytes=4 * DIM if i == 3 else big, grad_bytes=4 * DIM if i == 3 else big,
                                      optim_bytes=8 * DIM if i == 3 else 2 * big) for i, c in enumerate(p.layers)]
        return dataclasses.replace(p, layers=layers)
    return dataclasses.replace(v, profiles=[sized(p) for p in v.profiles],
                               links={"intra": (1e-4, beta), "inter": (1e-4, beta)})


def _make(view, old):
    from hcomm.parallel.planner.tensor import plan_tensor
    from tests.parallel.test_simulate import DIM, SEQ

    return plan_tensor(view, 8, SEQ, tp=2, dim=DIM, n_layers=2, name=old.name)


def test_a_slow_member_gets_a_smaller_shard_when_it_pays_for_the_move():
    """Rank 0 (the full-speed member of group [0, 1], shard 0.67) turns 4x slower.  Moving rows leaves it
    that shard; the planner's call at the drifted speeds puts it second in its group with the smaller
    fraction.  With many steps left that wins; with one step left and a move of minutes, the rows do."""
    from hcomm.parallel import simulate
    from hcomm.parallel.planner.replan_tensor import ROWS, SHARDS, TensorReplanner, reshard_seconds
    from hcomm.parallel.planner.replan import slowed_view

    v = _tp_view()
    before = _make(v, Plan.from_shares([1.0, 0, 0, 0], 8, 16, name="auto@tp=2"))
    before.dp_group().straggler_margin = 0.3
    assert [g.ranks for g in before.tensor_groups()] == [[0, 1], [2, 3]] and before.ranks[0].tp_fraction > 0.5
    after = TensorReplanner(v, _make).replan(before, [4.0, 1.0, 1.0, 1.0], steps_left=100)
    assert after.notes[0].startswith(f"{SHARDS}: at the drifted speeds, for the 100 steps left: {ROWS} "), \
        after.notes[0]
    assert after.ranks[0].tp_fraction < 0.5 and after.tensor_group_of(0).ranks == [1, 0]
    assert after.name == "auto@tp=2" and after.dp_group().straggler_margin == 0.3
    drifted = slowed_view(v, [4.0, 1.0, 1.0, 1.0])
    assert after.predicted_step_s == pytest.approx(simulate(after, drifted).step_s, rel=1e-9)
    # the move by hand: each member of a 0.67 / 0.33 group receives the other's share of 5 pieces of state
    state = 4 * 3 * 2**20 + 3 * 4 * 32
    small = min(before.ranks[0].tp_fraction, before.ranks[1].tp_fraction)
    assert reshard_seconds(drifted, before) == pytest.approx(1e-4 + int((1 - small) * state) / 1e9, rel=1e-12)
    # with a measured host cost of messages (1e-3 s + bytes / 1e8 of a rank's CPU): 6 passes over the
    # state on each member (packing, joining, loading, cutting), the 4x slower rank 0 at a quarter of its speed
    import dataclasses

    hosted = dataclasses.replace(drifted, links=dict(drifted.links, **{"host@intra": (1e-3, 1e8)}))
    assert reshard_seconds(hosted, before, [4.0, 1.0, 1.0, 1.0]) == pytest.approx(
        1e-4 + int((1 - small) * state) / 1e9 + 6 * (1e-3 + state / 1e8) * 4.0, rel=1e-12)

    slow_links = _tp_view(state_mib=256, beta=1e7)   # a move of minutes
    kept = TensorReplanner(slow_links, _make).replan(_make(slow_links, before), [4.0, 1.0, 1.0, 1.0], steps_left=1)
    assert kept.notes[0].startswith(f"{ROWS}: "), kept.notes[0]
    assert [r.tp_fraction for r in kept.ranks] == [r.tp_fraction for r in _make(slow_links, before).ranks]
