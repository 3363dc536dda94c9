"""Multi-process: hostile split sizes through every `_v` entry point, on 4 ranks.

Three ways in: the Python direct API (hcomm.all_gather_v, reduce_scatter_v,
all_to_all_v: checked in Python and again in C++), the backend's own
bindings with no Python check in front (ProcessGroupHComm.all_gather_v /
reduce_scatter_v), and torch's dist.all_to_all_single (1-D splits checked by
the core, 2-D row splits by the torch layer before it multiplies them into
element counts).  Hypothesis draws batches of hostile sizes in this process;
every rank gets the same sizes and tensor shapes, so every rank must refuse
every case with the same ValueError, before any communication, and the group
must still work afterwards.  The cases run on their own hcomm group with a
10 s timeout, so a case that slipped past validation on some ranks fails
within seconds instead of holding the pool.
"""
import datetime
import time

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import hcomm
from tests.helpers import hostile
from tests.helpers.hostile import MAX_TOTAL

# Entry points: hcomm.* (checked in Python, then C++); the binding alone ("backend."); torch's
# all_to_all_single with 1-D tensors and with rows of ROW elements ("/rows").
DIRECT = ("all_gather_v", "reduce_scatter_v", "all_to_all_v")
ROW = 3  # elements per row in the 2-D all_to_all_single cases


def _group(ctx):
    h = ctx.state.get("hostile_group")
    if h is None:
        h = ctx.state["hostile_group"] = dist.new_group(backend="hcomm", timeout=datetime.timedelta(seconds=10))
    return h


def _call(h, rank, entry, case):
    from hcomm.collectives import _backend

    if entry.endswith("all_gather_v"):
        sizes = case["sizes"]
        out, inp = torch.zeros(case["total"]), torch.zeros(hostile.fits(sizes[rank] if rank < len(sizes) else 1))
        if entry == "all_gather_v":
            hcomm.all_gather_v(out, inp, sizes, group=h)
        else:
            _backend(h).all_gather_v(out, inp, sizes).wait()
    elif entry.endswith("reduce_scatter_v"):
        sizes = case["sizes"]
        out, inp = torch.zeros(hostile.fits(sizes[rank] if rank < len(sizes) else 1)), torch.zeros(case["total"])
        if entry == "reduce_scatter_v":
            hcomm.reduce_scatter_v(out, inp, sizes, group=h)
        else:
            _backend(h).reduce_scatter_v(out, inp, sizes, dist.ReduceOp.SUM).wait()
    else:
        shape = (lambda n: (n, ROW)) if entry.endswith("/rows") else (lambda n: (n,))
        inp, out = torch.zeros(shape(case["n_in"])), torch.zeros(shape(case["n_out"]))
        if entry == "all_to_all_v":
            hcomm.all_to_all_v(out, inp, case["recv"], case["send"], group=h)
        else:
            dist.all_to_all_single(out, inp, case["recv"], case["send"], group=h)


def case_hostile(ctx, entry, cases):
    h = _group(ctx)
    results = []
    for case in cases:
        t0 = time.monotonic()
        try:
            _call(h, ctx.rank, entry, case)
            err = None
        except Exception as e:  # noqa: BLE001
            err = (type(e).__name__, isinstance(e, ValueError), isinstance(e, hcomm.HCommValueError),
                   str(e).splitlines()[0])
        results.append((err, time.monotonic() - t0))
    t = torch.ones(2)
    dist.all_reduce(t, group=h)  # still in step: nobody sent anything
    return results, t.tolist()


def _expected(entry, case, world):
    if "all_to_all" in entry:
        unit = "rows" if entry.endswith("/rows") else "elements"
        return (hostile.problem("input_split_sizes", case["send"], case["n_in"], "input", world, unit)
                or hostile.problem("output_split_sizes", case["recv"], case["n_out"], "output", world, unit))
    if entry.endswith("all_gather_v"):
        return hostile.problem("output_split_sizes", case["sizes"], case["total"], "output", world)
    return hostile.problem("input_split_sizes", case["sizes"], case["total"], "input", world)


