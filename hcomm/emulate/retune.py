"""Closed-loop correction of the rank quotas, measured where the ranks run.

``plan_cpu`` assumes a quota buys work in proportion to its size, with one
task-clock factor for the whole box.  Virtual machines break that: on the
dev VM one vCPU delivered 30% less work than the other under the same
quota, and a 0.8-core quota bought a whole core's work while a 0.4-core one
bought 0.31.  So after the cgroups exist, every rank's cgroup runs the
fixed compute probe at once (as a job would load them), each quota is
scaled by how far its rate is from ``speed x`` the common rate, and the
round repeats (at most ``ROUNDS``) until every rank is within ``GOAL``.

The corrections a plan needed are kept per boot (``state_dir()/retune.json``,
keyed by the plan's quotas, cores and period): the next ``up`` of the same
shape starts from them and usually ends after its first measurement, where
it took two or three rounds (1.6 s each) from the plan's quotas.  A launch
whose rounds all missed the goal keeps nothing (its last quotas were never
measured).  The loop
and its goal are the same either way: a start that no longer fits is
corrected like any other.  What is kept is the quotas' ratios; their level
is always the plan's, or as near as every core's budget allows
(``_at_plan_level``).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import replace
from typing import Dict, Optional

from hcomm.emulate import cgroups

ROUNDS = 3
GOAL = 0.08         # relative error in the speed ratio that ends the loop
WINDOW_S = 1.0      # probe window per round
MAX_STEP = 2.0      # a round changes a quota by at most this factor


def measure(run_id: str, ranks) -> Dict[int, float]:
    """Compute-probe rate of every rank's cgroup, all running at once."""
    start = time.time() + 0.6  # under the smallest quota, start-up takes ~0.3 s
    procs = {r: cgroups.compute_probe(WINDOW_S, start, cgroup=(run_id, r)) for r in ranks}
    return {r: cgroups.probe_rate(p) for r, p in procs.items()}


def errors(rates: Dict[int, float], speeds: Dict[int, float]) -> Dict[int, float]:
    """Each rank's rate over what its speed asks for, relative to the fastest-per-speed rank."""
    per_speed = max(rates[r] / speeds[r] for r in rates) or 1.0
    return {r: rates[r] / (speeds[r] * per_speed) - 1.0 for r in rates}


def _key(plan: cgroups.CpuPlan) -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    shape = [boot, plan.period_us, sorted((r, q, plan.cpu_of[r]) for r, q in plan.quota_us.items())]
    return hashlib.sha1(json.dumps(shape).encode()).hexdigest()


def _at_plan_level(quota: Dict[int, float], plan: cgroups.CpuPlan) -> Dict[int, int]:
    """``quota``'s ratios at the level the plan put them (the geometric mean of quota / planned quota at 1),
    shrunk alike where a core would be promised more than its budget.

    A correction moves the quotas' ratios and keeps their product; shrinking to a core's budget is the
    one move that lowers them all, and it is made afresh from the plan's level each time.  Carried
    through the cache instead (each up starting from the last one's shrunk quotas), the shrinks of
    noisy rounds added up from launch to launch, and nothing raised the level again: one 4-rank shape's
    cached factors on the dev box had come to 0.75-0.96 (geometric mean 0.85)."""
    level = math.exp(sum(math.log(q / plan.quota_us[r]) for r, q in quota.items()) / len(quota))
    quota = {r: q / level for r, q in quota.items()}
    per_core: Dict[int, float] = {}
    for r, q in quota.items():
        per_core[plan.cpu_of[r]] = per_core.get(plan.cpu_of[r], 0.0) + q
    over = max(per_core.values()) / (cgroups.CORE_BUDGET * plan.period_us)
    return {r: max(1000, int(q / max(1.0, over))) for r, q in quota.items()}


def _load(cache: str) -> Dict[str, Dict[str, float]]:
    try:
        with open(cache) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write_quotas(run_id: str, quota: Dict[int, int]) -> None:
    for r, q in quota.items():
        cgroups._write(os.path.join(cgroups.rank_path("cpu", run_id, r), "cpu.cfs_quota_us"), q)


def retune(run_id: str, plan: cgroups.CpuPlan, speeds: Dict[int, float],
           cache_dir: Optional[str] = None) -> cgroups.CpuPlan:
    """Return ``plan`` with quotas corrected by measurement (and written to the cgroups); with
    ``cache_dir``, starting from the corrections this shape needed last time on this boot."""
    if len(speeds) < 2:
        return plan
    quota = dict(plan.quota_us)
    cache, key = (os.path.join(cache_dir, "retune.json"), _key(plan)) if cache_dir else (None, None)
    known = _load(cache).get(key) if cache else None
    if known and sorted(known) == sorted(str(r) for r in quota):
        quota = _at_plan_level({r: q * known[str(r)] for r, q in quota.items()}, plan)
        _write_quotas(run_id, quota)
    last_error = None
    for _ in range(ROUNDS):
        rates = measure(run_id, speeds)
        if min(rates.values()) <= 0:
            break
        err = errors(rates, speeds)
        last_error = max(abs(e) for e in err.values())
        if last_error <= GOAL:
            break
        # Aim every rank at the geometric mean of rate/speed, so quotas move
        # both ways; their level stays the plan's (``_at_plan_level``).
        target = math.exp(sum(math.log(rates[r] / speeds[r]) for r in rates) / len(rates))
        quota = _at_plan_level({r: quota[r] * min(MAX_STEP, max(1.0 / MAX_STEP, target * speeds[r] / rates[r]))
                                for r in quota}, plan)
        _write_quotas(run_id, quota)
    factors = {r: quota[r] / plan.quota_us[r] for r in quota}
    # Only corrections a measurement met the goal with are kept: quotas set after the last round were
    # never measured, and on this VM one 1 s probe window's rates vary by +-15 % at fixed quotas.
    if cache and last_error is not None and last_error <= GOAL:
        saved = _load(cache)
        saved[key] = {str(r): f for r, f in factors.items()}
        tmp = f"{cache}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(saved, f)
        os.replace(tmp, cache)   # runs coming up at once each write whole files
    if all(abs(f - 1.0) < 1e-9 for f in factors.values()):
        return replace(plan, retune_error=last_error)
    return replace(plan, quota_us=quota, retuned=factors, retune_error=last_error)
