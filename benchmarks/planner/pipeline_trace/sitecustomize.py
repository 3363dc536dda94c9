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
import builtins
import json
import os
import time

_events = []


def _traced(fn, what):
    """``fn`` recording (kind, start, end, *details) for each call; ``what(args)`` gives kind and details."""
    def call(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _events.append((*what(args)[:1], start, time.perf_counter(), *what(args)[1:]))
    return call


def _install() -> bool:
    try:
        import torch.distributed as dist
        import torch.distributed.pipelining.schedules as schedules
        import torch.distributed.pipelining.stage as stage
    except Exception:
        return False
    schedules._wait_batch_p2p = _traced(schedules._wait_batch_p2p, lambda a: ("wait", len(a[0])))
    schedules._batch_p2p = _traced(schedules._batch_p2p, lambda a: ("post", len(a[0])))
    dist.all_reduce = _traced(dist.all_reduce, lambda a: ("AR", a[0].numel() * a[0].element_size()))
    base = stage._PipelineStageBase
    base.forward_one_chunk = _traced(base.forward_one_chunk, lambda a: ("F", a[0].stage_index, a[1]))
    base.backward_one_chunk = _traced(base.backward_one_chunk, lambda a: ("B", a[0].stage_index, a[1]))
    return True


_import = builtins.__import__
_installed = [False]


def _import_then_install(name, *args, **kwargs):   # once hcomm's pipeline is imported, torch's is too
    module = _import(name, *args, **kwargs)
    if not _installed[0] and name.startswith("hcomm.parallel.pipeline"):
        _installed[0] = _install()
    return module


builtins.__import__ = _import_then_install


@atexit.register
def _write() -> None:
    if _events:
        folder = os.environ.get("PIPELINE_TRACE_DIR", "/tmp")
        with open(os.path.join(folder, f"trace-{os.environ.get('RANK')}.json"), "w") as f:
            json.dump(_events, f)
