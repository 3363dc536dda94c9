"""Pipeline runtime: equivalence with single-process training, and bad input refused up front.

A pipeline changes where the work runs, never what is computed: with the
loss of each micro-batch summed over its tokens and divided by the batch's
token count (``TokenSumLoss``), T SGD steps on the same global batches must
give the single process's losses and parameters up to rounding, for any
uneven piece ranges, schedule and micro-batch count, and (with data-parallel
replicas of the stages and GradSync weights n_r/N) any split of the batch.

Model: the ``tiny`` config with 6 blocks (9 pieces: embed, 6 blocks, norm,
head, so 4 ranks x 2 virtual stages fit) and the 97-token vocabulary of the
data-parallel tests; batches of B=8 (10 with replicas) rows of S=16 tokens.

Tolerance, derived: a parameter's gradient is a sum over k = B*S = 128 token
terms; micro-batches (and replicas, scaled by n_r/N) only regroup that sum,
an error bounded by gamma_k * sum|terms| with gamma_k ~ k*u = 7.6e-6
(u = 2**-24).  The forward pass of a micro-batch is the same arithmetic on a
subset of rows; BLAS may block a [b*S, D] product differently from the
[B*S, D] one, changing each D = 128 long dot product by at most D*u = 7.6e-6
relative, which reaches the gradient linearly.  SGD moves parameters by
lr*g per step, so after T = 4 steps |dp| <= T*lr*(gamma_k + D*u)*max|g|
= 4 * 0.5 * 1.5e-5 * 0.25 (max|g| < 0.25 measured for these batches)
~ 8e-6 worst case; the typical error is sqrt(k)*u ~ 7e-7 (1.2e-7 observed).
We assert 2e-5 absolute on parameters (the data-parallel tests' bound) and
1e-5 relative on losses (a loss is a mean of k terms near 4.6: k*u relative).
"""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from tests.helpers.mp import Pool
from tests.parallel import dp_cases

STEPS = 4
BATCH = 8
LR = 0.5
PARAM_ATOL = 2e-5
LOSS_RTOL = 1e-5
N_PIECES = 9

# Uneven piece ranges over [embed, 6 blocks, norm, head] (pieces 0..8).
RANGES = {
    2: [(0, 3), (3, 9)],
    3: [(0, 2), (2, 6), (6, 9)],
    4: [(0, 1), (1, 5), (5, 7), (7, 9)],
}
VIRTUAL_RANGES = {  # 2 stages per rank
    2: [(0, 1), (1, 4), (4, 6), (6, 9)],
    3: [(0, 2), (2, 3), (3, 5), (5, 6), (6, 7), (7, 9)],
    4: [(0, 1), (1, 2), (2, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 9)],
}


def warmup_order(n_ranks: int, n_mb: int, warmup):
    """One stage per rank: rank r runs warmup[r] forwards, then alternates backward/forward.

    The shape a cost-aware scheduler emits (a fast stage runs ahead, a slow one
    keeps few micro-batches in flight); torch's schedules fix warmup[r] to
    n_mb (GPipe) or min(n_mb, n_ranks - r) (1F1B).
    """
    order = {}
    for r in range(n_ranks):
        acts, f, b = [f"{r}F{i}" for i in range(warmup[r])], warmup[r], 0
        while b < n_mb:
            acts.append(f"{r}B{b}")
            b += 1
            if f < n_mb:
                acts.append(f"{r}F{f}")
                f += 1
        order[r] = acts
    return order


# Explicit orders torch's schedules cannot express.  On 2 ranks: 4 stages in a V (rank 0 holds the
# first and last stage, rank 1 the two middle ones, handed over in-process), micro-batches 0..3.
CUSTOM = {
    2: (VIRTUAL_RANGES[2], {
        0: "0F0 0F1 0F2 3F0 3B0 3F1 3B1 0B0 0F3 3F2 3B2 0B1 3F3 3B3 0B2 0B3".split(),
        1: "1F0 2F0 1F1 2F1 2B0 1F2 1B0 2F2 2B1 1B1 1F3 2F3 2B2 1B2 2B3 1B3".split(),
    }),
    3: (RANGES[3], warmup_order(3, 4, [4, 3, 1])),
    4: (RANGES[4], warmup_order(4, 4, [4, 4, 2, 1])),
}


