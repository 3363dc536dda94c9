"""One ``hcomm train --local`` run of several plans on the tiny model, for the end-to-end equivalence tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

import pytest

from tests.helpers.launch import LOCAL_LAUNCH

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--local", "--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--vocab", "512",
        "--data-bytes", "600000", "--profile-budget", "1", "--eval-batches", "2"]


def train_local(tmp, plans: List[str], steps: int, *extra: str, env: Optional[Dict[str, str]] = None
                ) -> Tuple[Dict[str, dict], str]:
    """Every plan of ``plans`` trained ``steps`` steps in one run; (runs by plan name, stdout).
    ``env``: settings for this run.  A failing run fails the test with the lines that say why and the
    full log's path."""
    out_json = tmp / "run.json"
    env = dict(os.environ, PYTHONPATH=REPO, **LOCAL_LAUNCH,
               HCOMM_PROFILE_CACHE=str(tmp / "profiles"), OMP_NUM_THREADS="1", **(env or {}))
    out = subprocess.run([sys.executable, "-m", "hcomm", "train", *TINY, "--steps", str(steps), "--warmup-steps", "1",
                          *extra, "--plan", ",".join(plans), "--json", str(out_json)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:   # the first lines that say why, not only the launcher's tail
        text = out.stdout + out.stderr
        why = [line for line in text.splitlines() if "rror" in line or "raise" in line][:40]
        (tmp / "train.log").write_text(text)
        pytest.fail(f"hcomm train exited {out.returncode}; full log {tmp / 'train.log'}\n" + "\n".join(why))
    doc = json.loads(out_json.read_text())
    assert len(doc["runs"]) == len(plans)
    return {run["plan"]["name"]: run for run in doc["runs"]}, out.stdout


def plan_local(tmp, *args: str) -> str:
    """``hcomm plan --local`` on the tiny model (no training); its stdout."""
    env = dict(os.environ, PYTHONPATH=REPO, **LOCAL_LAUNCH,
               HCOMM_PROFILE_CACHE=str(tmp / "profiles"), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "hcomm", "plan", *TINY, *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def assert_reference_losses(runs: Dict[str, dict], reference: str, steps: int, rel_of) -> List[float]:
    """Every run's per-step and eval loss equal the torch DDP reference's within ``rel_of(name)``
    (relative); every step ran the whole global batch on 4 ranks.  The reference's losses."""
    ref = runs[reference]
    assert ref["plan"]["backend"] == "ddp-gloo"
    want = [s["loss"] for s in ref["steps"]]
    assert len(want) == steps and want[-1] < want[0]
    for name, run in runs.items():
        rel = rel_of(name)
        assert [s["loss"] for s in run["steps"]] == pytest.approx(want, rel=rel), name
        assert all(s["tokens"] == 8 * 32 and len(s["ranks"]) == 4 for s in run["steps"]), name
        # the whole model at the end (stages gathered / shards evaluated together) gives the same eval loss
        assert run["eval_loss"] == pytest.approx(ref["eval_loss"], rel=rel), name
    return want
