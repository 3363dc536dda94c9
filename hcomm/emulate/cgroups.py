"""Per-rank cgroups (v1): CPU quota from relative speed, memory limit, pinning.

Speed scaling.  The box usually has fewer cores than the cluster has ranks,
so speed 1.0 cannot mean "one core".  All ranks together get a budget of
80% of each core (the rest keeps the user-space wire, the torchrun agents
and the launcher on time); one unit of speed is ``scale`` cores, chosen so
the busiest core's ranks fit in its 80% (at most 1.0: speed 1.0 never gets
more than a whole core), and a rank's ``cpu.cfs_quota_us = speed * scale *
period``.  ``check`` prints the scale.

Why a 4 ms period (default 100 ms): a quota is spent at a whole core's
speed, so a rank that waited (for a collective, a pipeline transfer) runs
its next piece of work at full speed until the period's quota is gone -- a
device that is fast after every pause, which no GPU is.  Measured on the
dev box (a 0.16-core quota, 8 ms of single-core work after 100 ms idle vs
back to back): 7.6 vs 46 ms with a 32 ms period (6x faster after idle),
38 vs 47 ms with 6.25 ms.  What remains is the kernel's accounting lag (a
tick, 7-10 ms of work ahead before the throttle catches up), which no
period removes.  Shorter than 4 ms buys little and costs a timer per rank
per period.

Pinning.  Each rank is pinned (cpuset) to one core, chosen greedily so the
quotas on every core add up to at most the core's budget; a rank's quota
therefore is a guarantee, not just a cap, and measured speed ratios match the
configured ones even when all ranks compute at once.  Only cores that are
really independent are used (see :func:`independent_cores`).

Memory.  ``memory.limit_in_bytes`` is the rank's emulated device memory; the
whole rank process (its host RSS stands in for device memory) counts against
it.  When the limit is exceeded the kernel's OOM killer kills the rank with
SIGKILL and bumps ``oom_kill`` in ``memory.oom_control``, which is how
:func:`oom_kills` tells a memory kill from any other SIGKILL.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from hcomm.emulate.bootstrap import probe_command
from hcomm.settings import declare

ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("cpu", "memory", "cpuset")
PERIOD_US = 4_000
MIN_QUOTA_US = 1_000    # the kernel refuses less
CALIBRATION_TRIES = 3    # best of three: a busy neighbour only ever slows a probe
CORE_BUDGET = 0.8
MAX_RANK_SHARE = 0.5

HCOMM_EMU_CORES = declare(
    "HCOMM_EMU_CORES", "",
    "comma-separated cores the emulated ranks are pinned to (e.g. 0 or 2,3); default: as few "
    "of the usable cores that calibration finds independent as give the ranks the most speed")


@dataclass(frozen=True)
class CpuPlan:
    cores: int              # cores the ranks are pinned to
    scale: float            # cores per unit of relative speed
    quota_us: Dict[int, int]
    cpu_of: Dict[int, int]  # rank -> core it is pinned to
    clock: float = 1.0      # quota correction measured by calibrate()
    period_us: int = PERIOD_US
    retuned: Dict[int, float] = field(default_factory=dict)  # rank -> quota factor (retune.py)
    # the largest relative error in the speeds' ratios at the retune's last measurement (None: not retuned)
    retune_error: Optional[float] = None

    def describe(self) -> str:
        text = (f"speed 1.0 = {self.scale:.2f} core of work (quota "
                f"{int(self.scale * self.period_us / self.clock)} us per {self.period_us} us period, "
                f"task-clock factor {self.clock:.2f}); ranks pinned to {self.cores} of "
                f"{len(available_cores())} cores")
        if self.retuned:
            text += "; quotas retuned x" + "/".join(f"{f:.2f}" for _, f in sorted(self.retuned.items()))
        if self.retune_error is not None:
            text += f"; speeds' ratios {self.retune_error:.0%} off at the last measurement"
        return text


def available_cores() -> List[int]:
    return sorted(os.sched_getaffinity(0))


def requested_cores() -> Optional[List[int]]:
    """The cores ``HCOMM_EMU_CORES`` names, or None when it is unset."""
    text = HCOMM_EMU_CORES.get().strip()
    if not text:
        return None
    usable = available_cores()
    try:
        cores = sorted({int(c) for c in text.split(",") if c.strip()})
    except ValueError:
        raise ValueError(f"HCOMM_EMU_CORES={text!r}: expected comma-separated core numbers") from None
    bad = [c for c in cores if c not in usable]
    if not cores or bad:
        raise ValueError(f"HCOMM_EMU_CORES={text!r}: cores {bad or cores} are not usable here "
                         f"(usable: {usable})")
    return cores


def compute_probe(seconds: float, start: float, cpu: int = -1, cgroup: Optional[Tuple[str, int]] = None):
    def _pre() -> None:
        if cpu >= 0:
            os.sched_setaffinity(0, {cpu})
        if cgroup is not None:
            join(*cgroup)

    return subprocess.Popen(probe_command() + ["compute", repr(start), repr(seconds)],
                            stdout=subprocess.PIPE, text=True, preexec_fn=_pre)


def probe_rate(proc) -> float:
    """Iterations per second the compute probe measured."""
    return float(json.loads(proc.communicate()[0].strip().splitlines()[-1])["rate"])


@dataclass(frozen=True)
class Calibration:
    cores: List[int]     # cores to pin ranks to
    worth: float         # how many cores' worth of work all cores did together
    clock: float         # work a quota buys / the quota (1.0 on honest hardware)


def calibrate(run_id: str, rank: int, cache_dir: str) -> Calibration:
    """Measure, once per boot (cached), what the cores and quotas really give.

    Two things VMs get wrong, both seen on the dev box:
    * vCPUs that share one physical core (SMT siblings, an overcommitted
      host): its two "cores" run two busy loops at half speed each.  Pinning
      one rank per vCPU would make a quota deliver less work whenever a
      neighbour runs, so if all cores together do less than 75% of N cores'
      work, ranks are pinned to only as many cores as they are worth.
    * a task clock that runs slow against wall time: there a 0.4-core quota
      bought a whole core's work.  Quotas are divided by the measured
      ``clock`` factor (a loop under a 0.2-core quota vs. unlimited).
    The rank's own cgroup (before its real quota is set) hosts the probe.
    """
    cores = available_cores()
    try:
        boot = _read("/proc/sys/kernel/random/boot_id").strip()
    except OSError:
        boot = ""
    cache = os.path.join(cache_dir, "cpu-calibration.json")
    try:
        with open(cache) as f:
            saved = json.load(f)
        if saved["all"] == cores and saved["boot"] == boot:
            return Calibration(requested_cores() or saved["cores"], saved["worth"], saved["clock"])
    except (OSError, ValueError, KeyError):
        pass
    # Each probe is taken CALIBRATION_TRIES times and its best kept: another
    # process can only slow a probe down, and this calibration holds for the
    # whole boot.  A single try taken while the box was busy once pinned every
    # emulated run to one core with a 0.8 clock (each training step 4x slower).
    solo = together = limited = 0.0
    path = rank_path("cpu", run_id, rank)
    _write(os.path.join(path, "cpu.cfs_period_us"), 10 * MIN_QUOTA_US)  # a 0.2-core quota of 2 ms
    _write(os.path.join(path, "cpu.cfs_quota_us"), 2 * MIN_QUOTA_US)
    for _ in range(CALIBRATION_TRIES):
        solo = max(solo, probe_rate(compute_probe(0.4, time.time() + 0.3, cores[0])))
        if len(cores) > 1:
            start = time.time() + 0.5
            together = max(together, sum(probe_rate(p) for p in [compute_probe(0.4, start, c) for c in cores]))
        # Start late enough that interpreter start-up under the quota is over.
        limited = max(limited, probe_rate(compute_probe(0.4, time.time() + 1.0, cgroup=(run_id, rank))))
    use = cores
    worth = 1.0
    if len(cores) > 1:
        worth = together / max(1, solo)
        if worth < 0.75 * len(cores):
            use = cores[: max(1, int(worth + 0.25))]
    clock = min(5.0, max(0.2, (limited / max(1, solo)) / 0.2))
    os.makedirs(cache_dir, exist_ok=True)
    with open(cache, "w") as f:
        json.dump({"all": cores, "boot": boot, "cores": use, "worth": worth, "clock": clock}, f)
    return Calibration(requested_cores() or use, worth, clock)


def _place(speeds: Dict[int, float], cores: Sequence[int], clock: float) -> Tuple[float, Dict[int, int]]:
    """The scale (cores of work per unit of speed) and pinning of ``speeds`` on ``cores``."""
    load = {c: 0.0 for c in cores}
    cpu_of: Dict[int, int] = {}
    # Largest first onto the least-loaded core (LPT), in units of speed; the
    # scale then makes the busiest core's sum of quotas fit its budget, so
    # every quota is a guarantee.
    for r in sorted(speeds, key=lambda r: (-speeds[r], r)):
        core = min(cores, key=lambda c: (load[c], c))
        cpu_of[r] = core
        load[core] += speeds[r]
    # A clock under 1 (a quota buys less work than it promises) would need
    # quotas above the core's budget to deliver the promised scale, crowding
    # out the wire and the agents; shrink the scale instead.
    # And speed 1.0 never gets more than MAX_RANK_SHARE of a core: a rank
    # that owns most of a core loses its work to whatever else runs there
    # (launcher, wire, a test runner), while a slower rank keeps slack --
    # measured on the 2-rank CI spec: 0.5 came out as 0.81.
    return min(MAX_RANK_SHARE, CORE_BUDGET / max(load.values())) * min(1.0, clock), cpu_of


def plan_cpu(speeds: Dict[int, float], cores: Optional[Sequence[int]] = None,
             clock: float = 1.0) -> CpuPlan:
    """Quotas and pinning for ``{rank: speed}`` on the given (or usable) cores.

    ``clock`` is :attr:`Calibration.clock`: quotas are divided by it so that
    a quota buys the share of wall-clock work it promises.
    """
    cores = list(cores if cores is not None else available_cores())
    # As few cores as give the ranks the most speed: a VM's vCPUs do not run
    # at one speed (on the dev box each dips by 30-40 % for 0.5-2 s at a
    # time, one core at a time), so two ranks on two cores see their ratio
    # move with the cores' while on one core it holds.  Measured on
    # mixed-speed (1.0 and 0.5, the same 0.5-core scale either way): the
    # slow rank ran 0.41-0.79 of the fast one on two cores in 12 clusters,
    # 0.46-0.53 in 12 checks of 6 clusters on one.
    options = [_place(speeds, cores[:k], clock) for k in range(1, len(cores) + 1)]
    best = max(scale for scale, _ in options)
    scale, cpu_of = next(o for o in options if o[0] >= best * (1 - 1e-9))
    share = {r: s * scale / clock for r, s in speeds.items()}  # of a core's task clock
    # The kernel refuses a quota under 1 ms; lengthen the period instead.
    # (A 1 ms quota once gave 2/3 of its share on a VM whose task clock ran
    # 1.7x slow; on the dev box a 1 ms quota per 4 ms gave 0.265 of a core
    # for 0.25, and retune.py corrects what a quota buys where it runs.)
    period = PERIOD_US
    smallest = min(share.values())
    if smallest * period < MIN_QUOTA_US:
        period = min(1_000_000, int(-(-MIN_QUOTA_US // (smallest * 1000)) * 1000))
    quota = {r: max(1000, int(f * period)) for r, f in share.items()}
    return CpuPlan(len(set(cpu_of.values())), scale, quota, cpu_of, clock, period)


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


def create_rank(run_id: str, rank: int, quota_us: int, cpu: int, memory_bytes: int,
                period_us: int = PERIOD_US, shares_speed: float = 1.0) -> None:
    base = os.path.join(ROOT, "cpuset")
    _ensure(os.path.join(base, "hcomm"), base)
    _ensure(run_path("cpuset", run_id), os.path.join(base, "hcomm"))
    path = rank_path("cpuset", run_id, rank)
    _ensure(path, run_path("cpuset", run_id))
    _write(os.path.join(path, "cpuset.cpus"), cpu)

    path = rank_path("cpu", run_id, rank)
    _ensure(path)
    _write(os.path.join(path, "cpu.cfs_quota_us"), -1)  # period may shrink below quota
    _write(os.path.join(path, "cpu.cfs_period_us"), period_us)
    _write(os.path.join(path, "cpu.cfs_quota_us"), quota_us)
    # Weights in proportion to speed too: if the quotas ever oversubscribe a
    # core (a VM clock that the calibration misjudged), CFS then splits it in
    # the same ratios instead of evenly.
    _write(os.path.join(path, "cpu.shares"), max(2, int(1024 * shares_speed)))

    path = rank_path("memory", run_id, rank)
    _ensure(path)
    _write(os.path.join(path, "memory.limit_in_bytes"), memory_bytes)
    swap = os.path.join(path, "memory.memsw.limit_in_bytes")
    if os.path.exists(swap):  # without this, swap would stretch the limit
        _write(swap, memory_bytes)


def join(run_id: str, rank: int, pid: int = 0, controllers=CONTROLLERS) -> None:
    """Move ``pid`` (0: the calling process) into the rank's cgroups of ``controllers``."""
    pid = pid or os.getpid()
    for controller in controllers:
        _write(os.path.join(rank_path(controller, run_id, rank), "cgroup.procs"), pid)


def leave(controller: str, pid: int = 0) -> None:
    """Move ``pid`` (0: the calling process) back to the root cgroup of ``controller`` (no limit)."""
    _write(os.path.join(ROOT, controller, "cgroup.procs"), pid or os.getpid())


def in_cgroup(run_id: str, rank: int, controller: str, pid: int = 0) -> bool:
    """Whether ``pid`` (0: the calling process) is in the rank's cgroup of ``controller``."""
    procs = _read(os.path.join(rank_path(controller, run_id, rank), "cgroup.procs")).split()
    return str(pid or os.getpid()) in procs


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
            ids.update(d for d in os.listdir(base)
                       if len(d) == 6 and os.path.isdir(os.path.join(base, d)))
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