def config():
    from hcomm.models import get_config

    return dataclasses.replace(get_config("tiny"), n_layers=6, max_seq_len=32)


def build():
    from hcomm.models import build_model

    return build_model(config(), vocab_size=dp_cases.VOCAB, seed=1)


@functools.lru_cache(maxsize=None)
def reference(global_batch: int, steps: int = STEPS):
    """Single process: mean loss over the whole global batch, plain SGD."""
    model = build()
    losses = dp_cases.train_whole_batches(model, torch.optim.SGD(model.parameters(), lr=LR), global_batch, steps)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


# ------------------------------------------------------------------ cases (run on every worker)

def _named_local(model, pipeline):
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: p.detach().clone() for p in pipeline.parameters()}


def case_train(ctx, k, ranges, schedule, n_mb, virtual, order, global_batch, steps):
    """A k-rank pipeline over ranks [0, k); (losses, {name: parameter}) on its ranks, None elsewhere."""
    from hcomm.parallel.pipeline.runtime import Pipeline

    if not ctx.in_group(k):
        return None
    model = build()
    pipe = Pipeline(model, ranges, ctx.groups[k][1], schedule=schedule, n_microbatches=n_mb,
                    virtual_stages=virtual, order=order)
    opt = torch.optim.SGD(pipe.parameters(), lr=LR)
    data = dp_cases.batches(global_batch)
    losses = []
    for step in range(steps):
        losses.append(pipe.step(data.global_batch_rows(step)).loss)
        opt.step()
    pipe.close()
    return losses, _named_local(model, pipe)


def case_replicas(ctx, rows_per_replica, schedule, n_mb, steps):
    """2 stages x 2 replicas: ranks [0, 1] and [2, 3] are pipelines, [0, 2] and [1, 3] reduce gradients."""
    from hcomm.parallel.pipeline.runtime import Pipeline, make_pipeline_groups

    if "replicas" not in ctx.state:  # collective: every rank creates the groups once, in the same order
        ctx.state["replicas"] = make_pipeline_groups([[0, 1], [2, 3]])
    pipeline_group, dp_group = ctx.state["replicas"]
    replica = ctx.rank // 2
    global_batch = sum(rows_per_replica)
    offset, n = sum(rows_per_replica[:replica]), rows_per_replica[replica]
    model = build()
    pipe = Pipeline(model, RANGES[2], pipeline_group, schedule=schedule, n_microbatches=n_mb,
                    dp_group=dp_group, bucket_bytes=1 << 16)
    opt = torch.optim.SGD(pipe.parameters(), lr=LR)
    data = dp_cases.batches(global_batch)
    losses = []
    for step in range(steps):
        losses.append(pipe.step(data.rows(step, offset, n), global_batch=global_batch).global_loss)
        opt.step()
    pipe.close()
    return losses, _named_local(model, pipe)


