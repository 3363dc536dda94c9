"""``--plan search`` end to end on local ranks: the search's best plans of distinct kinds each run a few
real steps (the trial), the fastest measured trains, and it trains the reference losses."""
import math
import re

from tests.parallel.train_runs import assert_reference_losses, train_local

STEPS = 2


def test_search_trials_its_best_plans_and_trains_the_reference_losses(tmp_path):
    runs, out = train_local(tmp_path, ["search", "uniform"], STEPS)
    trial = re.search(r"trial of the search's best plans \(measured vs predicted ms per step\): (.*); chosen: (.*)", out)
    assert trial, out[-3000:]
    tried = trial.group(1).split("; ")
    assert len(tried) >= 2 and all(re.fullmatch(r"search -> .+ \d+ vs \d+", t) for t in tried), tried
    # the trained plan is one of those tried, named after the entry, and says what the trial measured
    plan = runs["search"]["plan"]
    assert trial.group(2).startswith("search -> ") and any(n.startswith("trial (") for n in plan["notes"])
    # vocab-parallel cross-entropy and pipelines sum in another order than DDP: 1e-4 relative in fp32
    assert_reference_losses(runs, "uniform", STEPS, lambda name: 1e-4)


def test_search_weighs_each_kinds_low_precision_by_measurement(tmp_path):
    """``search@precision=search``: every rank profiles fp32 and its kind's low dtype (the local ranks are
    A100s and V100s: bf16, fp16), the search runs on each assignment, and the plan trained carries the
    chosen dtypes (on a CPU without bf16 instructions autocast only adds casts: fp32 measures faster)."""
    entry = "search@trial=0@precision=search"
    runs, out = train_local(tmp_path, [entry], 2)
    plan = runs[entry]["plan"]
    measured = next(n for n in plan["notes"] if n.startswith("dtype per device (profiled fp32 vs low precision"))
    totals = {kind: (float(a), float(b)) for kind, a, b in re.findall(r"(A100|V100) ([\d.]+) vs ([\d.]+)", measured)}
    assert set(totals) == {"A100", "V100"} and all(a > 0 and b > 0 for a, b in totals.values()), measured
    searched = next(n for n in plan["notes"] if n.startswith("dtypes searched: fp32 (A100 fp32, V100 fp32): "))
    chosen = searched.rsplit("; chose ", 1)[1]
    low = {"A100": "bf16", "V100": "fp16"}
    expect = {"fp32": lambda k: "fp32", "low everywhere": lambda k: low[k],
              "faster per kind": lambda k: low[k] if totals[k][1] < totals[k][0] else "fp32"}[chosen]
    assert [r.get("compute_dtype", "fp32") for r in plan["ranks"]] == [expect(r["device"]) for r in plan["ranks"]], \
        searched
    losses = [s["loss"] for s in runs[entry]["steps"]]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
