"""``hcomm train`` on the emulated default cluster (needs root; skipped otherwise).

The tiny model, a few steps: the auto plan must give the half-speed V100
ranks fewer samples than the A100 ranks (measured, not told), train, and
agree with the uniform baseline's losses; a rank whose memory cannot hold
the model must stop every rank before training with the rank and kind named;
pipelines and tensor parallelism put more of the work on the faster rank,
and per-device precision picks each emulated device kind's dtype; every plan the
search trials runs there, and the one it trains keeps the baseline's losses.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.emulate.helpers import REPO

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = ["--model", "tiny", "--seq-len", "32", "--vocab", "512", "--data-bytes", "600000",
        "--profile-budget", "3", "--eval-batches", "2"]


def _train(tmp_path, *args, timeout=400):
    env = dict(os.environ, PYTHONPATH=REPO,
               HCOMM_PROFILE_CACHE=str(tmp_path / "profiles"))
    return subprocess.run([sys.executable, "-m", "hcomm", "train", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_auto_and_searched_plans_follow_measured_speed_on_mixed(emulator, tmp_path):
    """mixed (4 ranks, two kinds, two islands), one run (each emulated launch costs ~40 s of CI): the
    auto plan gives the half-speed V100 ranks fewer samples than the A100s (measured, not told); the
    search's best plans of distinct kinds each run four steps there (the trial) and the fastest measured
    trains; both train the uniform baseline's losses (fp32; TP and pipelines sum in another order: 1e-4)."""
    out_json = tmp_path / "run.json"
    out = _train(tmp_path, "--cluster", "mixed", *TINY, "--global-batch", "24", "--steps", "3",
                 "--plan", "auto,search,uniform", "--json", str(out_json))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    doc = json.loads(out_json.read_text())
    auto, searched, uniform = doc["runs"]
    shares = [r["batch_share"] for r in auto["plan"]["ranks"]]
    assert doc["cluster"]["devices"] == ["A100", "A100", "V100", "V100"]
    emulated = [line for line in out.stdout.splitlines() if "hcomm emulate: speed 1.0" in line]
    assert shares[0] + shares[1] > shares[2] + shares[3], (shares, emulated)
    trial = [line for line in out.stdout.splitlines() if "trial of the search's best plans" in line]
    assert len(trial) == 1 and trial[0].count(" vs ") >= 2, out.stdout[-3000:]
    assert searched["plan"]["name"] == "search" and any(n.startswith("trial (") for n in searched["plan"]["notes"])
    for a, q, u in zip(auto["steps"], searched["steps"], uniform["steps"]):
        assert a["loss"] == pytest.approx(u["loss"], rel=1e-4) and q["loss"] == pytest.approx(u["loss"], rel=1e-4)


def test_a_model_that_does_not_fit_stops_every_rank_first(emulator, tmp_path):
    model = tmp_path / "twelve-layers.yaml"
    model.write_text("base: small\nn_layers: 12\n")  # 21.6M parameters at vocab 512: 0.35 GB of state
    out = _train(tmp_path, "--cluster", os.path.join(HERE, "tiny-memory.yaml"), "--model", str(model),
                 "--seq-len", "32", "--vocab", "512", "--data-bytes", "600000", "--profile-budget", "2",
                 "--global-batch", "4", "--steps", "2", "--plan", "auto")
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    for rank in (0, 1):
        assert f"r{rank}] hcomm train: error: the model does not fit rank 1 (V100): parameters, gradients" in text


