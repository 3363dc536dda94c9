"""Emulated-cluster tests: need root, iproute2, tc and cgroup v1 (CI has them)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hcomm.emulate import Cluster, load_spec, state
from hcomm.emulate.check import check_compute, check_links, check_pause

from helpers import REPO, hcomm_cli, leftovers

pytestmark = pytest.mark.emulator
SMALL = os.path.join(os.path.dirname(__file__), "small.yaml")
ONECORE = os.path.join(os.path.dirname(__file__), "onecore.yaml")


def test_up_down_leaves_nothing(emulator):
    with Cluster(SMALL) as c:
        run_id = c.run_id
        assert len([ns for ns in state.list_netns() if run_id in ns]) == 2
        assert os.path.isdir(f"/sys/fs/cgroup/memory/hcomm/{run_id}/rank1")
        qd = subprocess.run(["ip", "netns", "exec", c.netns(1), "tc", "qdisc"],
                            capture_output=True, text=True).stdout
        assert "tbf" in qd and "ingress" in qd
        c.up()  # idempotent
        assert c.run_id == run_id
    assert leftovers(run_id) == []


def test_sigkilled_launcher_is_cleaned_by_down(emulator):
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-m", "hcomm", "emulate", "up", "--cluster", SMALL],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    line = proc.stdout.readline()
    assert "is up as run" in line, line
    run_id = line.split("is up as run ")[1].split(":")[0]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)
    # The wire (and its TUNs) died with the launcher; namespaces, cgroups and
    # the state file remain until `down` (or the next `up`) reaps them.
    left = leftovers(run_id)
    assert any(x.startswith("hce-") for x in left) and "state file" in left, left
    out = hcomm_cli("down")
    assert out.returncode == 0, out.stderr
    assert leftovers(run_id) == []


def test_links_and_compute_within_tolerance(emulator):
    with Cluster(SMALL) as c:
        for attempt in range(3):
            # Up to two re-measurements of whatever missed: on a 2-core CI VM
            # another job's burst can land on one rank's core (or the wire's)
            # for a whole window; clean-clone runs on 2026-12-03 saw a speed
            # ratio and a link's bandwidth miss twice in a row, each time
            # passing when measured again on a quiet machine.  A full-suite
            # run on 2026-12-07 measured the V100 at 0.63 of 0.50 in three 2 s
            # windows a second apart and 0.50 alone right after: a speed miss
            # is measured again after a longer settle, over a longer window
            # (the tolerance stays).
            if attempt:
                time.sleep(3.0)
            if attempt == 0 or not all(r.ok for r in rows):
                rows = check_links(c)
            if attempt == 0 or not all(r.ok for r in speed_rows):
                speed_rows, _ = check_compute(c, seconds=2.0 if attempt == 0 else 4.0)
            if all(r.ok for r in rows + speed_rows):
                break
    bad = [r.cells() for r in rows + speed_rows if not r.ok]
    assert not bad, bad
    assert len(rows) == 3 and len(speed_rows) == 2


def test_speed_ratios_hold_with_every_rank_on_one_core(emulator, monkeypatch):
    # The shape of a VM whose two vCPUs share a core: all quotas on core 0,
    # the slowest one 1/4 of the fastest (0.2 core of work at most in all).
    monkeypatch.setenv("HCOMM_EMU_CORES", "0")
    with Cluster(ONECORE) as c:
        assert set(c.cpu_plan.cpu_of.values()) == {0}
        rows, scale = check_compute(c, seconds=2.0)
        if not all(r.ok for r in rows):
            # a host that shares this VM's cores took one measurement (a CI run here: the V100 rank at
            # 0.36 of 0.50 once, in tolerance in every other run): each rank's better of two counts
            again, _ = check_compute(c, seconds=2.0)
            rows = [a if a.ok else b for a, b in zip(rows, again)]
    bad = [r.cells() for r in rows if not r.ok]
    assert not bad, (scale, bad)
    assert [r.configured for r in rows] == ["1.00", "0.50", "0.25"]


def test_ranks_are_not_much_faster_after_a_pause(emulator, monkeypatch):
    # A rank that waited ran its next 40 ms of work in 0.17-0.4 of the time
    # with the old 20-32 ms CPU periods (the quota is spent at a whole core's
    # speed); a device has no such burst.  Three speeds on one core, so the
    # smallest quota (1.15 ms) sets a 10 ms period, and the kernel's 4 ms tick
    # lets a rank overrun its quota by up to a tick after a wait, which the
    # slowest rank's 40 ms piece (4.6 ms of CPU) feels most: on a quiet box it
    # measured 0.46-0.66x in four runs (the fastest 0.73-0.88x), a CI run 0.53x,
    # under `emulate check`'s 0.55x bar for the presets' 4-7 ms periods.  So this
    # test holds the line between the old periods and the new (0.45x) on each
    # rank's best of three measurements.
    monkeypatch.setenv("HCOMM_EMU_CORES", "0")
    tol = 0.55
    with Cluster(ONECORE) as c:
        best = check_pause(c, tol=tol)
        for _ in range(2):
            if all(r.ok for r in best):
                break
            again = check_pause(c, tol=tol)
            best = [b if b.ok else a for b, a in zip(best, again)]
    assert [r.what for r in best] == [f"after a pause rank {r}" for r in range(3)]
    bad = [r.cells() for r in best if not r.ok]
    assert not bad, (c.cpu_plan.describe(), tol, bad)


def test_bad_emu_cores_is_named(monkeypatch):
    from hcomm.emulate import cgroups

    monkeypatch.setenv("HCOMM_EMU_CORES", "0,9999")
    with pytest.raises(ValueError, match=r"HCOMM_EMU_CORES='0,9999': cores \[9999\] are not usable"):
        cgroups.requested_cores()
    monkeypatch.setenv("HCOMM_EMU_CORES", "zero")
    with pytest.raises(ValueError, match="expected comma-separated core numbers"):
        cgroups.requested_cores()


def test_compute_probe_rates_only_the_time_it_ran():
    from hcomm.emulate import probes

    # A probe that starts 0.3 s into a 0.6 s window (as a rank under a tiny
    # quota does) reports its rate over the 0.3 s it ran, not over 0.6 s.
    res = probes.compute(time.time() - 0.3, 0.6)
    assert 0.25 <= res["late"] <= 0.4
    assert 0.2 <= res["seconds"] <= 0.4
    assert res["rate"] == pytest.approx(res["iters"] / res["seconds"])


def test_two_node_torchrun_job_sees_its_env(emulator):
    out = hcomm_cli("run", "--cluster", "two-islands", "--", sys.executable,
                    os.path.join(REPO, "tests/emulate/envcheck.py"), timeout=170)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    envs = {}
    for line in out.stdout.splitlines():
        if "] ENV " in line:
            prefix, payload = line.split("] ENV ", 1)
            env = json.loads(payload)
            envs[int(env["RANK"])] = env
            assert prefix == f"[{env['HCOMM_EMU_NODE']} r{env['RANK']}"
    spec = load_spec("two-islands")
    assert sorted(envs) == [0, 1, 2, 3]
    for r in spec.ranks:
        e = envs[r.rank]
        assert (e["HCOMM_EMU_NODE"], e["HCOMM_EMU_ISLAND"], e["HCOMM_EMU_VENDOR"],
                e["HCOMM_EMU_DEVICE"]) == (r.node, r.island, r.vendor, r.device)
        assert float(e["HCOMM_EMU_SPEED"]) == r.speed
        assert int(e["HCOMM_EMU_MEMORY"]) == r.memory_bytes
        assert e["LOCAL_RANK"] == str(r.local_rank) and e["WORLD_SIZE"] == "4"
        assert e["GLOO_SOCKET_IFNAME"].startswith("hcv")
        assert e["HCOMM_EMU_CLUSTER"].endswith("cluster.yaml")


_ALLOC = ("import os\nif os.environ['RANK'] == '1':\n"
          "    x = [b'1' * (32 << 20) for _ in range(40)]\nprint('done')")


def test_memory_limit_kill_is_reported(emulator):
    out = hcomm_cli("run", "--cluster", SMALL, "--", sys.executable, "-c", _ALLOC)
    assert out.returncode == 137, out.stdout + out.stderr
    assert "rank 1 (V100) exceeded its 400 MiB emulated memory" in out.stderr
    assert "[p0 r0] done" in out.stdout


def test_first_failing_rank_exit_code(emulator):
    code = "import os, sys\nsys.exit(7 if os.environ['RANK'] == '1' else 0)"
    out = hcomm_cli("run", "--cluster", SMALL, "--", sys.executable, "-c", code)
    assert out.returncode == 7, out.stdout + out.stderr
    assert "rank 1 (node q0) exited with code 7" in out.stderr


_QUOTA = ("import os\n"
          "from hcomm.emulate import cgroups\n"
          "from hcomm.emulate.rankwrap import HCOMM_EMU_RUN, enter_cpu_quota, leave_cpu_quota\n"
          "run, rank = HCOMM_EMU_RUN.get(), int(os.environ['RANK'])\n"
          "seen = [cgroups.in_cgroup(run, rank, c) for c in ('cpu', 'memory', 'cpuset')]\n"
          "entered = enter_cpu_quota()\n"
          "seen.append(cgroups.in_cgroup(run, rank, 'cpu'))\n"
          "leave_cpu_quota()\n"
          "seen.append(cgroups.in_cgroup(run, rank, 'cpu'))\n"
          "print('QUOTA', entered, seen)\n")


@pytest.mark.parametrize("defer", [True, False])
def test_a_deferred_rank_enters_its_cpu_quota_itself(emulator, defer):
    """``defer_quota`` (what ``hcomm train`` launches with): a rank starts in its memory and cpuset cgroups
    but not its CPU quota, enters the quota by ``enter_cpu_quota`` and leaves it by ``leave_cpu_quota``;
    without it the rank is in all three from the start and both calls do nothing."""
    import io

    from hcomm.emulate import run

    out = io.StringIO()
    assert run(SMALL, [sys.executable, "-c", _QUOTA], out=out, defer_quota=defer) == 0, out.getvalue()
    lines = sorted(line for line in out.getvalue().splitlines() if "] QUOTA " in line)
    want = "True [False, True, True, True, False]" if defer else "False [True, True, True, True, True]"
    assert lines == [f"[p0 r0] QUOTA {want}", f"[q0 r1] QUOTA {want}"], out.getvalue()


def test_unshaped_says_nothing_is_emulated():
    code = "import os\nprint('ENV', os.environ['RANK'], os.environ['HCOMM_EMU_DEVICE'])"
    out = hcomm_cli("run", "--unshaped", "--cluster", SMALL, "--", sys.executable, "-c", code)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "NOT emulated" in out.stderr
    assert "[p0 r0] ENV 0 A100" in out.stdout and "[q0 r1] ENV 1 V100" in out.stdout


def test_communication_threads_run_on_the_host_not_in_the_quota(emulator, monkeypatch):
    """A rank's main thread (where it computes) is in its CPU quota; gloo's and hcomm's threads are moved
    to the run's low-weight host group (``host_threads``), as a node's communication runs on its host
    CPUs; ``HCOMM_EMU_COMM_THREADS=quota`` leaves them in the quota.  One cluster, both settings."""
    import ast
    import io

    from hcomm.emulate import host_threads
    from hcomm.emulate.launch import run_on

    job = [sys.executable, os.path.join(os.path.dirname(__file__), "threadcheck.py")]
    with Cluster(SMALL) as c:
        shares = open(os.path.join(host_threads.host_path(c.run_id), "cpu.shares")).read().strip()
        assert shares == str(host_threads.HOST_SHARES)
        seen = {}
        for mode in ("host", "quota"):
            monkeypatch.setenv("HCOMM_EMU_COMM_THREADS", mode)
            out = io.StringIO()
            assert run_on(c, job, out=out) == 0, out.getvalue()
            seen[mode] = sorted(line.split("THREADS ", 1)[1] for line in out.getvalue().splitlines()
                                if "] THREADS " in line)
    for mode, lines in seen.items():
        assert len(lines) == 2, (mode, lines)
        for rank, line in enumerate(lines):
            number, main, others = line.split(" ", 2)
            others = ast.literal_eval(others)
            assert (number, main) == (str(rank), f"rank{rank}"), (mode, line)
            assert {"gloo_tcp_loop", "pt_gloo_runloop"} <= {name for name, _ in others}, (mode, line)
            want = "host" if mode == "host" else f"rank{rank}"
            assert {group for _, group in others} == {want}, (mode, line)


def test_a_bad_comm_threads_setting_is_named(monkeypatch):
    from hcomm.emulate import host_threads

    monkeypatch.setenv("HCOMM_EMU_COMM_THREADS", "gpu")
    with pytest.raises(ValueError, match=r"HCOMM_EMU_COMM_THREADS='gpu': expected 'host' or 'quota'"):
        host_threads.mode()
