"""``--plan search`` end to end on local ranks: the search's best plans of distinct kinds each run a few
real steps (the trial), the fastest measured trains, and it trains the reference losses."""
import re

from tests.parallel.train_runs import assert_reference_losses, train_local

STEPS = 2


def test_search_trials_its_best_plans_and_trains_the_reference_losses(tmp_path):
    runs, out = train_local(tmp_path, ["search", "uniform"], STEPS)
    trial = re.search(r"trial of the search's best plans \(measured vs predicted ms per step\): (.*); fastest: (.*)", out)
    assert trial, out[-3000:]
    tried = trial.group(1).split("; ")
    assert len(tried) >= 2 and all(re.fullmatch(r"search -> .+ \d+ vs \d+", t) for t in tried), tried
    # the trained plan is one of those tried, named after the entry, and says what the trial measured
    plan = runs["search"]["plan"]
    assert trial.group(2).startswith("search -> ") and any(n.startswith("trial (") for n in plan["notes"])
    # vocab-parallel cross-entropy and pipelines sum in another order than DDP: 1e-4 relative in fp32
    assert_reference_losses(runs, "uniform", STEPS, lambda name: 1e-4)
