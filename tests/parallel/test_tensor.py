"""Non-uniform tensor parallelism: split sizes, equivalence with the unsharded model, bad input, plan
rules, the planner, and one ``hcomm train --local`` run.

1. ``split_sizes``: exact splits, the invariants (sum, units, at least one unit each; within one unit
   of the ideal when every ideal is at least one unit) as a property, and the errors.

2. Equivalence, fp32, on the 3-worker pool of ``tensor_cases`` (2-rank cases on its gloo group of
   ranks [0, 2), 3-rank cases on all three; one 3-rank case also on the hcomm group the trainer uses).
   The shards compute the same function as the unsharded model; only the order of some sums
   changes: the row-parallel products (``wo`` over K = 128 input features, ``w2`` over K = 352) and
   the head's log-sum-exp over V = 97 rows are summed per shard and then across the group.  One
   such regrouped sum of K terms is off by at most gamma_K = K*u = 2.1e-5 (u = 2**-24) of the sum
   of its terms' magnitudes, typically sqrt(K)*u = 1.1e-6.  We assert:
   - losses: 1e-5 relative (a mean of B*S = 64 token terms near 4.6; observed <= 1.1e-7);
   - step-0 gradients: |g - g_ref| <= 2e-5 * max|g_ref| per tensor (gamma_K of the longest
     reduction at the tensor's scale; observed <= 1.1e-6);
   - parameters after 3 SGD steps (lr 0.5): 2e-5 absolute, since |dp| <= T * lr * |dg|
     = 3 * 0.5 * 2e-5 * max|g| with max|g| < 0.14 here = 4e-6, and later steps see the
     perturbed weights (the data-parallel tests' bound; observed <= 7.2e-7);
   - replicated tensors (the norms) and every rank's loss: bitwise equal across the group (their
     inputs come out of the same all-reduce).
   ``vocab_parallel_cross_entropy`` against ``F.cross_entropy`` on the gathered logits: a softmax
   entry is exp(x - max) / (sum of V = 97 terms, regrouped) -> V*u = 5.8e-6 relative; gradients are
   at most 1/N (mean) or the loss weight (sum): atol 1e-5 * that weight (observed 1.6e-7 relative).
   Losses: 1e-6 relative (observed 7e-8).

3. Refused input: ``tensor_parallelize`` (in the pool), the plan rules, the planner, the CLI.

4. ``hcomm train --local`` on 4 unshaped local ranks with ``--tp 2``: auto, uniform, ``auto@tp=4`` and
   the DDP reference ``uniform@tp=1``; per-step global losses and the eval loss within 1e-4 relative
   of the reference (fp32 throughout: TP only regroups sums, ~1e-7 relative, and AdamW's first steps
   are sign-like, so that does not grow over 3 steps; tests/parallel/test_pipeline_train.py's bound).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hcomm.parallel.plan import GroupPlan, Plan, PlanError, RankPlan
from hcomm.parallel.planner.tensor import plan_tensor
from hcomm.parallel.tensor.split import check_fractions, offsets, split_sizes
from tests.helpers.mp import Pool
from tests.parallel import tensor_cases as tc
from tests.parallel.test_plan_pipeline import view
from tests.parallel.train_runs import assert_reference_losses, train_local

LOSS_RTOL = 1e-5
GRAD_REL = 2e-5
PARAM_ATOL = 2e-5
CE_LOSS_RTOL = 1e-6
CE_GRAD = 1e-5


# ------------------------------------------------------------------ 1. split sizes

@pytest.mark.parametrize("total, fractions, unit, want", [
    (6, [2 / 3, 1 / 3], 1, [4, 2]),
    (1024, [2 / 3, 1 / 3], 32, [672, 352]),
    (1024, [2 / 3, 1 / 3], 64, [704, 320]),
    (8, [1 / 8, 2 / 8, 5 / 8], 1, [1, 2, 5]),
    (352, [0.5, 0.5], 32, [192, 160]),            # 11 units: the odd one to rank 0 (ties to the lower rank)
    (352, [1 / 8, 2 / 8, 5 / 8], 32, [32, 96, 224]),
    (97, [2 / 3, 1 / 3], 1, [65, 32]),
    (4, [0.25] * 4, 1, [1, 1, 1, 1]),
    (5, [0.999, 0.001], 1, [4, 1]),               # a tiny fraction still holds one unit
    # floors of one unit over-subscribe: taken back from the largest, never below one unit
    (4, [0.9, 0.05, 0.05], 1, [2, 1, 1]),
    (3, [0.98, 0.01, 0.01], 1, [1, 1, 1]),
    (5, [0.05, 0.05, 0.9], 1, [1, 1, 3]),
])
def test_split_sizes_exact(total, fractions, unit, want):
    assert split_sizes(total, fractions, unit) == want


@st.composite
def splits(draw):
    ranks = draw(st.integers(1, 6))
    weights = draw(st.lists(st.floats(0.01, 100.0), min_size=ranks, max_size=ranks))
    fractions = [w / sum(weights) for w in weights]
    unit = draw(st.sampled_from([1, 8, 32, 64]))
    units = draw(st.integers(ranks, 200))
    return units * unit, fractions, unit


@settings(max_examples=200, deadline=None)
@given(splits())
def test_split_sizes_invariants(case):
    total, fractions, unit = case
    sizes = split_sizes(total, fractions, unit)
    assert len(sizes) == len(fractions)
    assert sum(sizes) == total
    assert all(s % unit == 0 and s >= unit for s in sizes), sizes
    ideal = [total // unit * f for f in fractions]
    if min(ideal) >= 1:   # nobody needed lifting to one unit: largest remainder, within one unit of ideal
        assert all(abs(s // unit - x) < 1 for s, x in zip(sizes, ideal)), (sizes, ideal)
    assert offsets(sizes) == [sum(sizes[:i]) for i in range(len(sizes))]


@pytest.mark.parametrize("args, message", [
    ((6, [0.5, 0.6]), "split of 6 columns: [0.5, 0.6] sum to 1.1, not 1"),
    ((6, [1.0, 0.0]), "split of 6 columns: rank 1 has fraction 0.0; every rank of a TP group holds a shard (> 0)"),
    ((6, [1.5, -0.5]), "split of 6 columns: rank 1 has fraction -0.5"),
    ((6, [float("nan"), 1.0]), "rank 0 has fraction nan"),
    ((6, []), "split of 6 columns: no ranks"),
    ((2, [1 / 3] * 3), "2 columns make 2 units of 1: fewer than the 3 TP ranks, so a rank would hold none"),
    ((64, [1 / 3] * 3, 32), "64 columns make 2 units of 32: fewer than the 3 TP ranks"),
    ((100, [0.5, 0.5], 32), "100 columns do not split into units of 32"),
    ((8, [0.5, 0.5], 0), "8 columns do not split into units of 0"),
])
def test_split_sizes_errors(args, message):
    with pytest.raises(ValueError) as info:
        split_sizes(*args)
    assert message in str(info.value)


def test_split_errors_name_the_dimension():
    from hcomm.parallel.tensor.parallelize import tp_split

    cfg = tc.config("tiny")
    with pytest.raises(ValueError, match=r"tp fractions: \[0.5, 0.6\] sum to 1.1, not 1"):
        tp_split(cfg, 97, [0.5, 0.6])
    with pytest.raises(ValueError, match=r"4 key/value heads make 4 units of 1: fewer than the 5 TP ranks"):
        tp_split(cfg, 97, [0.2] * 5)
    assert check_fractions([0.5, 0.5]) == [0.5, 0.5]


# ------------------------------------------------------------------ 2. equivalence

@pytest.fixture(scope="module")
def pool():
    p = Pool(3, setup="groups", env={"HCOMM_PROFILE": "off", "OMP_NUM_THREADS": "1"})
    yield p
    p.close()


# name: (ranks, model, fractions, backend, the split expected exactly)
EQUIVALENCE = {
    "1:1": (2, "tiny", [0.5, 0.5], "gloo",
            dict(kv_heads=[2, 2], q_heads=[2, 2], hidden=[192, 160], vocab=[49, 48])),
    "2:1": (2, "tiny", [2 / 3, 1 / 3], "gloo",
            dict(kv_heads=[3, 1], q_heads=[3, 1], hidden=[224, 128], vocab=[65, 32])),
    "1:2": (2, "tiny", [1 / 3, 2 / 3], "gloo",
            dict(kv_heads=[1, 3], q_heads=[1, 3], hidden=[128, 224], vocab=[32, 65])),
    "2:1, 2 kv heads": (2, "gqa2", [2 / 3, 1 / 3], "gloo",
                        dict(kv_heads=[1, 1], q_heads=[2, 2], hidden=[224, 128], vocab=[65, 32])),
    "2:1, 8 heads on 4 kv heads": (2, "gqa4x8", [2 / 3, 1 / 3], "gloo",
                                   dict(kv_heads=[3, 1], q_heads=[6, 2], hidden=[224, 128], vocab=[65, 32])),
    "1:2:5": (3, "heads8", [1 / 8, 2 / 8, 5 / 8], "gloo",
              dict(kv_heads=[1, 2, 5], q_heads=[1, 2, 5], hidden=[32, 96, 224], vocab=[12, 24, 61])),
    "1:2:5 on hcomm": (3, "heads8", [1 / 8, 2 / 8, 5 / 8], "hcomm",
                       dict(kv_heads=[1, 2, 5], q_heads=[1, 2, 5], hidden=[32, 96, 224], vocab=[12, 24, 61])),
    # sequence parallelism: uneven slices of the sequence through hcomm's reduce_scatter_v / all_gather_v,
    # with the shards held in reverse group-rank order (the slices must follow the group ranks)
    "1:2:5 sequence parallel, reversed": (3, "heads8", [1 / 8, 2 / 8, 5 / 8], "hcomm",
                                          dict(kv_heads=[1, 2, 5], q_heads=[1, 2, 5], hidden=[32, 96, 224],
                                               vocab=[12, 24, 61]), dict(sequence_parallel=True, reverse=True)),
    "2:1 sequence parallel": (2, "tiny", [2 / 3, 1 / 3], "hcomm",
                              dict(kv_heads=[3, 1], q_heads=[3, 1], hidden=[224, 128], vocab=[65, 32]),
                              dict(sequence_parallel=True)),
}


@pytest.mark.parametrize("case", list(EQUIVALENCE))
def test_shards_equal_the_unsharded_model(pool, case):
    k, name, fractions, backend, want_split, *options = EQUIVALENCE[case]
    cfg = tc.config(name)
    ref_losses, ref_grads, ref_params = tc.reference(name)
    opts = options[0] if options else {}
    results = [r for r in pool.run(tc.case_train, k, name, fractions, backend, tc.STEPS,
                                   opts.get("sequence_parallel", False), opts.get("reverse", False))
               if r is not None]
    assert len(results) == k
    for split, losses, grads, params, index in results:
        assert split == want_split
        # every parameter of the unsharded model is held by this rank, cut or whole
        assert sorted(grads) == sorted(ref_grads) == sorted(params)
        assert losses == pytest.approx(ref_losses, rel=LOSS_RTOL)
        assert losses == results[0][1], "ranks of one TP group must see the same loss"
        for n, g in grads.items():
            where = tc.shard_slice(n, cfg, split, index)
            want = tc.cut(ref_grads[n], where)
            got = torch.from_numpy(g)
            assert got.shape == want.shape, (n, index)
            err = (got - want).abs().max().item()
            assert err <= GRAD_REL * want.abs().max().item(), (case, n, index, err)
            got_p, want_p = torch.from_numpy(params[n]), tc.cut(ref_params[n], where)
            assert torch.allclose(got_p, want_p, rtol=0, atol=PARAM_ATOL), (case, n, index)
            if where is None:   # replicated: the norms stay identical on every rank
                assert (got == torch.from_numpy(results[0][2][n])).all(), (n, index)
                assert (got_p == torch.from_numpy(results[0][3][n])).all(), (n, index)


@pytest.mark.parametrize("k, sizes, backend", [(2, [65, 32], "gloo"), (2, [1, 96], "gloo"),
                                               (3, [12, 24, 61], "gloo"), (3, [12, 24, 61], "hcomm")])
def test_vocab_parallel_cross_entropy_equals_the_gathered_one(pool, k, sizes, backend):
    logits = tc.ce_logits(sum(sizes)).requires_grad_(True)
    targets = tc.ce_targets(sizes)
    assert {0, sum(sizes) - 1, *(sum(sizes[:i]) for i in range(k)), *(sum(sizes[:i + 1]) - 1 for i in range(k))} \
        <= set(targets.tolist())
    mean = F.cross_entropy(logits, targets)
    mean.backward()
    grad_mean, logits.grad = logits.grad.clone(), None
    total = F.cross_entropy(logits, targets, reduction="sum")
    (3.0 * total).backward()
    grad_sum = logits.grad.clone()
    results = [r for r in pool.run(tc.case_cross_entropy, k, sizes, backend) if r is not None]
    assert len(results) == k
    start = 0
    for index, (got_mean, got_sum, g_mean, g_sum) in enumerate(results):
        assert got_mean == pytest.approx(float(mean.detach()), rel=CE_LOSS_RTOL)
        assert got_sum == pytest.approx(float(total.detach()), rel=CE_LOSS_RTOL)
        assert (got_mean, got_sum) == results[0][:2]
        mine = slice(start, start + sizes[index])
        assert torch.allclose(torch.from_numpy(g_mean), grad_mean[:, mine], rtol=0, atol=CE_GRAD / len(targets))
        assert torch.allclose(torch.from_numpy(g_sum), grad_sum[:, mine], rtol=0, atol=CE_GRAD * 3.0)
        start += sizes[index]


BAD_INPUT = {
    "fractions not summing to 1": "tp fractions: [0.6, 0.6] sum to 1.2, not 1",
    "a zero fraction": "tp fractions: rank 1 has fraction 0.0; every rank of a TP group holds a shard (> 0)",
    "wrong fraction count": "1 TP fractions for a group of 2 ranks",
    "three fractions for two ranks": "3 TP fractions for a group of 2 ranks",
    "index out of range": "TP shard index 2 outside 0..1",
    "tied embeddings": "tensor parallelism of tied embeddings is not supported (embedding and head split differently)",
    "more ranks than kv heads": "3 TP ranks but the model has 2 key/value heads: every rank needs at least one",
}


def test_tensor_parallelize_refuses_bad_input(pool):
    results = pool.run(tc.case_bad_input)
    assert results[0] == BAD_INPUT
    assert results[1] == BAD_INPUT
    assert results[2] == {"more ranks than kv heads": BAD_INPUT["more ranks than kv heads"]}


# ------------------------------------------------------------------ 3. plan rules

def tp_plan() -> Plan:
    """A valid plan: 4 ranks in TP groups [0, 1] and [3, 2] (shard order), fractions 0.6 / 0.4 by
    position, 4 rows per group."""
    ranks = [RankPlan(0, 0.5, tp_group=0, tp_fraction=0.6), RankPlan(1, 0.0, tp_group=0, tp_fraction=0.4),
             RankPlan(2, 0.0, tp_group=1, tp_fraction=0.4), RankPlan(3, 0.5, tp_group=1, tp_fraction=0.6)]
    groups = [GroupPlan("dp", [0, 1, 2, 3]), GroupPlan("tp:0", [0, 1]), GroupPlan("tp:1", [3, 2])]
    return Plan(8, 16, ranks, groups, name="tp").validate()


def _set(obj, **fields):
    for key, value in fields.items():
        setattr(obj, key, value)


def _with_pipelines(p):
    """Valid pipeline groups on top (so that _check_pipeline passes and the TP rule speaks): pipelines
    [0, 1] and [3, 2] run each TP group across two stages, which a pipeline of TP groups cannot."""
    p.groups += [GroupPlan("pp:0", [0, 1], cuts=[0, 4, 9]), GroupPlan("pp:1", [3, 2], cuts=[0, 4, 9])]
    _set(p.ranks[1], stage=1)
    _set(p.ranks[2], stage=1)


TP_ONLY = "tensor-parallel groups run on backend 'hcomm' without ZeRO or sync_every > 1"

RULES = {
    "rank in two TP groups": (
        lambda p: _set(p.groups[2], ranks=[1, 2]),
        "groups[2].ranks: rank 1 is in TP group 'tp:0' too; each rank is in one"),
    "rank in no TP group": (
        lambda p: _set(p.groups[2], ranks=[3]),
        "groups: ranks 2 are in no tensor-parallel ('tp:*') group"),
    "tp_group is not the group's index": (
        lambda p: _set(p.ranks[2], tp_group=0),
        "ranks[2].tp_group: is 0, but rank 2 is in 'tp:1'"),
    "fractions not summing to 1": (
        lambda p: _set(p.ranks[1], tp_fraction=0.5),
        "groups[1] (tp:0): the ranks' tp_fraction [0.6, 0.5] sum to 1.1, not 1"),
    "fractions differ across groups at a position": (
        lambda p: (_set(p.ranks[2], tp_fraction=0.5), _set(p.ranks[3], tp_fraction=0.5)),
        "groups[2] (tp:1): tp_fraction [0.5, 0.5] differ from those of 'tp:0' [0.6, 0.4]: ranks at one position of "
        "every TP group hold the same shard"),
    "fractions in the other order": (
        lambda p: (_set(p.groups[2], ranks=[2, 3]), _set(p.ranks[2], batch_share=0.5),
                   _set(p.ranks[3], batch_share=0.0)),
        "groups[2] (tp:1): tp_fraction [0.4, 0.6] differ from those of 'tp:0' [0.6, 0.4]"),
    "share on a non-first rank": (
        lambda p: (_set(p.ranks[0], batch_share=0.25), _set(p.ranks[1], batch_share=0.25)),
        "ranks[1].batch_share: 0.25, but only a TP group's first rank (rank 0 of 'tp:0') takes a share: it is "
        "the group's rows"),
    "a zero fraction": (
        lambda p: _set(p.ranks[1], tp_fraction=0.0),
        "ranks[1].tp_fraction: must be in (0, 1], got 0.0"),
    "TP with ZeRO": (
        lambda p: [_set(r, zero_stage=1) for r in p.ranks], TP_ONLY),
    "TP group across pipeline stages": (
        _with_pipelines, "groups[1] (tp:0): ranks [0, 1] sit at pipeline positions [0, 1]; a TP group is one stage"),
    "TP with sync_every": (lambda p: _set(p.groups[0], sync_every=4), TP_ONLY),
    "TP on ddp-gloo": (lambda p: _set(p, backend="ddp-gloo"), TP_ONLY),
    "TP with a dtype the device lacks": (
        lambda p: (_set(p.ranks[2], device="V100"), _set(p.ranks[2], compute_dtype="bf16")),
        "ranks[2].compute_dtype: V100 cannot compute in bf16"),
}


@pytest.mark.parametrize("name", list(RULES))
def test_tensor_rule(name):
    edit, message = RULES[name]
    plan = tp_plan()
    edit(plan)
    with pytest.raises(PlanError) as info:
        plan.validate()
    assert message in str(info.value), str(info.value)


@pytest.mark.parametrize("field, value, message", [
    ("tp_group", 1, "ranks[1]: tp_group 1 / tp_fraction 1 set, but the plan has no tensor-parallel ('tp:*') groups"),
    ("tp_fraction", 0.5, "ranks[1]: tp_group 0 / tp_fraction 0.5 set, but the plan has no tensor-parallel ('tp:*') "
                         "groups"),
])
def test_tp_fields_without_tp_groups(field, value, message):
    plan = Plan.from_shares([0.5, 0.5], 8, 16)
    setattr(plan.ranks[1], field, value)
    with pytest.raises(PlanError) as info:
        plan.validate()
    assert message in str(info.value)


def test_tp_takes_per_device_dtypes():
    """Ranks of one TP group may compute in different dtypes: row-parallel partial sums are fp32."""
    plan = tp_plan()
    plan.ranks[0].compute_dtype, plan.ranks[1].compute_dtype = "bf16", "fp16"
    plan.validate()


def test_valid_tp_plan_and_yaml_round_trip(tmp_path):
    plan = tp_plan()
    assert [g.ranks for g in plan.tensor_groups()] == [[0, 1], [3, 2]]
    assert plan.batch_counts() == [4, 0, 0, 4]
    text = plan.to_yaml()
    assert "tp_fraction: 0.4" in text and "ranks: [3, 2]" in text
    assert Plan.from_yaml(text) == plan
    assert "0:0.6" in str(plan) and "1:0.4" in str(plan)   # the rank table's tp column


# ------------------------------------------------------------------ 3b. the planner

def _fractions(plan):
    return [[plan.ranks[r].tp_fraction for r in g.ranks] for g in plan.tensor_groups()]


def _speeds(plan, speeds):
    return [[speeds[r] for r in g.ranks] for g in plan.tensor_groups()]


@pytest.mark.parametrize("speeds", [[1.0, 0.5], [0.5, 1.0], [1.0, 1.0, 0.5, 0.5], [1.0, 0.5, 0.5, 1.0],
                                    [1.0, 0.5, 1.0, 0.25]])
def test_auto_tp_plan_favours_the_faster_rank_and_beats_uniform(speeds):
    v = view(speeds)
    auto = plan_tensor(v, 16, 16, tp=2, dim=32, n_layers=6)
    uniform = plan_tensor(v, 16, 16, tp=2, dim=32, n_layers=6, split="uniform")
    for plan in (auto, uniform):
        plan.validate(len(speeds))
        assert Plan.from_yaml(plan.to_yaml()) == plan
        groups = plan.tensor_groups()
        assert len(groups) == len(speeds) // 2
        assert sorted(r for g in groups for r in g.ranks) == list(range(len(speeds)))
        fr = _fractions(plan)
        assert all(f == fr[0] for f in fr), fr           # identical by position in every group
        assert sum(fr[0]) == pytest.approx(1.0, abs=1e-9)
        counts = plan.batch_counts()
        assert sum(counts) == 16 and all(counts[r] == 0 for g in groups for r in g.ranks[1:])
    assert _fractions(uniform)[0] == [0.5, 0.5]
    n_groups = len(uniform.tensor_groups())
    assert [uniform.batch_counts()[g.ranks[0]] for g in uniform.tensor_groups()] == [16 // n_groups] * n_groups
    for f, s in zip(_fractions(auto), _speeds(auto, speeds)):
        # members fastest first; a faster member never holds the smaller fraction
        assert s == sorted(s, reverse=True)
        assert f == sorted(f, reverse=True)
    assert auto.predicted_step_s < uniform.predicted_step_s
    assert auto.name == "auto" and uniform.name == "uniform"


def test_auto_tp_fractions_are_the_speed_shares():
    plan = plan_tensor(view([1.0, 0.5]), 16, 16, tp=2, dim=32, n_layers=6)
    assert _fractions(plan) == [[0.6667, 0.3333]]
    # the group of two equal fast ranks gets twice the rows of the group of two slow ones
    two = plan_tensor(view([1.0, 1.0, 0.5, 0.5]), 16, 16, tp=2, dim=32, n_layers=6)
    assert [g.ranks for g in two.tensor_groups()] == [[0, 1], [2, 3]]
    assert [two.batch_counts()[g.ranks[0]] for g in two.tensor_groups()] == [11, 5]
    # per position, the mean over groups of the member's share (2/3 and 4/5 -> 0.7333)
    mixed = plan_tensor(view([1.0, 0.5, 1.0, 0.25]), 16, 16, tp=2, dim=32, n_layers=6)
    assert _fractions(mixed) == [[0.7333, 0.2667], [0.7333, 0.2667]]


def test_tp_planner_refuses_bad_input():
    with pytest.raises(ValueError, match=r"--tp 2: the 3 ranks do not form equal tensor-parallel groups of 2"):
        plan_tensor(view([1.0, 1.0, 1.0]), 12, 16, tp=2, dim=32, n_layers=6)
    with pytest.raises(ValueError, match=r"TP split must be one of auto, uniform, got 'even'"):
        plan_tensor(view([1.0, 1.0]), 8, 16, tp=2, dim=32, n_layers=6, split="even")
    with pytest.raises(ValueError, match=r"TP fractions \[0.7, 0.7\]: need 2 values > 0 summing to 1"):
        plan_tensor(view([1.0, 1.0]), 8, 16, tp=2, dim=32, n_layers=6, fractions=[0.7, 0.7])
    pinned = plan_tensor(view([1.0, 1.0]), 8, 16, tp=2, dim=32, n_layers=6, fractions=[0.25, 0.75])
    assert _fractions(pinned) == [[0.25, 0.75]]


def test_tp_planner_does_not_mutate_the_view():
    v = view([1.0, 0.5, 0.5, 1.0])
    before = copy.deepcopy(v.profiles)
    plan_tensor(v, 16, 16, tp=2, dim=32, n_layers=6)
    assert v.profiles == before


# ------------------------------------------------------------------ 4. the trainer

TRAIN_STEPS = 3
TRAIN_REL = 1e-4
PLANS = ["auto", "uniform", "auto@tp=4", "uniform@tp=1", "auto@sp=1", "auto@tp=4@sp=1",
         "auto@precision=per-device@sp=1"]
MIXED = "auto@precision=per-device@sp=1"   # A100 ranks bf16, V100 ranks fp16, one loss scale per TP group
MIXED_REL = 2.0 ** -9                      # half bf16's unit roundoff (tests/parallel/test_precision.py)
REFERENCE = "uniform@tp=1"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_local(tmp_path_factory.mktemp("tp-train"), PLANS, TRAIN_STEPS, "--tp", "2")[0]


def test_every_tp_plan_trains_the_reference_losses(trained):
    runs = trained
    assert sorted(runs) == sorted(PLANS)
    assert not any(g["name"].startswith("tp:") for g in runs[REFERENCE]["plan"]["groups"])
    want = assert_reference_losses(runs, REFERENCE, TRAIN_STEPS, lambda name: MIXED_REL if name == MIXED else TRAIN_REL)
    mixed = runs[MIXED]
    assert [r.get("compute_dtype", "fp32") for r in mixed["plan"]["ranks"]] == ["bf16", "bf16", "fp16", "fp16"]
    assert all(not s["skipped"] and s["loss_scales"] == [65536.0] * 4 for s in mixed["steps"])
    assert [s["loss"] for s in mixed["steps"]] != want   # autocast ran


def test_the_tp_plans_are_the_groups_asked_for(trained):
    runs = trained
    for name in ("auto", "uniform", "auto@tp=4"):
        plan = Plan.from_dict(runs[name]["plan"])   # validates
        size = 4 if "tp=4" in name else 2
        groups = plan.tensor_groups()
        assert len(groups) == 4 // size and all(len(g.ranks) == size for g in groups), name
        counts = plan.batch_counts()
        for g in groups:   # every rank of a TP group runs the group's rows
            assert [runs[name]["counts"][r] for r in g.ranks] == [counts[g.ranks[0]]] * size, name
        fr = _fractions(plan)
        assert all(f == fr[0] for f in fr) and sum(fr[0]) == pytest.approx(1.0), name
    for name in ("auto@sp=1", "auto@tp=4@sp=1"):   # sequence parallel (uneven slices of the 32 positions)
        assert all(g.sequence_parallel for g in Plan.from_dict(runs[name]["plan"]).tensor_groups()), name
    assert not any(g.sequence_parallel for g in Plan.from_dict(runs["auto"]["plan"]).tensor_groups())
    uniform = Plan.from_dict(runs["uniform"]["plan"])
    assert [g.ranks for g in uniform.tensor_groups()] == [[0, 1], [2, 3]]
    assert _fractions(uniform) == [[0.5, 0.5], [0.5, 0.5]] and uniform.batch_counts() == [4, 0, 4, 0]


def test_tp_fractions_are_capped_by_memory():
    """Speeds 1 : 0.5 want 2/3 : 1/3; with room for only half the state (144 MiB) on the fast rank after
    its activations (12 rows x 9 MiB), the fast rank is capped at 0.5 and the slow one takes the rest;
    a group that cannot hold the state at all is refused; a pinned split that does not fit is refused."""
    MiB = 1 << 20
    room = 108 * MiB + 72 * MiB          # activations of 12 rows + half of the 144 MiB state
    plan = plan_tensor(view([1.0, 0.5], budgets=[room, 8 << 30]), 12, 16, tp=2, dim=64, n_layers=7)
    assert [r.tp_fraction for r in plan.ranks] == [0.5, 0.5]
    with pytest.raises(ValueError, match="the TP group cannot hold the model"):
        plan_tensor(view([1.0, 0.5], budgets=[room, room - 8 * MiB]), 12, 16, tp=2, dim=64, n_layers=7)
    with pytest.raises(ValueError, match="do not fit memory"):
        plan_tensor(view([1.0, 0.5], budgets=[room, 8 << 30]), 12, 16, tp=2, dim=64, n_layers=7,
                    fractions=[0.7, 0.3])


def test_sequence_parallel_only_in_tp_groups():
    plan = Plan.from_shares([0.5, 0.5], 8, 16)
    plan.dp_group().sequence_parallel = True
    with pytest.raises(PlanError, match=r"groups\[0\]\.sequence_parallel: only tensor-parallel \('tp:\*'\) groups"):
        plan.validate()


def test_every_tp_collective_counts_as_waiting(monkeypatch):
    """The straggler watch leaves a TP member's time inside collectives out of its own work: the
    all-reduce and sequence parallelism's uneven gather and scatter all add to ``waited_s`` (collectives
    stubbed with a 20 ms sleep: no group needed)."""
    import time

    import torch

    import hcomm
    from hcomm.parallel.tensor import comm, sequence

    def slow(*args, **kwargs):
        time.sleep(0.02)

    monkeypatch.setattr(comm.dist, "all_reduce", slow)
    monkeypatch.setattr(hcomm, "all_gather_v", slow)
    monkeypatch.setattr(hcomm, "reduce_scatter_v", slow)
    for call in (lambda: comm.all_reduce(torch.ones(4), None),
                 lambda: sequence._gather(torch.ones(2, 3, 4), [3, 1], None),
                 lambda: sequence._scatter(torch.ones(2, 4, 4), [3, 1], 0, None)):
        before = comm.waited_s()
        call()
        assert 0.02 <= comm.waited_s() - before < 1.0
