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


def test_searched_plans_are_watched_and_replanned_as_auto_plans_of_their_kind():
    """Whichever candidate the trial keeps follows drift as the auto plan of its kind: data parallelism,
    ZeRO and TP groups re-split by default (margin 0.3), pipelines only when asked; a TP or pipeline plan
    gets the auto planner's call for its own shape as its replanner, and a re-plan keeps the entry's name
    and the watch."""
    import copy

    from hcomm.train.cli import parse
    from hcomm.train.plans import make_plans, replanner_for
    from tests.parallel.test_precision import _view

    view = _view(["A100", "A100", "V100", "V100"])
    for flags, pipeline_margin in (([], 0.0), (["--straggler-margin", "0.2"], 0.2)):
        args = parse(["--model", "tiny", "--plan", "search@trial=6", *flags])
        (plan,) = make_plans(args, view)
        kinds = {c.name.split(" -> ")[1]: c for c in plan.trial_plans}
        assert {"dp", "zero-1", "tp=2", "pp=2", "pp=2 tp=2"} <= set(kinds), list(kinds)
        for label, candidate in kinds.items():
            candidate = copy.deepcopy(candidate)
            candidate.name = plan.name   # as the trial hands the one it keeps on (worker.settle_trials)
            margin = pipeline_margin if candidate.pipeline_groups() else (0.2 if flags else 0.3)
            assert candidate.dp_group().straggler_margin == margin, label
            replanner = replanner_for(args, view, candidate)
            expect = None if not margin or not (candidate.pipeline_groups() or candidate.tensor_groups()) else \
                "PipelineReplanner" if candidate.pipeline_groups() else "TensorReplanner"
            assert (replanner and type(replanner).__name__) == expect, label
            if replanner is not None:   # rank 1 four times slower: a plan of the same shape, still watched
                new = replanner.replan(candidate, [1.0, 4.0, 1.0, 1.0], 10)
                assert new.name == "search@trial=6" and new.dp_group().straggler_margin == margin, label
                assert len(new.pipeline_groups()) == len(candidate.pipeline_groups()), label
                assert [g.ranks for g in new.tensor_groups()] == [g.ranks for g in candidate.tensor_groups()], label
    args = parse(["--model", "tiny", "--plan", "search@straggler=0"])
    assert all(p.dp_group().straggler_margin == 0 for p in make_plans(args, view)[0].trial_plans)


def test_a_searched_plan_follows_a_rank_that_turns_slow(tmp_path):
    """``search@straggler=2`` on local ranks, rank 1 slowed from step 4 (``HCOMM_TRAIN_SLOW``): whatever the
    search chose, the watch catches the drift after 3 steps and re-plans it (rows, shards or cuts, as the
    auto plan of that kind), and every step's loss and the eval loss stay torch DDP's (1e-4, as the other
    end-to-end equivalence tests: the reductions sum in another order)."""
    entry = "search@trial=0@straggler=2"
    runs, out = train_local(tmp_path, [entry, "uniform"], 10, "--resplit-after", "0",
                            env={"HCOMM_TRAIN_SLOW": "1:4:0.05"})
    replans = runs[entry]["replans"]
    assert len(replans) == 1 and replans[0]["after_steps"] == 7 and 1 in replans[0]["drifted"], \
        (replans, out[-3000:])
    assert_reference_losses(runs, "uniform", 10, lambda name: 1e-4)
