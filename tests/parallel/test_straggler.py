"""Stragglers: the watch's decisions by hand, and the trainer re-splitting when a rank turns slow."""
import math

import numpy as np
import pytest

from hcomm.parallel.plan import Plan, PlanError
from hcomm.parallel.straggler import StragglerWatch
from tests.parallel import dp_cases, straggler_cases


def test_watch_sets_a_baseline_then_needs_patience_steps_beyond_the_margin():
    w = StragglerWatch(margin=0.3, patience=3, settle=2)
    assert w.observe([1.0, 2.0, math.nan]) is None and w.observe([1.2, 2.2, math.nan]) is None
    # baseline = medians [1.1, 2.1]; rank 1 at +43 % twice, back inside, then three times in a row
    assert w.observe([1.1, 3.0, math.nan]) is None and w.observe([1.1, 3.0, math.nan]) is None
    assert w.observe([1.1, 2.5, math.nan]) is None                 # +19 %: the streak starts over
    assert w.observe([1.1, 3.0, math.nan]) is None and w.observe([1.1, 3.0, math.nan]) is None
    assert w.observe([1.1, 3.0, math.nan]) == [1]
    assert w.drift([1.1, 3.0, math.nan])[:2] == pytest.approx([0.0, 3.0 / 2.1 - 1])
    assert math.isnan(w.drift([1.1, 3.0, math.nan])[2])
    w.reset()
    assert w.observe([1.1, 3.0, 1.0]) is None and all(math.isnan(d) for d in w.drift([1.0, 1.0, 1.0]))


def test_a_rank_that_got_faster_also_counts_and_margin_zero_never_fires():
    w = StragglerWatch(margin=0.3, patience=1, settle=1)
    w.observe([2.0, 2.0])
    assert w.observe([1.0, 2.1]) == [0]          # -50 %: the split wastes the faster rank too
    never = StragglerWatch(margin=0.0)
    assert all(never.observe([1.0, x]) is None for x in (1.0, 5.0, 50.0, 500.0))


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="straggler margin must be >= 0"):
        StragglerWatch(margin=-0.1)
    with pytest.raises(ValueError, match="patience and settle must be >= 1"):
        StragglerWatch(patience=0)
    plan = Plan.from_shares([0.5, 0.5], 4, 16)
    plan.dp_group().straggler_margin = 0.3
    plan.backend = "ddp-gloo"
    with pytest.raises(PlanError, match=r"groups \['dp'\]: straggler_margin re-splits the rows of hcomm's data "
                                        r"parallelism \(plain, ZeRO, TP groups\) or re-cuts a pipeline's layers, "
                                        r"not with backend ddp-gloo"):
        plan.validate()
    plan.backend = "hcomm"
    plan.dp_group().sync_every = 4
    with pytest.raises(PlanError, match="re-splitting the batch is not supported with sync_every 4"):
        plan.validate()
    plan.dp_group().sync_every = 1
    plan.ranks[0].zero_stage = plan.ranks[1].zero_stage = 1
    plan.validate()   # ZeRO: rows move, shards stay
    plan.ranks[0].zero_stage = plan.ranks[1].zero_stage = 0
    plan.dp_group().straggler_patience = 0
    with pytest.raises(PlanError, match=r"groups\[0\].straggler_patience: must be >= 1, got 0"):
        plan.validate()


STEPS = 10
SLOW_FROM = 4       # rank 1 sleeps from step 4 (0-based) on
PATIENCE = 3


@pytest.mark.xfail(strict=False, reason="timing: in 3 of the last 4 full-suite runs on the 2-core box, steps before "
                                        "the slowdown ran ~700 ms instead of ~100 ms and the watch's baseline was "
                                        "inflated; cause not found yet (passes alone)")
