"""What pipeline replicas side by side cost per step, besides each replica's own simulated schedule: the
links their transfers take, the uplinks they share, the stage gradient sync across replicas and the
optimizer step of the pieces each rank holds (``planner.pipeline`` chooses with it, ``simulate``
predicts with it)."""
from __future__ import annotations

from typing import Dict, Hashable, Tuple

from hcomm.parallel.planner.cost import side_by_side_allreduce_s


def transfer_costs(view) -> dict:
    """The pipeline cost model's link arguments: each transfer's seconds, its ends' host time and the
    links it occupies (``ClusterView.transfer_links``: between islands, the islands' uplinks)."""
    return dict(link_s=view.p2p_s, host_s=view.p2p_host_s, links_of=view.transfer_links)


def uplink_floor_s(view, replicas, boundary: int) -> float:
    """Seconds the busiest uplink needs per step for every replica's activations and gradients between
    islands (bytes over bandwidth, no latency).  Each replica is simulated alone, its own transfers
    sharing its uplinks; replicas side by side share them too, and no step ends before the uplinks have
    carried all of it.  A floor, not a queue: at low load the replicas' transfers rarely meet (charging
    each the bytes of all replicas crossing predicted mixed's pp=2 11 % high)."""
    load: Dict[Hashable, float] = {}
    for rep in replicas:
        if rep.part is None:
            continue
        nbytes = boundary * rep.part.micro_batch
        stages = rep.part.stages
        for st, nxt in zip(stages, stages[1:]):
            for a, b in ((st.rank, nxt.rank), (nxt.rank, st.rank)):
                if view.island_of(a) != view.island_of(b):
                    wire = (view.p2p_s(a, b, nbytes) - view.p2p_s(a, b, 0)) * rep.part.micro_batches
                    for link in view.transfer_links(a, b):
                        load[link] = load.get(link, 0.0) + wire
    return max(load.values(), default=0.0)


def replicas_step_s(view, replicas, boundary: int) -> Tuple[float, float, float, float]:
    """(step, slowest replica or the uplinks' floor, stage gradient sync, optimizer) of replicas side by side."""
    slowest = max(max(r.step_s for r in replicas), uplink_floor_s(view, replicas, boundary))
    sync_s = stage_sync_s(view, replicas) if len(replicas) > 1 else 0.0
    opt_s = optimizer_s(view, replicas)
    return slowest + sync_s + opt_s, slowest, sync_s, opt_s


def stage_sync_s(view, replicas) -> float:
    """All-reduce of each stage position's gradients across the replicas, every position at once
    (``cost.side_by_side_allreduce_s``; counted fully exposed: the buckets launch during each stage's
    last backward, but the slowest replica's end bounds them)."""
    first = next(r.part for r in replicas if r.part is not None)
    grads: Dict[int, int] = {}
    for st in first.stages:
        pos = st.stage % len(first.busy_s)
        grads[pos] = grads.get(pos, 0) + sum(c.grad_bytes for c in view.profiles[st.rank].layers[st.first:st.last])
    return side_by_side_allreduce_s(view, [([rep.order[pos] for rep in replicas], b) for pos, b in grads.items()])


def optimizer_s(view, replicas) -> float:
    total = sum(c.param_bytes for c in view.profiles[0].layers)
    worst = 0.0
    for rep in replicas:
        if rep.part is None:
            continue
        held: Dict[int, int] = {}
        for st in rep.part.stages:
            held[st.rank] = held.get(st.rank, 0) + sum(c.param_bytes
                                                         for c in view.profiles[st.rank].layers[st.first:st.last])
        worst = max(worst, *(view.optimizer_s[r] * b / total for r, b in held.items()))
    return worst
