"""Emulator fault injection (issue #18 items 2-3): cut a link, kill or stall a rank mid all_reduce.

Each case runs tests/emulate/faultcheck.py (group timeout 6 s) on ``small``
(two islands, one rank each), waits for rank 0's ready file (10 good
all_reduces), applies the fault through ``Cluster.faults()`` and checks which
ranks raised, with what, how soon, and that every rank process is gone.
"""
import io
import os
import re
import threading
import time
import warnings

import pytest

from helpers import REPO
from hcomm.emulate import faults

SMALL = os.path.join(REPO, "tests/emulate/small.yaml")
JOB = os.path.join(REPO, "tests/emulate/faultcheck.py")
TIMEOUT_S = 6.0
SLACK_S = 3.0  # two shared cores: the wake-up after a timeout is not instant
LINE = re.compile(r"FAULT (\d) raised ([\d.]+) (\w+): (.*)")


def test_schedule_parses_and_rejects():
    assert faults.parse_step("5s:cut:n1") == faults.Step(5.0, "cut", "n1", "")
    assert faults.parse_step("1.5s:slow:q0:latency=5ms") == \
        faults.Step(1.5, "slow", "q0", "latency=5ms")
    with pytest.raises(faults.FaultError, match="ACTION one of cut, restore"):
        faults.parse_step("5s:unplug:n1")


def _shown(text: str) -> str:
    """A failed launch's story: node p0's own lines first (its agent hosts the rendezvous store, so a
    failure there shows up on q0 as a lost store, whose long trace used to fill the whole report)."""
    p0 = "\n".join(line for line in text.splitlines() if line.startswith("[p0"))
    return f"p0's lines:\n{p0[-4000:]}\n\nthe last of everything:\n{text[-3000:]}"


def _start_job(c, ready: str):
    """(thread running the job, its output) once rank 0 wrote its ready file, or (None, the output) when
    the job died before that: the emulator's launch failing, not the fault under test."""
    import sys

    from hcomm.emulate.launch import run_on

    buf = io.StringIO()
    th = threading.Thread(target=lambda out=buf: run_on(c, [sys.executable, JOB], out=out), daemon=True)
    th.start()
    deadline = time.monotonic() + 90
    while not os.path.exists(ready) and th.is_alive():
        assert time.monotonic() < deadline, _shown(buf.getvalue())
        time.sleep(0.1)
    return (th if os.path.exists(ready) else None), buf


def _rehearse(tmp_path, monkeypatch, action, target, after):
    """A failed start is tried once more on a freshly built cluster, the first try's story shown as a
    warning in the test report: it happened about once in ten CI runs (cause not yet known), once with
    rank 1's node failing to reach the rendezvous store on node 0 in both tries on the same cluster."""
    from hcomm.emulate.cluster import Cluster

    ready = str(tmp_path / "ready")
    monkeypatch.setenv("HCOMM_FAULT_READY", ready)
    for attempt in range(2):
        with Cluster(SMALL) as c:
            th, buf = _start_job(c, ready)
            if th is None:
                assert attempt == 0, _shown(buf.getvalue())
                warnings.warn(f"the fault job died before it was ready; starting it again on a new cluster. "
                              f"{_shown(buf.getvalue())}")
                continue
            f = c.faults()
            f.apply(action, target)
            t0 = time.monotonic()
            while len(LINE.findall(buf.getvalue())) < (2 if action == "cut" else 1):
                assert time.monotonic() - t0 < TIMEOUT_S + SLACK_S + 5, buf.getvalue()[-3000:]
                time.sleep(0.1)
            after(f)   # let what is left of the job finish (restore the link, resume/kill the rank)
            th.join(60)
            assert not th.is_alive(), "run_on still waiting 60 s after the fault"
            assert f.rank_pids(0) == [] and f.rank_pids(1) == []
            return {int(r): (float(t), kind, msg) for r, t, kind, msg in LINE.findall(buf.getvalue())}
    raise AssertionError("unreachable")


@pytest.mark.emulator
def test_killed_peer(tmp_path, monkeypatch):
    got = _rehearse(tmp_path, monkeypatch, "kill", "1", lambda f: None)
    assert list(got) == [0]
    t, kind, msg = got[0]
    assert t < 1.0 + SLACK_S and kind == "DistBackendError"
    # gloo names the dead peer by q0's address ("Connection closed by peer [10.77.0.101]", or "Read error
    # [10.77.0.101]:PORT: Connection reset by peer" when the kill lands mid-read) or, when its recv reports
    # the closed socket as a failed wait (2 of 6 clean-clone runs on this box), hcomm's wrapper names it by
    # rank: either way the survivor's error says who is gone, within the bound above
    by_address = ("Connection closed by peer [10.77.0.101]" in msg
                  or ("Read error [10.77.0.101]:" in msg and "Connection reset by peer" in msg))
    assert by_address or msg.startswith("hcomm: gloo recv from rank 1 "), msg


@pytest.mark.emulator
def test_stalled_peer(tmp_path, monkeypatch):
    got = _rehearse(tmp_path, monkeypatch, "stop", "1", lambda f: f.kill(1))
    assert list(got) == [0]
    t, kind, msg = got[0]
    assert TIMEOUT_S - 0.5 < t < TIMEOUT_S + SLACK_S
    assert msg.startswith("hcomm: rank 0 timed out after 6000 ms waiting for ALLREDUCE; "
                          "still waiting for a message from rank 1")


@pytest.mark.emulator
def test_cut_inter_island_link(tmp_path, monkeypatch):
    # torchrun's agents talk over the same link: restore it so they can finish.
    got = _rehearse(tmp_path, monkeypatch, "cut", "q0", lambda f: f.restore("q0"))
    assert sorted(got) == [0, 1]
    for r in (0, 1):
        t, _, msg = got[r]
        assert TIMEOUT_S - 0.5 < t < TIMEOUT_S + SLACK_S
        assert f"still waiting for a message from rank {1 - r}" in msg
