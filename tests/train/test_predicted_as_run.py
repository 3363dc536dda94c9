"""The prediction a measurement is held to: after a re-split by measured compute moved rows before the
warm-up ended, the simulator's step for the plan with those rows (``loop.predicted_as_run``), which the
report shows and ``bench_accuracy.py`` compares; otherwise none (nan: the plan's own prediction holds)."""
import copy
import math

import pytest

from hcomm.parallel.planner.data import plan_data_parallel
from hcomm.parallel.planner.simulate import simulate
from hcomm.train.loop import PlanResult, predicted_as_run
from tests.parallel.test_plan_pipeline import view


def _plan_and_view():
    v = view([1.0, 1.0, 0.5, 0.5])
    plan, _ = plan_data_parallel(v, 12, 16)
    return plan, v


def test_a_resplit_before_the_warmup_ends_is_predicted_with_its_rows():
    plan, v = _plan_and_view()
    planned = plan.batch_counts()
    assert planned[0] > planned[2], planned   # by speed: the half-speed ranks get fewer rows
    moved = [3, 3, 3, 3]   # what a re-split could give if the slow ranks measured as fast
    result = PlanResult(plan.name, predicted_step_s=plan.predicted_step_s,
                        resplit={"after_steps": 3, "from": planned, "to": moved})
    as_run = predicted_as_run(plan, result, v, warmup_steps=4)
    expected = copy.deepcopy(plan)   # the same plan, buckets and micro-batches, with the rows moved
    for rank in expected.ranks:
        rank.batch_share = 0.25
    assert expected.batch_counts() == moved
    assert as_run == pytest.approx(simulate(expected, v).step_s, rel=1e-12)
    # the half-speed ranks' three rows set the step: slower than the plan as predicted
    assert as_run > simulate(plan, v).step_s
    assert plan.batch_counts() == planned   # the plan itself is left as it was


def test_no_as_run_prediction_when_nothing_moved_or_a_measured_step_came_before_the_move():
    plan, v = _plan_and_view()
    planned = plan.batch_counts()
    same = PlanResult(plan.name, resplit={"after_steps": 3, "from": planned, "to": planned})
    late = PlanResult(plan.name, resplit={"after_steps": 5, "from": planned, "to": [3, 3, 3, 3]})
    for result in (same, late, PlanResult(plan.name)):
        assert math.isnan(predicted_as_run(plan, result, v, warmup_steps=4))
