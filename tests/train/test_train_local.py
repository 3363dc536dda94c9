"""``hcomm train`` end to end on 4 local (unshaped) ranks: the tiny model, a few steps.

auto (hcomm, speed-planned shares, planned buckets) and uniform (torch DDP
over gloo, equal batches) run the same global batches from the same seed,
so in fp32 their per-step global losses must agree: AdamW's first steps are
sign-like (m/sqrt(v)), so reduction-order differences stay at the 1e-6
level; we allow 1e-4 relative.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.helpers.launch import LOCAL_LAUNCH

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--local", "--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--vocab", "512",
        "--data-bytes", "600000", "--profile-budget", "1", "--eval-batches", "2"]


def _train(tmp_path, *extra, timeout=240):
    env = dict(os.environ, PYTHONPATH=REPO, **LOCAL_LAUNCH,
               HCOMM_PROFILE_CACHE=str(tmp_path / "profiles"))
    return subprocess.run([sys.executable, "-m", "hcomm", "train", *TINY, *extra], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_auto_and_uniform_train_the_same_losses(tmp_path):
    out_json, out_png = tmp_path / "run.json", tmp_path / "run.png"
    out = _train(tmp_path, "--steps", "4", "--warmup-steps", "1", "--plan", "auto,uniform",
                 "--json", str(out_json), "--plot", str(out_png))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "speed-up auto vs uniform" in out.stdout
    doc = json.loads(out_json.read_text())
    auto, uniform = doc["runs"]
    assert auto["plan"]["name"] == "auto" and uniform["plan"]["backend"] == "ddp-gloo"
    assert len(auto["steps"]) == len(uniform["steps"]) == 4
    for a, u in zip(auto["steps"], uniform["steps"]):
        assert a["loss"] == pytest.approx(u["loss"], rel=1e-4)
        assert a["tokens"] == 8 * 32 and len(a["ranks"]) == 4
        for r in a["ranks"]:
            assert r["compute_s"] >= 0 and r["comm_s"] >= 0 and r["idle_s"] >= 0
    assert auto["steps"][-1]["loss"] < auto["steps"][0]["loss"]
    assert auto["tokens_per_s"] > 0 and uniform["tokens_per_s"] > 0
    assert len(doc["cluster"]["profiles"]) == 4 and doc["environment"]["torch"]
    assert out_png.stat().st_size > 10_000


def test_plan_and_data_errors_reach_every_rank(tmp_path):
    out = _train(tmp_path, "--steps", "2", "--global-batch", "3", "--plan", "uniform", timeout=180)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout + out.stderr
    for rank in range(4):
        assert f"r{rank}] hcomm train: error: global_batch 3 is smaller than the 4 ranks" in text