def test_trainer_resplits_when_a_rank_turns_slow_and_keeps_the_losses(pool3):
    """Equivalence: re-splitting moves rows, not the global batch, so every step's loss is the single
    process's (AdamW fused vs not: 1e-4 relative, as test_data_parallel's AdamW case)."""
    # one bucket, launched when backward ends: on this 2-core box a comm thread polling for the sleeping
    # rank would otherwise slow the others' backward too and make them look like stragglers
    plan = Plan.from_shares([1 / 3] * 3, 12, dp_cases.SEQ, name="watched", bucket_bytes=1 << 30)
    # the tiny model computes ~1-5 ms per sample and this box adds spikes of ~10-40 ms to single steps:
    # only a rank at least 3x slower than its baseline for 3 steps counts (the sleep adds 300 ms/sample)
    plan.dp_group().straggler_margin = 2.0
    plan.dp_group().straggler_patience = PATIENCE
    results = pool3.run(straggler_cases.case_straggler, plan.to_yaml(), STEPS, 1, SLOW_FROM, 0.3)
    replans, losses, counts, _ = results[0]
    # baseline: the median of steps 1-3 (one stalled step among them does not move it; a full-suite
    # run saw a 645 ms stall in step 2); rank 1 is ~30x slower in steps 4, 5 and 6: re-split after step 7
    assert replans, "the slow rank was never caught"
    first = replans[0]
    assert first["drifted"] == [1] and first["after_steps"] == SLOW_FROM + PATIENCE
    # by the seconds per sample just measured: the slow rank gives samples away, the total stays
    assert first["from"] == [4, 4, 4] and first["to"][1] < 4 and sum(first["to"]) == 12
    assert counts[1] < 4 and sum(counts) == 12
    assert all(r[0] == replans for r in results)             # every rank took the same decision
    ref_losses, _ = dp_cases.reference(12, STEPS, "adamw")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    for _, _, _, params in results[1:]:                     # and ends with the same parameters, bit for bit
        for a, b in zip(results[0][3], params):
            assert (a == b).all()


def test_hcomm_train_resplits_zero_rows_and_tp_shards_when_a_rank_turns_slow(tmp_path):
    """ZeRO-2 and TP groups of 2 on 4 local ranks, rank 1 slowed from step 4 (HCOMM_TRAIN_SLOW): the watch
    moves rows away from rank 1 under ZeRO (its rounds; shards stay) and gives it a smaller TP shard (the
    state cut again: ``tensor.reshard``), and every step's loss and the eval loss are torch DDP's on the
    same global batches (fp32; the reductions sum in another order: 1e-4, as the other end-to-end
    equivalence tests).  Rows re-split across TP groups: test_tensor_reshard.py's choice test."""
    from tests.parallel.train_runs import assert_reference_losses, train_local

    plans = ["auto@zero=2@straggler=2", "auto@tp=2@straggler=2", "uniform"]
    for folder in (tmp_path, tmp_path / "again"):
        folder.mkdir(exist_ok=True)
        runs, out = train_local(folder, plans, 10, "--resplit-after", "0", env={"HCOMM_TRAIN_SLOW": "1:4:0.05"})
        # From its profile alone rank 1 can rightly get no rows (a clean-clone run profiled one of its
        # blocks at 46 ms against ~1 ms, a stall, and ZeRO let it reduce only); a rank without rows has
        # nothing to move away when it turns slow, so the precondition is measured again, once
        if runs[plans[0]]["plan"]["ranks"][1]["batch_share"] != 0:
            break
    zero, tp = runs[plans[0]], runs[plans[1]]
    for run in (zero, tp):
        assert len(run["replans"]) == 1, out[-3000:]
        assert run["replans"][0]["after_steps"] == 7 and 1 in run["replans"][0]["drifted"], run["replans"]
    moved = zero["replans"][0]
    assert moved["to"][1] < moved["from"][1] and sum(moved["to"]) == sum(moved["from"]) == 8, moved
    assert zero["counts"] == moved["to"]
    # TP: rank 1's own work drifted (its partner's waits inside the TP collectives are left out); the
    # replanner weighs new shards (rank 1 the smaller fraction) against moving rows to the other group by
    # their predicted steps for the 3 steps left -- on the tiny model either can win, each must be right
    moved = tp["replans"][0]
    assert moved["drifted"] == [1] and moved["what"] in ("re-sharded", "re-split"), moved
    assert [o["what"] for o in moved["options"]] == ["re-split the rows", "re-split the shards"], moved
    if moved["what"] == "re-sharded":
        fraction = {r: f for ranks, fractions, _ in moved["to"] for r, f in zip(ranks, fractions)}
        before = {r: f for ranks, fractions, _ in moved["from"] for r, f in zip(ranks, fractions)}
        assert fraction[1] < before[1] and fraction[1] < 0.5, moved
        assert sum(rows for _, _, rows in moved["to"]) == 8
        assert tp["counts"] == [rows for r in range(4) for ranks, _, rows in moved["to"] if r in ranks], \
            (tp["counts"], moved)   # every member runs its group's rows
        assert "new TP shards after step 7" in out
    else:   # the group's rows move as one and stay on its first rank
        groups = [g["ranks"] for g in tp["plan"]["groups"] if g["name"].startswith("tp:")]
        slow = next(g for g in groups if 1 in g)
        assert moved["to"][slow[0]] < moved["from"][slow[0]] and sum(moved["to"]) == 8, (moved, groups)
        assert all(moved["to"][r] == 0 for g in groups for r in g[1:]), (moved, groups)
    assert "re-split after step 7" in out
    assert_reference_losses(runs, "uniform", 10, lambda name: 1e-4)
