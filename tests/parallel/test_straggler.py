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
    with pytest.raises(PlanError, match=r"groups \['dp'\]: straggler_margin re-splits the batch of plain hcomm "
                                        r"data parallelism or re-cuts a pipeline's layers, not with backend "
                                        r"ddp-gloo"):
        plan.validate()
    plan.backend = "hcomm"
    plan.ranks[0].zero_stage = plan.ranks[1].zero_stage = 1
    with pytest.raises(PlanError, match="not with ZeRO"):
        plan.validate()
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