def _check(pool, entry, cases):
    cases = [c for c in cases if _expected(entry, c, pool.world) is not None]  # hostile ones only
    if not cases:
        return
    per_rank = pool.run(case_hostile, entry, cases, timeout_s=60)
    for rank, (results, still) in enumerate(per_rank):
        assert still == [float(pool.world)] * 2, f"rank {rank}: group out of step after the refused calls"
        for case, (err, elapsed) in zip(cases, results):
            want = _expected(entry, case, pool.world)
            assert err is not None, f"rank {rank} accepted {entry} {case} (want: {want})"
            type_name, is_value_error, is_hcomm_value_error, msg = err
            assert is_value_error, (rank, case, type_name, msg)
            # The direct API raises hcomm's own class; torch's entry points raise torch's ValueError.
            assert is_hcomm_value_error == (entry in DIRECT), (entry, type_name)
            assert msg.startswith("hcomm: ") and f" on rank {rank}: " in msg, msg
            assert msg.partition(f" on rank {rank}: ")[2] == want, (case, msg)
            assert elapsed < 5.0, f"rank {rank} took {elapsed:.1f} s to refuse {case}"


def _v_cases(beyond_int64):
    @st.composite
    def one(draw):
        total = draw(st.integers(0, MAX_TOTAL))
        return {"total": total, "sizes": draw(hostile.sizes(4, total, beyond_int64))}
    return st.lists(one(), min_size=1, max_size=12)


def _a2a_cases(beyond_int64):
    # No empty lists: all_to_all_single reads [] as "split evenly", which can be valid on every
    # rank on its own and yet disagree with the peers' splits: no rank can refuse that, and gloo
    # then waits out the group timeout (see the last test of tests/core/test_thread_hostile_sizes.py).
    def splits(n):
        return hostile.sizes(4, n, beyond_int64).filter(len)

    @st.composite
    def one(draw):
        n_in, n_out = draw(st.integers(0, MAX_TOTAL)), draw(st.integers(0, MAX_TOTAL))
        sane = [n_out // 4] * 3 + [n_out - 3 * (n_out // 4)]
        recv = draw(st.one_of(st.just(sane), splits(n_out)))
        return {"n_in": n_in, "n_out": n_out, "send": draw(splits(n_in)), "recv": recv}
    return st.lists(one(), min_size=1, max_size=12)


# Entry point -> strategy.  The Python wrappers also see sizes beyond int64; the raw backend
# bindings and torch's all_to_all_single take int64 only.  "/rows": 2^62 rows of 3 elements
# would wrap, so the torch layer must refuse it in rows.
ENTRY_POINTS = {
    "all_gather_v": _v_cases(beyond_int64=True),
    "reduce_scatter_v": _v_cases(beyond_int64=True),
    "all_to_all_v": _a2a_cases(beyond_int64=True),
    "backend.all_gather_v": _v_cases(beyond_int64=False),
    "backend.reduce_scatter_v": _v_cases(beyond_int64=False),
    "all_to_all_single": _a2a_cases(beyond_int64=False),
    "all_to_all_single/rows": _a2a_cases(beyond_int64=False),
}


# Each example is one batch of up to 12 cases sent to the 4 workers at once.
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_hostile_sizes_are_refused(pool, entry, data):
    _check(pool, entry, data.draw(ENTRY_POINTS[entry]))


def test_the_issue_sizes_on_every_entry_point(pool):
    wraps = [3, hostile.INT64_MAX, hostile.INT64_MAX, 9]  # sums to 10 in int64
    for entry in ("all_gather_v", "backend.all_gather_v", "reduce_scatter_v", "backend.reduce_scatter_v"):
        _check(pool, entry, [{"total": 10, "sizes": wraps}])
    a2a = {"n_in": 10, "n_out": 4, "send": wraps, "recv": [1, 1, 1, 1]}
    for entry in ("all_to_all_v", "all_to_all_single", "all_to_all_single/rows"):
        _check(pool, entry, [a2a, {**a2a, "send": [1, 1, 1, 7], "recv": [2**62, 2**62, 2**62, 2**62 + 4]}])
