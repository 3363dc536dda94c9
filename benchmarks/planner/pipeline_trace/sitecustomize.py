"""Where a pipeline's step goes, rank by rank: put this folder on PYTHONPATH of an ``hcomm train`` run
(the emulator passes the environment to its ranks) and every rank writes the start and end of each
forward / backward chunk, each TP all-reduce inside them and each wait for a pipeline transfer
(torch.distributed.pipelining's ``_wait_batch_p2p``) to ``$PIPELINE_TRACE_DIR/trace-<rank>.json``
(default /tmp); ``analyze.py`` prints one step's account per rank.  A diagnostic, not part of hcomm:
it wraps torch's private schedule functions, which a torch release may rename.

    PYTHONPATH=benchmarks/planner/pipeline_trace python -m hcomm train --cluster mixed \
        --plan auto@pp=2@tp=2 --model small --seq-len 64 --global-batch 24 --steps 8
    python benchmarks/planner/pipeline_trace/analyze.py
"""
import atexit
import json
import os
import time

_ev = []
def _install():
    try:
        import torch.distributed.pipelining.schedules as s
        import torch.distributed.pipelining.stage as st
    except Exception:
        return False
    ow, op = s._wait_batch_p2p, s._batch_p2p
    def w(work):
        t = time.perf_counter()
        try:
            return ow(work)
        finally:
            _ev.append(("wait", t, time.perf_counter(), len(work)))
    def p(ops, desc=None):
        t = time.perf_counter()
        try:
            return op(ops, desc)
        finally:
            _ev.append(("post", t, time.perf_counter(), len(ops)))
    s._wait_batch_p2p, s._batch_p2p = w, p
    import torch.distributed as dist
    oar = dist.all_reduce
    def ar(tensor, *a, **k):
        t = time.perf_counter()
        try:
            return oar(tensor, *a, **k)
        finally:
            _ev.append(("AR", t, time.perf_counter(), tensor.numel() * tensor.element_size()))
    dist.all_reduce = ar
    base = st._PipelineStageBase
    of, ob = base.forward_one_chunk, base.backward_one_chunk
    def f(self, mb, *a, **k):
        t = time.perf_counter()
        try:
            return of(self, mb, *a, **k)
        finally:
            _ev.append(("F", t, time.perf_counter(), self.stage_index, mb))
    def b(self, mb, *a, **k):
        t = time.perf_counter()
        try:
            return ob(self, mb, *a, **k)
        finally:
            _ev.append(("B", t, time.perf_counter(), self.stage_index, mb))
    base.forward_one_chunk, base.backward_one_chunk = f, b
    osm = s._PipelineSchedule.step
    def step(self, *a, **k):
        t = time.perf_counter()
        try:
            return osm(self, *a, **k)
        finally:
            _ev.append(("step", t, time.perf_counter()))
    s._PipelineSchedule.step = step
    return True
import builtins
_orig_import = builtins.__import__
_done = [False]
def _imp(name, *a, **k):
    m = _orig_import(name, *a, **k)
    if not _done[0] and name.startswith("hcomm.parallel.pipeline"):
        _done[0] = _install()
    return m
builtins.__import__ = _imp
@atexit.register
def _report():
    if _ev:
        folder = os.environ.get("PIPELINE_TRACE_DIR", "/tmp")
        with open(os.path.join(folder, f"trace-{os.environ.get('RANK')}.json"), "w") as fh:
            json.dump(_ev, fh)
