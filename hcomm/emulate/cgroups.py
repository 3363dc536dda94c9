"""Per-rank cgroups (v1): CPU quota from relative speed, memory limit, pinning.

Speed scaling.  The box usually has fewer cores than the cluster has ranks,
so speed 1.0 cannot mean "one core".  All ranks together get a budget of
80% of each core (the rest keeps the user-space wire, the torchrun agents
and the launcher on time); one unit of speed is ``scale`` cores, chosen so
the busiest core's ranks fit in its 80% (at most 1.0: speed 1.0 never gets
more than a whole core), and a rank's ``cpu.cfs_quota_us = speed * scale *
period``.  ``check`` prints the scale.

Why a 10 ms period (default 100 ms): a rank throttled to 0.4 core would run
40 ms and then stall 60 ms, which a collective sees as a 60 ms hiccup; with
10 ms the stall is 6 ms, closer to a uniformly slower device.

Pinning.  Each rank is pinned (cpuset) to one core, chosen greedily so the
quotas on every core add up to at most the core's budget; a rank's quota
therefore is a guarantee, not just a cap, and measured speed ratios match the
configured ones even when all ranks compute at once.

Memory.  ``memory.limit_in_bytes`` is the rank's emulated device memory; the
whole rank process (its host RSS stands in for device memory) counts against
it.  When the limit is exceeded the kernel's OOM killer kills the rank with
SIGKILL and bumps ``oom_kill`` in ``memory.oom_control``, which is how
:func:`oom_kills` tells a memory kill from any other SIGKILL.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("cpu", "memory", "cpuset")
PERIOD_US = 10_000
CORE_BUDGET = 0.8


@dataclass(frozen=True)
class CpuPlan:
    cores: int              # cores this process may run on
    scale: float            # cores per unit of relative speed
    quota_us: Dict[int, int]
    cpu_of: Dict[int, int]  # rank -> core it is pinned to

    def describe(self) -> str:
        return (f"speed 1.0 = {self.scale:.2f} core ({int(self.scale * PERIOD_US)} us per "
                f"{PERIOD_US} us period) on {self.cores} cores")


def available_cores() -> List[int]:
    return sorted(os.sched_getaffinity(0))


def plan_cpu(speeds: Dict[int, float], cores: Optional[Sequence[int]] = None) -> CpuPlan:
    """Quotas and pinning for ``{rank: speed}`` on the given (or usable) cores."""
    cores = list(cores if cores is not None else available_cores())
    load = {c: 0.0 for c in cores}
    cpu_of: Dict[int, int] = {}
    # Largest first onto the least-loaded core (LPT), in units of speed; the
    # scale then makes the busiest core's sum of quotas fit its budget, so
    # every quota is a guarantee.
    for r in sorted(speeds, key=lambda r: (-speeds[r], r)):
        core = min(cores, key=lambda c: (load[c], c))
        cpu_of[r] = core
        load[core] += speeds[r]
    scale = min(1.0, CORE_BUDGET / max(load.values()))
    quota = {r: max(1000, int(s * scale * PERIOD_US)) for r, s in speeds.items()}
    return CpuPlan(len(cores), scale, quota, cpu_of)


def run_path(controller: str, run_id: str) -> str:
    return os.path.join(ROOT, controller, "hcomm", run_id)


def rank_path(controller: str, run_id: str, rank: int) -> str:
    return os.path.join(run_path(controller, run_id), f"rank{rank}")


def missing_controllers() -> List[str]:
    return [c for c in CONTROLLERS
            if not os.path.exists(os.path.join(ROOT, c, "cgroup.procs"))]


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _ensure(path: str, cpuset_parent: Optional[str] = None) -> None:
    if not os.path.isdir(path):
        os.makedirs(path, exist_ok=True)
    if cpuset_parent is not None:
        # cpuset v1 starts a new group empty: a task cannot join until cpus
        # and mems are set, so copy them down from the parent.
        for name in ("cpuset.cpus", "cpuset.mems"):
            if not _read(os.path.join(path, name)).strip():
                _write(os.path.join(path, name), _read(os.path.join(cpuset_parent, name)).strip())


def create_rank(run_id: str, rank: int, quota_us: int, cpu: int, memory_bytes: int) -> None:
    base = os.path.join(ROOT, "cpuset")
    _ensure(os.path.join(base, "hcomm"), base)
    _ensure(run_path("cpuset", run_id), os.path.join(base, "hcomm"))
    path = rank_path("cpuset", run_id, rank)
    _ensure(path, run_path("cpuset", run_id))
    _write(os.path.join(path, "cpuset.cpus"), cpu)

    path = rank_path("cpu", run_id, rank)
    _ensure(path)
    _write(os.path.join(path, "cpu.cfs_period_us"), PERIOD_US)
    _write(os.path.join(path, "cpu.cfs_quota_us"), quota_us)

    path = rank_path("memory", run_id, rank)
    _ensure(path)
    _write(os.path.join(path, "memory.limit_in_bytes"), memory_bytes)
    swap = os.path.join(path, "memory.memsw.limit_in_bytes")
    if os.path.exists(swap):  # without this, swap would stretch the limit
        _write(swap, memory_bytes)


def join(run_id: str, rank: int, pid: int = 0) -> None:
    """Move ``pid`` (0: the calling process) into the rank's cgroups."""
    pid = pid or os.getpid()
    for controller in CONTROLLERS:
        _write(os.path.join(rank_path(controller, run_id, rank), "cgroup.procs"), pid)


def oom_kills(run_id: str, rank: int) -> int:
    try:
        text = _read(os.path.join(rank_path("memory", run_id, rank), "memory.oom_control"))
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def max_usage(run_id: str, rank: int) -> int:
    try:
        return int(_read(os.path.join(rank_path("memory", run_id, rank),
                                      "memory.max_usage_in_bytes")))
    except OSError:
        return 0


def cpu_usage_ns(run_id: str, rank: int) -> int:
    """CPU time the rank used (cpuacct may be mounted apart from cpu)."""
    for ctl in ("cpu", "cpuacct"):
        path = os.path.join(ROOT, ctl, "hcomm", run_id, f"rank{rank}", "cpuacct.usage")
        if os.path.exists(path):
            return int(_read(path))
    return 0


def run_ids() -> List[str]:
    ids = set()
    for controller in CONTROLLERS:
        base = os.path.join(ROOT, controller, "hcomm")
        if os.path.isdir(base):
            ids.update(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))
    return sorted(ids)


def _kill_all(path: str) -> None:
    for _ in range(50):
        try:
            pids = [int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def remove_run(run_id: str) -> List[str]:
    """Kill what still runs in the run's cgroups and remove them (leaves first)."""
    removed = []
    for controller in CONTROLLERS:
        base = run_path(controller, run_id)
        if not os.path.isdir(base):
            continue
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name)
            if os.path.isdir(path):
                _kill_all(path)
                _rmdir(path)
        _kill_all(base)
        _rmdir(base)
        removed.append(f"cgroup {base}")
    return removed


def _rmdir(path: str) -> None:
    for _ in range(50):  # rmdir fails with EBUSY until killed tasks are reaped
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
    os.rmdir(path)
