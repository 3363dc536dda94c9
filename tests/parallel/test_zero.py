"""Equivalence of heterogeneous ZeRO (stages 1-3, uneven shards) with single-process training.

Same tolerance as test_data_parallel.py (derived there): ZeRO changes where
gradients are summed (a reduce-scatter over ranks instead of one backward)
and where the optimizer runs (on flat fp32 shards, element by element), not
what is computed; with SGD the parameters stay within 2e-5 and the losses
within 1e-5 relative of one process after 4 steps.  AdamW: losses to 1e-4.
Parameters are compared after ``finish()`` gathers them whole on every rank,
so the gathers are checked too (every rank must hold them bit for bit alike).
"""
import pytest

from tests.parallel import dp_cases, zero_cases
from hcomm.parallel.plan import Plan, PlanError

STEPS = 4
PARAM_ATOL = 2e-5
LOSS_RTOL = 1e-5


def zero_plan(shares, batch, stage, fractions=None, micro=0, **group):
    plan = Plan.from_shares(shares, batch, dp_cases.SEQ, name="zero")
    for i, r in enumerate(plan.ranks):
        r.zero_stage = stage
        r.micro_batch = micro
        if fractions is not None:
            r.shard_fraction = fractions[i]
    for k, v in group.items():
        setattr(plan.groups[0], k, v)
    return plan.validate()


def check(results, ref_losses, ref_params, params=True, loss_rtol=LOSS_RTOL):
    import numpy as np

    for losses, got, _ in results:
        np.testing.assert_allclose(losses, ref_losses, rtol=loss_rtol)
        if params:
            for g, want in zip(got, ref_params):
                np.testing.assert_allclose(g, want.numpy(), atol=PARAM_ATOL, rtol=0)
    first = results[0][1]
    for _, got, _ in results[1:]:
        for a, b in zip(first, got):
            assert (a == b).all()


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_uneven_shards_and_batches_equal_single_process(pool3, stage):
    ref = dp_cases.reference(10, STEPS)
    plan = zero_plan([0.5, 0.3, 0.2], 10, stage, fractions=[0.2, 0.5, 0.3])
    check(pool3.run(zero_cases.case_zero_train, plan.to_yaml(), STEPS), *ref)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_micro_batches_uneven_rounds_and_aggregation_only_rank(pool3, stage):
    """5/3/0 samples in micro-batches of 2: ranks run 3, 2 and 0 real rounds (the rest are ghost
    rounds); rank 2 never runs the model but holds the largest shard."""
    ref = dp_cases.reference(8, STEPS)
    plan = zero_plan([0.625, 0.375, 0.0], 8, stage, fractions=[0.2, 0.3, 0.5], micro=2)
    results = pool3.run(zero_cases.case_zero_train, plan.to_yaml(), STEPS)
    check(results, *ref)
    stats = results[2][2][-1]
    assert stats["reduce_bytes"] > 0 and (stage < 3 or stats["gather_bytes"] > 0)
    if stage == 3:   # every collective is started inside the rounds, by the thread that computes
        assert 0 < stats["issue_s"] <= stats["compute_s"], stats


@pytest.mark.parametrize("prefetch, reshard", [(0, True), (3, True), (1, False)])
def test_zero3_prefetch_depths_and_keeping_parameters(pool3, prefetch, reshard):
    ref = dp_cases.reference(10, STEPS)
    plan = zero_plan([0.5, 0.3, 0.2], 10, 3, fractions=[0.6, 0.1, 0.3], micro=2, prefetch=prefetch,
                     reshard_after_forward=reshard)
    results = pool3.run(zero_cases.case_zero_train, plan.to_yaml(), STEPS)
    check(results, *ref)
    # Each unit but the last (kept for backward) is gathered twice per round unless kept: bytes say so.
    forward_only = zero_plan([0.5, 0.3, 0.2], 10, 3, fractions=[0.6, 0.1, 0.3], micro=2, prefetch=prefetch,
                             reshard_after_forward=False)
    if reshard:
        kept = pool3.run(zero_cases.case_zero_train, forward_only.to_yaml(), 1)
        assert results[0][2][0]["gather_bytes"] > kept[0][2][0]["gather_bytes"]


