"""Process groups for replicated shapes: pipeline replicas, tensor-parallel groups.

Both are lists of replicas whose ranks at one position hold the same part of
the model: each replica gets a group (its pipeline, its TP collectives) and
each position a group across replicas (the gradient sync of that part).  Kept
out of the pipeline runtime so tensor parallelism does not import
``torch.distributed.pipelining`` (5-8 s).
"""
from __future__ import annotations

from typing import Sequence

import torch.distributed as dist


def replica_groups(replicas: Sequence[Sequence[int]], backend: str = "hcomm", across: bool = True):
    """Groups for ``len(replicas)`` replicas (pipelines, TP groups); ``replicas[i][p]`` is the global rank at
    position p.

    Collective over the default group: every rank calls it with the same
    ``replicas``.  Returns ``(pipeline_group, dp_group)`` for this rank: its
    replica's group, and the group of the ranks at its position in every replica
    (None with one replica, for a rank in no replica, or with ``across=False``: the position groups are
    not built).
    """
    replicas = [list(r) for r in replicas]
    depth = {len(r) for r in replicas}
    if len(depth) != 1:
        raise ValueError(f"every pipeline replica needs the same number of ranks, got {[len(r) for r in replicas]}")
    flat = [x for r in replicas for x in r]
    if len(set(flat)) != len(flat):
        raise ValueError(f"a rank appears in two pipeline positions: {replicas}")
    me = dist.get_rank()
    pipeline_group = dp_group = None
    for r in replicas:
        g = dist.new_group(ranks=r, backend=backend)
        if me in r:
            pipeline_group = g
    if len(replicas) > 1 and across:
        for p in range(depth.pop()):
            members = [r[p] for r in replicas]
            g = dist.new_group(ranks=members, backend=backend)
            if me in members:
                dp_group = g
    return pipeline_group, dp_group