BAD = {
    "no layers": dict(ranges=[(0, 3), (3, 3), (3, 9)]),
    "overlap": dict(ranges=[(0, 4), (3, 9)]),
    "gap": dict(ranges=[(0, 3), (4, 9)]),
    "too many stages": dict(ranges=[(i, i + 1) for i in range(N_PIECES)] + [(N_PIECES, N_PIECES + 1)]),
    "1f1b micro-batches": dict(ranges=RANGES[2], schedule="1f1b", n_microbatches=1),
    "interleaved micro-batches": dict(ranges=VIRTUAL_RANGES[2], schedule="interleaved", virtual_stages=2,
                                      n_microbatches=5),
    "stage count": dict(ranges=RANGES[3], schedule="gpipe", n_microbatches=2),
    "order deadlocks": dict(ranges=RANGES[2], schedule="custom", n_microbatches=2,
                            order={0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F0", "1F1", "1B0", "1B1"]}),
    "order misses a micro-batch": dict(ranges=RANGES[2], schedule="custom", n_microbatches=2,
                                       order={0: ["0F0", "0F1", "0B0", "0B1"], 1: ["1F0", "1B0", "1F1"]}),
}


def case_bad_input(ctx):
    """Every bad input raises ValueError on every rank with no op on the group; then a good step runs."""
    import hcomm
    from hcomm.parallel.pipeline.runtime import Pipeline

    if not ctx.in_group(2):
        return None
    group = ctx.groups[2][1]
    model = build()
    hcomm.clear_history(group)
    messages = {}
    for name, kwargs in BAD.items():
        kwargs = dict(kwargs)
        ranges = kwargs.pop("ranges")
        try:
            Pipeline(model, ranges, group, **kwargs)
            messages[name] = None
        except ValueError as error:
            messages[name] = str(error)
    pipe = Pipeline(model, RANGES[2], group, schedule="gpipe", n_microbatches=3)
    rows = dp_cases.batches(BATCH).global_batch_rows(0)
    try:
        pipe.step(rows)  # 8 rows, 3 micro-batches
        messages["rows"] = None
    except ValueError as error:
        messages["rows"] = str(error)
    quiet = len(hcomm.history(group)) == 0
    pipe = Pipeline(model, RANGES[2], group, schedule="gpipe", n_microbatches=2)
    losses = [pipe.step(rows).loss, pipe.step(rows[:4]).loss]  # micro-batches of 4, then 2: stages rebuilt
    assert hcomm.history(group), "the history records the pipeline's sends and receives"  # so `quiet` means it
    return messages, quiet, losses


# ------------------------------------------------------------------ tests

@pytest.fixture(scope="module")
def pool():
    p = Pool(4, setup="groups", env={"HCOMM_PROFILE": "off", "OMP_NUM_THREADS": "1"})  # 4 workers on 2 cores
    yield p
    p.close()


def _check(results, ref_losses, ref_params, loss_key=None):
    """Every parameter comes back from exactly one rank of each replica, close to the reference;
    every rank holding the last stage reports the reference losses."""
    import numpy as np

    got = [r for r in results if r is not None]
    seen = {}
    reported = 0
    for losses, params in got:
        if not np.isnan(losses).any():
            np.testing.assert_allclose(losses, ref_losses, rtol=LOSS_RTOL)
            reported += 1
        for name, value in params.items():
            np.testing.assert_allclose(value, ref_params[name].numpy(), atol=PARAM_ATOL, rtol=0, err_msg=name)
            seen.setdefault(name, []).append(value)
    assert reported >= 1
    replicas = len(seen[next(iter(seen))])
    assert sorted(seen) == sorted(ref_params) and all(len(v) == replicas for v in seen.values())
    for name, copies in seen.items():  # replicas end bit for bit equal
        assert all((c == copies[0]).all() for c in copies), name


CASES = ([(k, "gpipe") for k in RANGES] + [(k, "1f1b") for k in RANGES] + [(k, "interleaved") for k in RANGES]
         + [(k, "custom") for k in RANGES])


@pytest.mark.parametrize("k, schedule", CASES, ids=[f"{k}ranks-{s}" for k, s in CASES])
def test_pipeline_equals_single_process(pool, k, schedule):
    n_mb, virtual, order = 4, 1, None
    ranges = RANGES[k]
    if schedule == "interleaved":
        ranges, virtual = VIRTUAL_RANGES[k], 2
    elif schedule == "custom":
        ranges, order = CUSTOM[k]
    ref_losses, ref_params = reference(BATCH)
    results = pool.run(case_train, k, ranges, schedule, n_mb, virtual, order, BATCH, STEPS)
    _check(results, ref_losses, ref_params)


@pytest.mark.parametrize("rows, schedule", [((6, 4), "1f1b"), ((10, 0), "gpipe")])
def test_replicated_stages_with_unequal_shares(pool, rows, schedule):
    """Replica shares 6:4 (and 10:0, a replica with no samples that only joins the reduction);
    2 micro-batches each; the carried global loss equals the single process's."""
    ref_losses, ref_params = reference(sum(rows))
    results = pool.run(case_replicas, list(rows), schedule, 2, STEPS)
    _check(results, ref_losses, ref_params)


EXPECTED = {
    "no layers": "stage 1 has no layers: piece range [3, 3)",
    "overlap": "stage 1 starts at piece 3 but stage 0 ends at 4: pieces [3, 4) overlap",
    "gap": "stage 1 starts at piece 4 but stage 0 ends at 3: pieces [3, 4) are in no stage",
    "too many stages": "10 stages for a model of 9 pieces",
    "1f1b micro-batches": "1f1b needs at least as many micro-batches as stages: 1 micro-batches for 2 stages",
    "interleaved micro-batches": "interleaved on 2 ranks cannot run 5 micro-batches",
    "stage count": "gpipe runs one stage per rank: 3 piece ranges for 2 ranks",
    "order deadlocks": "custom order cannot run",
    "order misses a micro-batch": "stage 1 runs B for micro-batches [0], expected 0..1 (missing [1])",
    "rows": "8 rows cannot be split into 3 equal micro-batches",
}


def test_bad_input_is_refused_before_any_communication(pool):
    results = [r for r in pool.run(case_bad_input) if r is not None]
    for messages, quiet, _ in results:
        assert quiet, "a refused pipeline communicated"
        for name, fragment in EXPECTED.items():
            assert messages[name] is not None and fragment in messages[name], (name, messages[name])
    # The group still works, also when the micro-batch shape changes (no optimizer step in between).
    rows = dp_cases.batches(BATCH).global_batch_rows(0)
    with torch.no_grad():
        want = [float(build().loss(rows)), float(build().loss(rows[:4]))]
    assert results[1][2] == pytest.approx(want, rel=LOSS_RTOL)


def test_checks_without_processes():
    from hcomm.parallel.pipeline.runtime import check_order, check_schedule, parse_order
    from hcomm.parallel.pipeline.stages import build_stages, check_ranges

    assert check_ranges([[0, 4], [4, 9]], N_PIECES) == [(0, 4), (4, 9)]
    with pytest.raises(ValueError, match=r"stage 0 starts at piece 1"):
        check_ranges([(1, 4), (4, 9)], N_PIECES)
    with pytest.raises(ValueError, match=r"stage 1 \(the last\) ends at piece 8; pieces \[8, 9\)"):
        check_ranges([(0, 4), (4, 8)], N_PIECES)
    with pytest.raises(ValueError, match=r"stage 1 ends at piece 10 but the model has only 9"):
        check_ranges([(0, 4), (4, 10)], N_PIECES)
    with pytest.raises(ValueError, match=r"unknown pipeline schedule 'zb'"):
        check_schedule("zb", 2, 2, 4)
    with pytest.raises(ValueError, match=r"interleaved with 2 virtual stages per rank on 2 ranks needs 4 stages, "
                                         r"got 3"):
        check_schedule("interleaved", 3, 2, 4, 2)
    check_schedule("interleaved", 4, 2, 3, 2)  # 3 < 2*2 micro-batches: one round, fine for torch
    with pytest.raises(ValueError, match=r"stage 1 has actions on rank 0 and rank 1"):
        check_order(parse_order({0: ["0F0", "1F0"], 1: ["1B0"]}, 2), 2)
    with pytest.raises(ValueError, match=r"1B0 \(backward\) comes before 1F0"):
        check_order(parse_order({0: ["0F0", "0B0"], 1: ["1B0", "1F0"]}, 2), 2)
    with pytest.raises(ValueError, match=r"only F \(forward\) and B \(full backward\)"):
        parse_order({0: ["0F0", "0W0"]}, 1)
    assert check_order(parse_order(CUSTOM[2][1], 2), 4) == (4, {0: 0, 1: 1, 2: 1, 3: 0})
    # Orders as tuples (stage, kind, micro-batch) or as objects with kind/microbatch/stage (schedule_cost.Action)
    import collections

    Act = collections.namedtuple("Act", "kind microbatch stage")
    as_objects = {0: [Act("F", 0, 0), Act("B", 0, 0)], 1: [(1, "F", 0), None, (1, "B", 0)]}
    assert parse_order(as_objects, 2) == {0: [(0, "F", 0), (0, "B", 0)], 1: [(1, "F", 0), (1, "B", 0)]}

    tied = build_model_tied()
    with pytest.raises(ValueError, match=r"stage 1 and stage 0 share parameter"):
        build_stages(tied, [(0, 4), (4, 9)])
    assert len(build_stages(tied, [(0, 9)])) == 1


def build_model_tied():
    from hcomm.models import build_model

    return build_model(dataclasses.replace(config(), tie_embeddings=True), vocab_size=dp_cases.VOCAB, seed=1)