def test_pipelines_and_tp_put_more_work_on_the_faster_rank(emulator, tmp_path):
    """mixed-speed (A100 @1.0, V100 @0.5), one run of five plans (each emulated launch costs ~40 s of CI).

    Two stages: the planned pieces follow the measured speeds, each rank's pieces weighed on its own
    profile (the planner's view): the A100 rank holds a larger share of its own whole-model seconds than
    the V100 does of its own (balanced stages make the ratio of shares the speed ratio, 2x here).  One
    rank's profile alone is not the scale: a stall while rank 0 profiled one layer once made that layer
    look twice as slow to the planner, which then rightly gave it to rank 1.

    One TP group of 2: auto gives the A100 the larger shard of every split, per-device precision gives it
    bf16 and the V100 fp16 (from the emulated device kinds).  Every plan trains the uniform pipeline's
    losses (same global batches, fp32: 1e-4), the mixed dtypes within 2^-9."""
    for folder in (tmp_path, tmp_path / "again"):
        folder.mkdir(exist_ok=True)
        out_json = folder / "run.json"
        out = _train(folder, "--cluster", "mixed-speed", *TINY, "--global-batch", "8", "--steps", "2",
                     "--plan", "auto@pp=2,uniform@pp=2,auto@tp=2,uniform@tp=2,auto@tp=2@precision=per-device@sp=1",
                     "--json", str(out_json))
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
        doc = json.loads(out_json.read_text())
        auto, uniform, tp_auto, tp_uniform, mixed = doc["runs"]
        pp = next(g for g in auto["plan"]["groups"] if g["name"].startswith("pp:"))
        cuts, order, v = pp["cuts"], pp["ranks"], pp.get("virtual_stages", 1)
        seconds = {r: [c["fwd_s"] + c["bwd_s"] for c in doc["cluster"]["profiles"][r]["layers"]] for r in order}
        # The emulated 2x gap must show in the profiles for the planner to follow it.  A clean-clone CI
        # run once profiled the A100 rank at 53 ms and the V100 at 62 ms for the model (~37 / ~80 here):
        # the emulator, not the planner, missed its speeds that launch, so the precondition is measured
        # again, once, in a fresh launch (the quotas retuned anew)
        if sum(seconds[1]) > 1.2 * sum(seconds[0]):
            break
    emulated = [line for line in (out.stdout + out.stderr).splitlines() if "hcomm emulate: speed 1.0" in line]
    assert sum(seconds[1]) > 1.2 * sum(seconds[0]), (seconds, emulated)
    share = {r: 0.0 for r in order}
    for k in range(len(cuts) - 1):
        r = order[k % len(order)]
        share[r] += sum(seconds[r][cuts[k]:cuts[k + 1]]) / sum(seconds[r])
    assert share[0] > share[1], (cuts, order, v, share, seconds)
    assert auto["predicted_step_s"] < uniform["predicted_step_s"]

    fractions = [r.get("tp_fraction", 1.0) for r in tp_auto["plan"]["ranks"]]
    assert fractions[0] > fractions[1] and [r.get("tp_fraction", 1.0) for r in tp_uniform["plan"]["ranks"]] == [0.5, 0.5]
    assert [r.get("compute_dtype", "fp32") for r in mixed["plan"]["ranks"]] == ["bf16", "fp16"]
    for i, u in enumerate(uniform["steps"]):
        for fp32 in (auto, tp_auto, tp_uniform):
            assert fp32["steps"][i]["loss"] == pytest.approx(u["loss"], rel=1e-4)
        assert mixed["steps"][i]["loss"] == pytest.approx(u["loss"], rel=2.0 ** -9) and not mixed["steps"][i]["skipped"]


def test_a_killed_rank_of_the_other_island_restarts_from_the_checkpoint(emulator, tmp_path):
    """two-node spec (islands x and y over the emulated uplinks), a pipeline across them: rank 1, alone on
    the other island's node, is SIGKILLed as step 3 begins; both nodes' torchruns restart their ranks,
    which load the stage each wrote (the checkpoint after step 2) and reach the uninterrupted run's
    losses (same saved plan; within 1e-6).  The data-parallel restart is tests/train's."""
    spec, plan = os.path.join(HERE, "small.yaml"), tmp_path / "plan.yaml"
    common = ["--cluster", spec, *TINY, "--global-batch", "6", "--steps", "5", "--warmup-steps", "1",
              "--resplit-after", "0", "--straggler-margin", "0"]
    ref = _train(tmp_path, *common, "--plan", "auto@pp=2", "--save-plan", str(plan),
                 "--json", str(tmp_path / "ref.json"))
    assert ref.returncode == 0, ref.stdout[-4000:] + ref.stderr[-3000:]
    from hcomm.parallel.plan import Plan

    assert [g.ranks for g in Plan.from_yaml(plan.read_text()).pipeline_groups()] in ([[0, 1]], [[1, 0]])
    env_fault = dict(os.environ, HCOMM_TRAIN_FAULT="1:3")
    ckpt = tmp_path / "ckpt"
    out = subprocess.run([sys.executable, "-m", "hcomm", "train", *common, "--plan", str(plan),
                          "--checkpoint-every", "2", "--checkpoint-dir", str(ckpt), "--max-restarts", "1",
                          "--json", str(tmp_path / "fault.json")], cwd=REPO, timeout=500, capture_output=True,
                         text=True, env=dict(env_fault, PYTHONPATH=REPO,
                                             HCOMM_PROFILE_CACHE=str(tmp_path / "profiles")))
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-5000:]
    assert "HCOMM_TRAIN_FAULT: rank 1 kills itself at step 3" in text
    assert f"resumed from {ckpt}/step-2: steps 1-2 done, continuing at step 3 of 5" in text
    want = json.loads((tmp_path / "ref.json").read_text())["runs"][0]
    got = json.loads((tmp_path / "fault.json").read_text())["runs"][0]
    # bound as in tests/train/test_checkpoint_restart.py: runs differ by ~1e-8 on a loaded box
    assert [s["loss"] for s in got["steps"]] == pytest.approx([s["loss"] for s in want["steps"]], rel=1e-6)
    assert got["eval_loss"] == pytest.approx(want["eval_loss"], rel=1e-6)