def test_zero3_adamw_and_hf_model(pool3):
    ref = dp_cases.reference(10, STEPS, optimizer="adamw", kind="hf")
    plan = zero_plan([0.5, 0.3, 0.2], 10, 3, fractions=[0.2, 0.5, 0.3])
    results = pool3.run(zero_cases.case_zero_train, plan.to_yaml(), STEPS, "adamw", None, "hf")
    check(results, *ref, params=False, loss_rtol=1e-4)


@pytest.mark.parametrize("stage", [2, 3])
def test_island_layout_shards_inside_islands(pool4, stage):
    """HSDP: islands {0,1} and {2,3}, shards 0.7/0.3 inside each, shards all-reduced across islands."""
    ref = dp_cases.reference(10, STEPS)
    plan = zero_plan([0.4, 0.1, 0.3, 0.2], 10, stage, fractions=[0.7, 0.3, 0.7, 0.3], micro=2,
                     zero_layout="island")
    results = pool4.run(zero_cases.case_zero_train, plan.to_yaml(), STEPS, "sgd", ["a", "a", "b", "b"])
    check(results, *ref)


def test_island_layout_refuses_unequal_islands(pool3):
    plan = zero_plan([0.4, 0.3, 0.3], 10, 3, zero_layout="island")
    with pytest.raises(Exception, match="islands must have equal sizes; they have \\[2, 1\\]"):
        pool3.run(zero_cases.case_zero_train, plan.to_yaml(), 1, "sgd", ["a", "a", "b"])


@pytest.mark.parametrize("what, message", [
    ("lbfgs", "torch.optim.LBFGS takes a closure and a line search"),
    ("model-params", "build it over ParallelModel.parameters"),
    ("tied", "belongs to both embed and head \\(tied weights\\)"),
])
def test_bad_setups_raise_on_every_rank(pool3, what, message):
    import re

    plan = zero_plan([0.5, 0.3, 0.2], 10, 2)
    errors = pool3.run(zero_cases.case_zero_error, plan.to_yaml(), what)
    for e in errors:
        assert e is not None and re.search(message, e), e


def test_plan_checks_shard_fractions():
    with pytest.raises(PlanError, match="shard fractions sum to 0.9 .*must sum to 1"):
        zero_plan([0.5, 0.5], 4, 3, fractions=[0.6, 0.3])
    with pytest.raises(PlanError, match="ranks\\[1\\].shard_fraction: missing"):
        zero_plan([0.5, 0.5], 4, 3, fractions=[1.0, None])
    plan = zero_plan([0.5, 0.5], 4, 3)
    plan.ranks[1].zero_stage = 2
    with pytest.raises(PlanError, match="same ZeRO stage \\(rank 0: 3, rank 1: 2\\)"):
        plan.validate()
    with pytest.raises(PlanError, match="cannot be combined with sync_every 4"):
        zero_plan([0.5, 0.5], 4, 1, sync_every=4)
    with pytest.raises(PlanError, match="zero_layout: must be one of flat, island"):
        zero_plan([0.5, 0.5], 4, 1, zero_layout="ring")


def _ckpt_plan(stage, fractions):
    return zero_plan([0.5, 0.3, 0.2], 10, stage, fractions=fractions).to_yaml()


