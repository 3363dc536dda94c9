"""Experiment, not part of hcomm: every thread of an emulated rank but its main (computing) one runs
outside the rank's CPU quota -- gloo's ``gloo_tcp_loop`` / ``pt_gloo_runloop`` and hcomm's executor --
as a real node's communication progresses on its host CPU whatever its accelerator's speed.  Put this
folder on PYTHONPATH of an ``hcomm train`` under the emulator with ``FREE_COMM_THREADS=1``; a sweeper
moves new threads every 0.2 s to ``FREE_COMM_GROUP`` (a cpu cgroup's folder; default the root, whose
tasks compete with the ranks' quotas at full weight; a group with ``cpu.shares`` 2 runs them only
where the computing threads leave the core idle).  Valid only with one intra-op thread (torch's
default under torchrun): with more, computation would run outside the quota too.  Findings:
``benchmarks/results/planner-pipeline-overhead-2026-12-07.md``.  The low-weight variant is now the
emulator's own behaviour (``hcomm/emulate/host_threads.py``, swept from the rank's wrapper); this hook
remains for the full-weight one (``FREE_COMM_GROUP`` unset) with ``HCOMM_EMU_COMM_THREADS=quota``."""
import os
import threading
import time


def _in_a_rank_quota(pid: int, tid: str) -> bool:
    with open(f"/proc/{pid}/task/{tid}/cgroup") as f:   # lines of "id:controllers:path"
        return any("cpu" in controllers.split(",") and path.startswith("/hcomm/")
                   for _, controllers, path in (line.rstrip("\n").split(":", 2) for line in f))


def _sweep() -> None:
    pid, me = os.getpid(), threading.get_native_id()
    target = os.path.join(os.environ.get("FREE_COMM_GROUP", "/sys/fs/cgroup/cpu"), "tasks")
    while True:
        time.sleep(0.2)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                if int(tid) not in (pid, me) and _in_a_rank_quota(pid, tid):
                    with open(target, "w") as f:
                        f.write(tid)
        except OSError:   # a thread that ended between the listing and the move
            pass


if os.environ.get("HCOMM_EMU_RUN") and os.environ.get("FREE_COMM_THREADS"):
    threading.Thread(target=_sweep, daemon=True, name="free_comm_threads").start()
