"""Point-to-point: ping-pong latency/bandwidth and unidirectional streaming.

Ranks are paired (0,1), (2,3), ...; all pairs run at once, an odd last rank
sits out.  ``size`` is the message; busbw = algbw (factor 1, as nccl-tests'
sendrecv).

* ``pingpong``: the even rank sends, the odd rank receives and sends the same
  buffer back.  One call is a round trip; the reported time is half of it
  (the one-way time), so small sizes read as link latency.
* ``unidir``: the even rank sends back-to-back messages, the odd rank
  receives them; the time per message at the receiver is what counts (the
  max over ranks picks it), i.e. streaming bandwidth in one direction.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from hcomm.bench.base import Buffers, Collective, count_wrong, movement_values, poison_like


def peer_of(rank: int, nranks: int):
    """The partner of ``rank`` in the pairing, or None for an odd last rank."""
    peer = rank ^ 1
    return peer if peer < nranks else None


class _PointToPoint(Collective):
    min_ranks = 2

    def busbw_factor(self, nranks):
        return 1.0

    def prepare(self, ctx, count):
        t = torch.empty(count, dtype=ctx.dtype, device=ctx.device)
        buf = Buffers(inp=t, out=t)
        self.reset(ctx, buf)
        return buf

    def reset(self, ctx, buf):
        values = movement_values(0, buf.inp.numel(), ctx.dtype, ctx.device)
        buf.inp.copy_(values if ctx.rank % 2 == 0 else poison_like(values))

    def wrong(self, ctx, buf):
        if peer_of(ctx.rank, ctx.nranks) is None:
            return 0
        return count_wrong(buf.out, movement_values(0, buf.out.numel(), ctx.dtype, ctx.device))


class PingPong(_PointToPoint):
    name = "pingpong"
    description = "round trip between rank pairs; time is half the round trip"
    time_divisor = 2  # the runner divides the per-call time by this

    def run(self, ctx, buf):
        peer = peer_of(ctx.rank, ctx.nranks)
        if peer is None:
            return
        if ctx.rank % 2 == 0:
            dist.send(buf.inp, dst=peer, group=ctx.group)
            dist.recv(buf.inp, src=peer, group=ctx.group)
        else:
            dist.recv(buf.inp, src=peer, group=ctx.group)
            dist.send(buf.inp, dst=peer, group=ctx.group)


class Unidirectional(_PointToPoint):
    name = "unidir"
    description = "stream of messages from even to odd ranks (one direction)"

    def run(self, ctx, buf):
        peer = peer_of(ctx.rank, ctx.nranks)
        if peer is None:
            return
        if ctx.rank % 2 == 0:
            dist.send(buf.inp, dst=peer, group=ctx.group)
        else:
            dist.recv(buf.inp, src=peer, group=ctx.group)


P2P = [PingPong(), Unidirectional()]