@pytest.mark.parametrize("a, b", [
    ((3, [0.2, 0.5, 0.3]), (3, [0.2, 0.5, 0.3])),      # same plan: resume is exact
    ((3, [0.2, 0.5, 0.3]), (1, [0.6, 0.0, 0.4])),      # other stage, other fractions, one rank holds nothing
    ((2, None), (3, [0.1, 0.1, 0.8])),
])
def test_checkpoint_resume_across_plans(pool3, tmp_path, a, b):
    """2 AdamW steps, save, load into a fresh (deliberately different) model under another plan, 2 more:
    the losses of uninterrupted training (AdamW's state is in the checkpoint, else step 3 would differ)."""
    import numpy as np

    from hcomm.parallel.zero import state

    ref_losses, _ = dp_cases.reference(10, 4, optimizer="adamw")
    path = str(tmp_path / "ckpt")
    results = pool3.run(zero_cases.case_zero_resume, _ckpt_plan(*a), _ckpt_plan(*b), path, 2, 2)
    for losses, _ in results:
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    # and the checkpoint (after step 2) loads into one plain process
    model = dp_cases.build()
    extra = state.load_into_model(path, model)
    assert extra["step"] == 2 and extra["optimizer"] == "AdamW"
    ref_model = dp_cases.build()
    opt = dp_cases.make_optimizer(ref_model.parameters(), "adamw")
    data = dp_cases.batches(10)
    for step in range(2):
        opt.zero_grad()
        ref_model.loss(data.global_batch_rows(step), reduction="mean").backward()
        opt.step()
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), atol=1e-5, err_msg=name)


def test_checkpoint_of_another_model_is_refused(tmp_path, pool3):
    from hcomm.models import LlamaConfig, build_model
    from hcomm.parallel.zero import state

    path = str(tmp_path / "ckpt")
    pool3.run(zero_cases.case_zero_resume, _ckpt_plan(3, None), _ckpt_plan(3, None), path, 1, 0)
    other = build_model(LlamaConfig(vocab_size=dp_cases.VOCAB, dim=32, n_layers=3, n_heads=4, max_seq_len=32))
    with pytest.raises(ValueError, match="does not hold parameters \\['blocks.2"):
        state.load_into_model(path, other)
    wider = build_model(LlamaConfig(vocab_size=dp_cases.VOCAB, dim=64, n_layers=2, n_heads=4, max_seq_len=32))
    with pytest.raises(ValueError, match="embed.weight has shape \\(97, 32\\), the model's is \\(97, 64\\)"):
        state.load_into_model(path, wider)


def test_checkpoint_from_three_ranks_resumes_on_four(pool3, pool4, tmp_path):
    """Saved by ZeRO-3 on 3 ranks (fractions 0.2/0.5/0.3), resumed by ZeRO-2 on 4 ranks (other shares and
    fractions): the losses of uninterrupted training."""
    import numpy as np

    ref_losses, _ = dp_cases.reference(10, 4, optimizer="adamw")
    path = str(tmp_path / "ckpt")
    a = _ckpt_plan(3, [0.2, 0.5, 0.3])
    b = zero_plan([0.4, 0.3, 0.2, 0.1], 10, 2, fractions=[0.1, 0.2, 0.3, 0.4]).to_yaml()
    first = pool3.run(zero_cases.case_zero_resume, a, b, path, 2, 2, (0,))
    second = pool4.run(zero_cases.case_zero_resume, a, b, path, 2, 2, (1,))
    for (losses_a, _), (losses_b, _) in zip(first + first[:1], second):
        np.testing.assert_allclose(losses_a + losses_b, ref_losses, rtol=1e-4)


def test_fsdp2_over_hcomm_equals_hcomm_zero3_on_an_even_split(pool3):
    """torch's own FSDP2 running on the hcomm backend and hcomm's ZeRO-3, same even split: same losses
    (both are single-process training up to reduction order; 1e-5 relative, SGD)."""
    import numpy as np

    plan = zero_plan([1 / 3] * 3, 9, 3)
    ours = pool3.run(zero_cases.case_zero_train, plan.to_yaml(), STEPS)
    theirs = pool3.run(zero_cases.case_fsdp2_over_hcomm, plan.to_yaml(), STEPS)
    ref_losses, _ = dp_cases.reference(9, STEPS)
    for (losses, _, _), fsdp in zip(ours, theirs):
        np.testing.assert_allclose(fsdp, losses, rtol=LOSS_RTOL)
        np.testing.assert_allclose(fsdp, ref_losses, rtol=LOSS_RTOL)
