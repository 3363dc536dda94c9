"""``hcomm train --checkpoint-every N --max-restarts K``: a lost rank costs the steps since the last checkpoint.

4 local ranks (one torchrun per node, as on the emulator: islands of two),
the tiny model, ZeRO-2 over uneven rows in the island layout (HSDP: each
island shards the whole model, so only the first island writes; a save under
load once chose it and two ranks claimed the same ranges).  Every other
layout's files are tests/parallel/test_checkpoint_layouts.py's; a pipeline's
restart across islands is tests/emulate's.
A first run trains 6 steps uninterrupted and saves its plan; the second
trains the same plan with a checkpoint every 2 steps while rank 1 kills
itself (SIGKILL, HCOMM_TRAIN_FAULT) as step 3 begins: torchrun restarts every
rank, they resume from the checkpoint after step 2, and every step's global
loss and the final eval loss are those of the uninterrupted run (same plan,
same global batches, the optimizer's moments restored).  Usually bit for bit;
but two uninterrupted runs of the same plan on this loaded 2-core box already
differ by up to 1e-8 relative (fp32 kernels' reductions vary between runs),
so the bound is 1e-6: a resume that lost the optimizer's moments is off by
2e-2 at the next step, and one that lost the shares by 1e-3.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.helpers.launch import LOCAL_LAUNCH

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--local", "--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--vocab", "512",
        "--data-bytes", "600000", "--profile-budget", "1", "--eval-batches", "2", "--steps", "6",
        "--warmup-steps", "1", "--resplit-after", "0", "--straggler-margin", "0"]


def _train(tmp_path, *extra, fault=None, timeout=300):
    env = dict(os.environ, PYTHONPATH=REPO, **LOCAL_LAUNCH,
               HCOMM_PROFILE_CACHE=str(tmp_path / "profiles"))
    env.pop("HCOMM_TRAIN_FAULT", None)
    if fault:
        env["HCOMM_TRAIN_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "hcomm", "train", *TINY, *extra], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _failure(text: str) -> str:
    """A failed launch's own error lines first (torchrun's agents print pages of tracebacks after them)."""
    mine = [line for line in text.splitlines() if "hcomm train: error" in line or "Error:" in line]
    return "\n".join(mine[-40:]) + "\n...\n" + text[-2000:]


def _losses(path):
    run = json.loads(path.read_text())["runs"][0]
    return [s["loss"] for s in run["steps"]], run["eval_loss"], run["counts"]


def test_a_killed_rank_restarts_from_the_last_checkpoint_with_the_same_losses(tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    ref = _train(tmp_path, "--plan", "auto@zero=2", "--zero-layout", "island", "--dp-shares", "0.25,0.375,0.25,0.125",
                 "--save-plan", str(plan),
                 "--json", str(tmp_path / "ref.json"))
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    ckpt = tmp_path / "ckpt"
    out = _train(tmp_path, "--plan", str(plan), "--checkpoint-every", "2", "--checkpoint-dir", str(ckpt),
                 "--max-restarts", "1", "--json", str(tmp_path / "fault.json"), fault="1:3")
    text = out.stdout + out.stderr
    assert out.returncode == 0, _failure(text)
    assert "HCOMM_TRAIN_FAULT: rank 1 kills itself at step 3" in text
    assert f"resumed from {ckpt}/step-2: steps 1-2 done, continuing at step 3 of 6" in text
    assert f"checkpoint after step 4: {ckpt}/step-4" in text
    want, got = _losses(tmp_path / "ref.json"), _losses(tmp_path / "fault.json")
    assert got[0] == pytest.approx(want[0], rel=1e-6) and got[1] == pytest.approx(want[1], rel=1e-6), (got, want)
    assert got[2] == want[2] == [2, 3, 2, 1]  # the uneven shares survived the restart
    # Only the newest complete checkpoint is kept; no half-written one is left.
    assert sorted(os.listdir(ckpt)) == ["step-4"]
    assert os.path.isdir(ckpt / "step-4" / "zero")   # the ZeRO shards: the first island's ranks wrote them
    # Started again with --replan-on-resume under ZeRO-1 sharded over every rank: planned anew, each rank
    # reads its new ranges of the island-sharded files, steps 5-6 trained: the uninterrupted run's losses
    # within the bound of two plans that sum in other orders (fp32: 1e-4 relative, as the plans' reference
    # tests).
    moved = _train(tmp_path, "--plan", "auto@zero=1", "--zero-layout", "flat", "--checkpoint-every", "2",
                   "--checkpoint-dir", str(ckpt),
                   "--replan-on-resume", "--json", str(tmp_path / "moved.json"))
    text = moved.stdout + moved.stderr
    assert moved.returncode == 0, _failure(text)
    assert (f"resumed from {ckpt}/step-4: steps 1-4 done, continuing at step 5 of 6 (saved under plan "
            "'auto@zero=2', moved into plan 'auto@zero=1')") in text
    got = _losses(tmp_path / "moved.json")
    assert got[0] == pytest.approx(want[0], rel=1e-4) and got[1] == pytest.approx(want[1], rel=1e-4), (got, want)
    # Another run (another lr) pointed at this folder is refused by the launcher's argument check (the
    # one a launch makes before any rank starts: test_checkpoint_errors_are_named_before_training), not
    # resumed, and the checkpoint stays.
    error = _refused(capsys, "--plan", str(plan), "--lr", "0.01", "--checkpoint-every", "2",
                     "--checkpoint-dir", str(ckpt))
    assert (f"hcomm train: error: --checkpoint-dir {ckpt}: {ckpt}/step-4 is of another run (it differs in lr); "
            "give another --checkpoint-dir or remove it") in error
    assert sorted(os.listdir(ckpt)) == ["step-4"]


def _refused(capsys, *extra) -> str:
    """What ``hcomm train``'s argument check (``train.cli.parse``, run by the launcher before any rank
    starts) prints when it refuses ``extra`` (exit status 2), in this process."""
    from hcomm.train.cli import parse

    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        parse([*TINY, *extra])
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_checkpoint_errors_are_named_before_training(tmp_path, capsys):
    """Refused by the launcher before any rank starts (exit 2, nothing trained): one launch shows it end to
    end, the rest are the same argument check in this process."""
    out = _train(tmp_path, "--plan", "auto,uniform", "--checkpoint-every", "2", timeout=60)
    assert out.returncode == 2
    assert "--checkpoint-every trains one plan and resumes it; --plan lists 2 (auto,uniform)" in out.stderr
    assert "hcomm train:" not in out.stdout   # no launch line: no rank was started
    for extra, what in ((["--plan", "uniform", "--zero", "1"], "torch's ZeroRedundancyOptimizer"),
                        (["--plan", "uniform@zero=3"], "FSDP2"),
                        (["--plan", "auto@sync_every=4"], "outer sync every 4 steps")):
        error = _refused(capsys, *extra, "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "z"))
        assert (f"hcomm train: error: --checkpoint-every: plan '{extra[1]}' uses {what}; checkpoints cover "
                "data-parallel plans (hcomm's, with or without ZeRO, or the DDP baseline), pipelines and TP groups "
                "in this version") in error
    assert not (tmp_path / "z").exists()
    assert ("--replan-on-resume moves a checkpoint's state into a new plan; give --checkpoint-every N"
            in _refused(capsys, "--plan", "auto", "--replan-on-resume"))


def test_replan_on_resume_refuses_files_the_new_plan_cannot_read():
    """ZeRO's uneven 1-D shards load into ZeRO plans, the name-keyed files into every other kind."""
    from hcomm.parallel.plan import Plan
    from hcomm.train.checkpoint import check_movable

    dp = Plan.uniform(2, 4, 8)
    dp.backend, dp.name = "hcomm", "dp"
    zero = Plan.from_yaml(dp.to_yaml())
    zero.name = "z"
    for r in zero.ranks:
        r.zero_stage = 2
    assert check_movable(dp.to_yaml(), dp, "p") == "dp" and check_movable(zero.to_yaml(), zero, "p") == "z"
    with pytest.raises(ValueError, match=r"--replan-on-resume: p holds ZeRO shards \(plan 'z'\) and the new plan "
                                         r"'dp' is not ZeRO: pin the kind in --plan"):
        check_movable(zero.to_yaml(), dp, "p")
    with pytest.raises(ValueError, match=r"p holds whole tensors by name \(plan 'dp'\) and the new plan 'z' is ZeRO"):
        check_movable(dp.to_yaml(), zero, "p")


def test_rank_zero_refuses_a_checkpoint_of_another_plan_or_world_size(tmp_path):
    """What only the built plan tells (its YAML, the world size): rank 0's ``latest`` check, without a launch."""
    from hcomm.train.checkpoint import MARKER, latest

    step = tmp_path / "step-4"
    step.mkdir()
    (tmp_path / "step-2").mkdir()   # no marker: an unfinished save, never taken
    (step / MARKER).write_text(json.dumps({"steps_done": 4, "world_size": 4, "plan": "name: a\n", "lr": 0.001}))
    assert latest(str(tmp_path), {"plan": "name: a\n", "lr": 0.001}, 4) == (4, str(step))
    with pytest.raises(ValueError, match=rf"--checkpoint-dir {tmp_path}: {step} is of another run \(it differs in "
                                         r"plan\); give another --checkpoint-dir or remove it"):
        latest(str(tmp_path), {"plan": "name: b\n", "lr": 0.001}, 4)
    with pytest.raises(ValueError, match=rf"{step} was saved by 4 ranks, this run has 3"):
        latest(str(tmp_path), {"plan": "name: a\n", "lr": 0.001}, 3)
    assert latest(str(tmp_path / "none"), {}, 4) is None
