"""A rank's communication threads run on the emulated *host*, outside its device's CPU quota.

The quota stands for the emulated device's speed.  A real node moves its messages with host CPUs and
NICs whatever its accelerator's speed, but under the quota gloo's threads (``gloo_tcp_loop``,
``pt_gloo_runloop``) and hcomm's executor shared the quarter core of a V100 rank with its computation:
a gradient all-reduce beside the backward took 2.05-2.25x its time alone, and the computation beside it
slowed as much, which the planner does not price (on ``mixed`` equal batches ran 17 % above prediction
where batches split by measured speed ran within 1 %; pipelines and TP 18-26 %).  An experiment that
moved the same threads to a low-weight group from inside the rank (a hook, since removed) measured DP
within 0.1 %, torch DDP -3 %, pipelines -8 / -13 %
(``benchmarks/results/planner-pipeline-overhead-2026-12-07.md``); with this module,
two launches of every plan: 6 of 10 predictions within 15 % on ``mixed`` (4 before), 7 of 10 on
``two-islands`` (5), the beside-compute slowdown of an all-reduce 1.75 (2.05-2.25)
(``planner-accuracy-host-threads-2026-12-07.md``, ``planner-accuracy-host-threads-two-islands-2026-12-07.md``).

The low weight is the point: the host threads of one rank run where the computing threads leave the
rank's core idle (the cores' budget leaves 20 %, and a throttled quota leaves the rest of its period), and
never take a full-weight share from another rank's computation on the same core.  The threads stay on
their rank's core (only the cpu controller moves; the cpuset holds).

The sweeper runs in the rank's wrapper (``rankwrap``, outside every quota): it moves each thread of the
job's own process but its main one (where torch computes: the emulator runs one intra-op thread) from
the rank's cpu group to the run's host group, every ``SWEEP_S``.  Threads those threads start (hcomm's
channel waiters, gloo's per-op work) begin in the host group; a thread the main thread starts runs in the
quota until the next sweep.  ``HCOMM_EMU_COMM_THREADS=quota`` keeps every thread in the quota (the
emulator before 2026-12-07)."""
from __future__ import annotations

import os
import threading
from typing import Optional

from hcomm.emulate import cgroups
from hcomm.settings import declare

HCOMM_EMU_COMM_THREADS = declare(
    "HCOMM_EMU_COMM_THREADS", "host",
    "where an emulated rank's threads other than its computing one run: host (a low-weight group outside "
    "the device's CPU quota, as a node's communication runs on its host) or quota (inside it)")
HOST_SHARES = 2       # the kernel's smallest weight: idle time of the core only, in effect
SWEEP_S = 0.05


def mode() -> str:
    value = HCOMM_EMU_COMM_THREADS.get()
    if value not in ("host", "quota"):
        raise ValueError(f"HCOMM_EMU_COMM_THREADS={value!r}: expected 'host' or 'quota'")
    return value


def host_path(run_id: str) -> str:
    return os.path.join(cgroups.run_path("cpu", run_id), "host")


def create_host_group(run_id: str) -> None:
    """The run's host group (``remove_run`` removes it with the ranks' groups)."""
    path = host_path(run_id)
    os.makedirs(path, exist_ok=True)
    cgroups._write(os.path.join(path, "cpu.shares"), HOST_SHARES)


def sweep_once(run_id: str, rank: int, pid: int) -> int:
    """Move ``pid``'s threads but its main one from the rank's cpu group to the host group; how many."""
    try:
        in_quota = set(cgroups._read(os.path.join(cgroups.rank_path("cpu", run_id, rank), "tasks")).split())
        mine = set(os.listdir(f"/proc/{pid}/task"))
    except OSError:     # the process or the run is gone
        return 0
    moved = 0
    for tid in sorted((in_quota & mine) - {str(pid)}):
        try:
            cgroups._write(os.path.join(host_path(run_id), "tasks"), tid)
            moved += 1
        except OSError:  # the thread ended between the listing and the move
            pass
    return moved


def start_sweeper(run_id: str, rank: int, pid: int, stop: Optional[threading.Event] = None) -> threading.Thread:
    """Sweep ``pid``'s threads until it ends (or ``stop`` is set), on a daemon thread of the caller."""
    stop = stop or threading.Event()

    def loop() -> None:
        while not stop.wait(SWEEP_S) and os.path.exists(f"/proc/{pid}"):
            sweep_once(run_id, rank, pid)

    thread = threading.Thread(target=loop, daemon=True, name=f"hcomm-host-threads-r{rank}")
    thread.start()
    return thread
