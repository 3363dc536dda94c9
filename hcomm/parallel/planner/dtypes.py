"""Dtype per device, chosen by measurement (``--precision search``).

A mixed cluster has no single right dtype, and a kind's low precision is not always its faster one:
bf16 matmuls are 8-16x fp32's on an A100 or a 910B, but on a CPU without bf16 instructions (the
emulator's ranks) autocast only adds casts, and a small model's pieces can be launch-bound anywhere.
So with ``--precision search`` every rank measures its pieces twice -- in fp32 and under the autocast
of its kind's best low-precision dtype (bf16, else fp16: ``precision.per_device_dtypes``) -- and the
joint search runs on up to three assignments of dtypes to ranks:

- ``fp32`` everywhere (what the fp32 equivalence tests hold the trainers to);
- ``faster per kind``: each kind in whichever dtype its ranks measured faster (forward + backward of
  every piece, summed over the kind's ranks); a kind's dtype changes only its own ranks' piece times
  and activation bytes, so the faster one per kind is the fastest assignment unless memory decides;
- ``low everywhere``: every kind in its low dtype -- where memory decides (its activations are
  smaller), the plan that fits may be here.

The plan that fits and predicts fastest wins; the assignments that lost and the measured totals per
kind go in the plan's notes.  Which dtype a rank computes in is its ``RankPlan.compute_dtype``; the
trainers apply it as ``--precision per-device`` does (``precision.Precision``: fp32 master weights,
optimizer state and gradient reduction, fp16 ranks scale the loss).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

from hcomm.parallel.precision import per_device_dtypes


def kind_totals(view) -> Dict[str, Tuple[float, float]]:
    """Per device kind: (fp32 seconds, low-precision seconds) of forward + backward of every piece at
    the profiles' micro-batch, summed over the kind's ranks."""
    if len(view.low_precision_profiles) != view.world_size:
        raise ValueError(f"--precision search needs every rank's low-precision profile; the view has "
                         f"{len(view.low_precision_profiles)} of {view.world_size}")
    totals: Dict[str, List[float]] = {}
    for r, kind in enumerate(view.devices):
        fp32, low = view.profiles[r], view.low_precision_profiles[r]
        t = totals.setdefault(kind, [0.0, 0.0])
        t[0] += (fp32.fwd_s + fp32.bwd_s) / fp32.micro_batch
        t[1] += (low.fwd_s + low.bwd_s) / low.micro_batch
    return {k: (a, b) for k, (a, b) in totals.items()}


def assignments(view) -> List[Tuple[str, List[str]]]:
    """(label, compute dtype per rank) to search, without repeats: fp32, faster per kind, low everywhere."""
    totals = kind_totals(view)
    low = per_device_dtypes(view.devices)
    faster = [d if totals[kind][1] < totals[kind][0] else "fp32" for kind, d in zip(view.devices, low)]
    out: List[Tuple[str, List[str]]] = []
    for label, dtypes in (("fp32", ["fp32"] * view.world_size), ("faster per kind", faster),
                          ("low everywhere", low)):
        if all(dtypes != seen for _, seen in out):
            out.append((label, dtypes))
    return out


def view_in(view, dtypes: List[str]):
    """``view`` with each rank's profile in its dtype (``dtypes[r]``: fp32 or its kind's low one)."""
    profiles = [view.profiles[r] if d == "fp32" else view.low_precision_profiles[r] for r, d in enumerate(dtypes)]
    return dataclasses.replace(view, profiles=profiles)


def apply(plan, dtypes: List[str]) -> None:
    """Every rank of ``plan`` computes in ``dtypes[rank]``."""
    for r in plan.ranks:
        r.compute_dtype = dtypes[r.rank]


def search_dtypes(view, global_batch: int, seq_len: int, **kw):
    """(the search's result on the winning assignment, its dtypes per rank, notes): ``search.search`` on
    each assignment's view; the fastest usable plan wins (fp32 on a tie)."""
    from hcomm.parallel.planner.search import dtypes_of, search

    results = []
    for label, dtypes in assignments(view):
        try:
            mine = view_in(view, dtypes)
            results.append((label, dtypes, _runnable(search(mine, global_batch, seq_len, **kw), dtypes, mine)))
        except ValueError as exc:   # nothing fits (or runs) in these dtypes: another assignment may
            results.append((label, dtypes, exc))
    found = [x for x in results if not isinstance(x[2], Exception)]
    if not found:
        label, _, exc = results[-1]   # the last needs the least memory: its reason is the one to read
        raise ValueError(f"no plan fits in any dtype assignment ({', '.join(x[0] for x in results)}); in {label}: "
                         f"{exc}")
    label, dtypes, result = min(found, key=lambda x: x[2].best.step_s)
    totals = kind_totals(view)
    notes = ["dtype per device (profiled fp32 vs low precision, fwd+bwd ms per sample summed over the kind's "
             "ranks): " + ", ".join(f"{kind} {a * 1e3:.1f} vs {b * 1e3:.1f}" for kind, (a, b) in totals.items()),
             "dtypes searched: " + "; ".join(
                 f"{lab} ({dtypes_of(view_in(view, d))}): "
                 + (f"{res.best.label} {res.best.step_s * 1e3:.0f} ms" if not isinstance(res, Exception)
                    else "no plan fits")
                 for lab, d, res in results) + f"; chose {label}"]
    return result, dtypes, notes


def _runnable(result, dtypes: List[str], view):
    """``result`` with every candidate carrying ``dtypes``; those the trainers cannot run in them (ZeRO
    and asynchronous islands take fp32 only, ``plan_check``) set aside with the reason, the best re-chosen."""
    from hcomm.parallel.plan_check import PlanError
    from hcomm.parallel.planner.search import describe

    for c in result.candidates:
        if c.plan is None or c.why_not:
            continue
        apply(c.plan, dtypes)
        try:
            c.plan.validate(view.world_size)
        except PlanError as exc:
            c.why_not = str(exc)
    result.candidates.sort(key=lambda c: (not c.usable, c.sim is None, c.step_s))
    if not result.candidates[0].usable:
        raise ValueError(f"no plan that fits runs in these dtypes ({result.candidates[0].why_not})")
    result.best = result.candidates[0]
    result.notes = describe(result, view)
    return result
