"""Measured correction of the rank quotas, estimated where the ranks run.

``plan_cpu`` assumes a quota buys work in proportion to its size, with one
task-clock factor for the whole box.  Virtual machines break that: on the
dev VM one vCPU delivered 30% less work than the other under the same
quota, and a 0.8-core quota bought a whole core's work while a 0.4-core one
bought 0.31.  So after the cgroups exist, every rank's cgroup runs the
fixed compute probe at once (as a job would load them), and each quota is
scaled by what its rank's quota buys relative to the others'.

What a quota buys is a property of the box, but one probe window measures
it badly: on the dev VM a 1 s window's ratio of two ranks' rates varies by
+-20 % at fixed quotas (the vCPUs' own speeds move by +-10-15 % over
seconds), and a transient load at a launch's start (the previous launch's
teardown, the next launcher's imports) reads as a slow rank.  The old loop
corrected by each window until one met an 8 % goal: it chased the noise,
and in 10 ups back to back it left the two ranks of ``mixed-speed`` 23 %
off their ratio (median, by an independent 2 s check) where the plan's own
quotas were 8 % off.  So every window is one *sample* of each rank's
efficiency (``_sample``), and the quotas follow the per-rank **median** of a
shape's samples: the last ``SAMPLES_KEPT`` of this boot, kept in
``state_dir()/retune.json`` keyed by the plan's quotas, cores and period.
A shape's first up measures ``FIRST_ROUNDS`` windows (the median of three
outlives one transient); every later up measures one and adds it.  What is
kept is the quotas' ratios; their level is always the plan's, or as near as
every core's budget allows (``_at_plan_level``).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from dataclasses import replace
from typing import Dict, List, Optional

from hcomm.emulate import cgroups

FIRST_ROUNDS = 3    # windows a shape with no samples yet measures
SAMPLES_KEPT = 9    # a shape's latest samples whose median sets its quotas
WINDOW_S = 1.0      # probe window per round
MAX_STEP = 2.0      # a correction moves a quota by at most this factor from the plan's


def measure(run_id: str, ranks) -> Dict[int, float]:
    """Compute-probe rate of every rank's cgroup, all running at once."""
    start = time.time() + 0.6  # under the smallest quota, start-up takes ~0.3 s
    procs = {r: cgroups.compute_probe(WINDOW_S, start, cgroup=(run_id, r)) for r in ranks}
    return {r: cgroups.probe_rate(p) for r, p in procs.items()}


def errors(rates: Dict[int, float], speeds: Dict[int, float]) -> Dict[int, float]:
    """Each rank's rate over what its speed asks for, relative to the fastest-per-speed rank."""
    per_speed = max(rates[r] / speeds[r] for r in rates) or 1.0
    return {r: rates[r] / (speeds[r] * per_speed) - 1.0 for r in rates}


def _sample(rates: Dict[int, float], speeds: Dict[int, float], quota: Dict[int, int],
            plan: cgroups.CpuPlan) -> Dict[int, float]:
    """Log of how much more work per unit of speed rank r's quota bought than the plan promised,
    less the ranks' mean (only ratios matter).  A rank whose quota buys ``e_r`` times its share runs
    at ``rate_r = k e_r quota_r``; dividing out the quota the window ran at (``quota_r / plan_r``)
    leaves ``log e_r`` plus a common term, whatever quotas the window was measured at."""
    raw = {r: math.log(rates[r] / speeds[r]) - math.log(quota[r] / plan.quota_us[r]) for r in rates}
    mean = sum(raw.values()) / len(raw)
    return {r: v - mean for r, v in raw.items()}


def _corrected(samples: List[Dict[str, float]], plan: cgroups.CpuPlan) -> Dict[int, int]:
    """The plan's quotas divided by each rank's median efficiency over ``samples``."""
    factor = {}
    for r in plan.quota_us:
        log_e = statistics.median(s[str(r)] for s in samples)
        factor[r] = min(MAX_STEP, max(1.0 / MAX_STEP, math.exp(-log_e)))
    return _at_plan_level({r: q * factor[r] for r, q in plan.quota_us.items()}, plan)


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


def _load(cache: str) -> Dict[str, list]:
    try:
        with open(cache) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _known_samples(cache: Optional[str], key: Optional[str], ranks) -> List[Dict[str, float]]:
    """This shape's kept samples (anything else under its key, such as an older format, is dropped)."""
    kept = _load(cache).get(key) if cache else None
    want = sorted(str(r) for r in ranks)
    if not isinstance(kept, list):
        return []
    return [s for s in kept if isinstance(s, dict) and sorted(s) == want]


def _write_quotas(run_id: str, quota: Dict[int, int]) -> None:
    for r, q in quota.items():
        cgroups._write(os.path.join(cgroups.rank_path("cpu", run_id, r), "cpu.cfs_quota_us"), q)


def retune(run_id: str, plan: cgroups.CpuPlan, speeds: Dict[int, float],
           cache_dir: Optional[str] = None) -> cgroups.CpuPlan:
    """Return ``plan`` with quotas corrected by measurement (and written to the cgroups); with
    ``cache_dir``, the correction is the median over this shape's samples of this boot."""
    if len(speeds) < 2:
        return plan
    cache, key = (os.path.join(cache_dir, "retune.json"), _key(plan)) if cache_dir else (None, None)
    samples = _known_samples(cache, key, plan.quota_us)
    quota = dict(plan.quota_us)
    if samples:
        quota = _corrected(samples, plan)
        _write_quotas(run_id, quota)
    last_error = None
    for _ in range(max(1, FIRST_ROUNDS - len(samples))):
        rates = measure(run_id, speeds)
        if min(rates.values()) <= 0:
            break
        last_error = max(abs(e) for e in errors(rates, speeds).values())
        samples.append({str(r): v for r, v in _sample(rates, speeds, quota, plan).items()})
        samples = samples[-SAMPLES_KEPT:]
        quota = _corrected(samples, plan)
        _write_quotas(run_id, quota)
    if cache and last_error is not None:
        saved = _load(cache)
        saved[key] = samples
        tmp = f"{cache}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(saved, f)
        os.replace(tmp, cache)   # runs coming up at once each write whole files
    factors = {r: quota[r] / plan.quota_us[r] for r in quota}
    if all(abs(f - 1.0) < 1e-9 for f in factors.values()):
        return replace(plan, retune_error=last_error)
    return replace(plan, quota_us=quota, retuned=factors, retune_error=last_error)
