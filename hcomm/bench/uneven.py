"""Uneven (``_v``) collectives: hcomm's direct API against a torch reference.

Non-uniform tensor parallelism and heterogeneous ZeRO give rank r a share
proportional to its speed; the benchmark uses the simplest uneven pattern,
rank r's share = unit * (r + 1) (so the largest share is n times the
smallest), and for all_to_all_v rank r sends unit * (p + 1) to peer p.

On the hcomm backend each op is one call of ``hcomm.<op>_v``.  Other
backends have no ``_v`` op, so the row measures what a user would write
with torch's primitives (labelled ``ref:...`` in the algorithm column):
a padded all_gather plus copies, an all_reduce plus a slice, and
all_to_all_single with split sizes.

busbw generalises nccl-tests' argument: the bytes the busiest rank must move
across its link (its sent or received data, minus its own share) divided by
the time.  For even splits this is nccl-tests' (n-1)/n.
"""
from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist

from hcomm.bench.base import (Buffers, Collective, count_wrong, movement_values, poison_like,
                              reduction_expected, reduction_input, split_offsets)
from hcomm.bench.collectives import _all_gather_single


def _shares(nranks: int) -> int:
    return nranks * (nranks + 1) // 2


def rank_counts(count: int, nranks: int) -> List[int]:
    """Element counts per rank, unit * (r + 1), summing to ``count``."""
    unit = count // _shares(nranks)
    return [unit * (r + 1) for r in range(nranks)]


def _hcomm_fn(name: str):
    import hcomm

    return getattr(hcomm, name)


class _UnevenBase(Collective):
    uneven = True

    def granule(self, nranks):
        return _shares(nranks)

    def busbw_factor(self, nranks):
        # busiest rank receives (AG) / sends (RS) everything but the smallest share
        return 1.0 - 1.0 / _shares(nranks)


class AllGatherV(_UnevenBase):
    name = "all_gather_v"
    description = "uneven all-gather, rank r contributes (r+1) units; size is the output"
    hcomm_api = "all_gather_v"

    def prepare(self, ctx, count):
        counts = rank_counts(count, ctx.nranks)
        buf = Buffers(inp=torch.empty(counts[ctx.rank], dtype=ctx.dtype, device=ctx.device),
                      out=torch.empty(count, dtype=ctx.dtype, device=ctx.device),
                      extra={"counts": counts, "offsets": split_offsets(counts)})
        if ctx.backend != "hcomm":
            biggest = max(counts)
            buf.extra["pad_in"] = torch.zeros(biggest, dtype=ctx.dtype, device=ctx.device)
            buf.extra["pad_out"] = torch.empty(biggest * ctx.nranks, dtype=ctx.dtype, device=ctx.device)
        self.reset(ctx, buf)
        return buf

    def reset(self, ctx, buf):
        start, n = buf.extra["offsets"][ctx.rank], buf.inp.numel()
        buf.inp.copy_(movement_values(start, n, ctx.dtype, ctx.device))
        buf.out.copy_(poison_like(movement_values(0, buf.out.numel(), ctx.dtype, ctx.device)))

    def run(self, ctx, buf):
        counts = buf.extra["counts"]
        if ctx.backend == "hcomm":
            _hcomm_fn("all_gather_v")(buf.out, buf.inp, counts, group=ctx.group)
            return
        pad_in, pad_out, biggest = buf.extra["pad_in"], buf.extra["pad_out"], max(counts)
        pad_in[: buf.inp.numel()].copy_(buf.inp)
        _all_gather_single(pad_out, pad_in, group=ctx.group)
        for r, (c, off) in enumerate(zip(counts, buf.extra["offsets"])):
            buf.out[off: off + c].copy_(pad_out[r * biggest: r * biggest + c])

    def wrong(self, ctx, buf):
        return count_wrong(buf.out, movement_values(0, buf.out.numel(), ctx.dtype, ctx.device))

    def label(self, backend):
        return None if backend == "hcomm" else "ref:padded-all_gather"


class ReduceScatterV(_UnevenBase):
    name = "reduce_scatter_v"
    description = "uneven reduce-scatter, rank r receives (r+1) units; size is the input"
    reduces = True
    hcomm_api = "reduce_scatter_v"

    def prepare(self, ctx, count):
        counts = rank_counts(count, ctx.nranks)
        buf = Buffers(inp=torch.empty(count, dtype=ctx.dtype, device=ctx.device),
                      out=torch.empty(counts[ctx.rank], dtype=ctx.dtype, device=ctx.device),
                      extra={"counts": counts, "offsets": split_offsets(counts)})
        if ctx.backend != "hcomm":
            buf.extra["scratch"] = torch.empty(count, dtype=ctx.dtype, device=ctx.device)
        self.reset(ctx, buf)
        return buf

    def _expected(self, ctx, buf):
        start = buf.extra["offsets"][ctx.rank]
        return reduction_expected(ctx.nranks, ctx.redop, ctx.dtype, start, buf.out.numel(), ctx.device)

    def reset(self, ctx, buf):
        buf.inp.copy_(reduction_input(ctx.rank, ctx.nranks, ctx.redop, ctx.dtype, 0,
                                      buf.inp.numel(), ctx.device))
        buf.out.copy_(poison_like(self._expected(ctx, buf)))

    def run(self, ctx, buf):
        counts = buf.extra["counts"]
        if ctx.backend == "hcomm":
            _hcomm_fn("reduce_scatter_v")(buf.out, buf.inp, counts, op=ctx.torch_redop, group=ctx.group)
            return
        # reduce_scatter_v must not clobber its input, so the reference reduces a copy
        scratch, off = buf.extra["scratch"], buf.extra["offsets"][ctx.rank]
        scratch.copy_(buf.inp)
        dist.all_reduce(scratch, op=ctx.torch_redop, group=ctx.group)
        buf.out.copy_(scratch[off: off + buf.out.numel()])

    def wrong(self, ctx, buf):
        return count_wrong(buf.out, self._expected(ctx, buf))

    def label(self, backend):
        return None if backend == "hcomm" else "ref:all_reduce+slice"


class AllToAllV(_UnevenBase):
    name = "all_to_all_v"
    description = "uneven all-to-all, every rank sends (p+1) units to peer p; size is the send buffer"
    hcomm_api = "all_to_all_v"

    def busbw_factor(self, nranks):
        n, shares = nranks, _shares(nranks)
        send_off = shares - 1                  # rank 0 keeps only its 1 unit
        recv_off = (n - 1) * n                 # rank n-1 gets n units from each of n-1 peers
        return max(send_off, recv_off) / shares

    def prepare(self, ctx, count):
        n = ctx.nranks
        unit = count // _shares(n)
        send = [unit * (p + 1) for p in range(n)]
        recv = [unit * (ctx.rank + 1)] * n
        buf = Buffers(inp=torch.empty(count, dtype=ctx.dtype, device=ctx.device),
                      out=torch.empty(sum(recv), dtype=ctx.dtype, device=ctx.device),
                      extra={"send": send, "recv": recv})
        self.reset(ctx, buf)
        return buf

    def _expected(self, ctx, buf):
        count = buf.inp.numel()
        mine = buf.extra["recv"][0]
        start_in_sender = split_offsets(buf.extra["send"])[ctx.rank]
        # chunk (src -> me) is global range src*count + offset of my chunk in src's send buffer
        return torch.cat([movement_values(src * count + start_in_sender, mine, ctx.dtype, ctx.device)
                          for src in range(ctx.nranks)])

    def reset(self, ctx, buf):
        count = buf.inp.numel()
        buf.inp.copy_(movement_values(ctx.rank * count, count, ctx.dtype, ctx.device))
        buf.out.copy_(poison_like(self._expected(ctx, buf)))

    def run(self, ctx, buf):
        send, recv = buf.extra["send"], buf.extra["recv"]
        if ctx.backend == "hcomm":
            _hcomm_fn("all_to_all_v")(buf.out, buf.inp, recv, send, group=ctx.group)
        else:
            dist.all_to_all_single(buf.out, buf.inp, recv, send, group=ctx.group)

    def wrong(self, ctx, buf):
        return count_wrong(buf.out, self._expected(ctx, buf))

    def label(self, backend):
        return None if backend == "hcomm" else "ref:all_to_all_single"


UNEVEN = [AllGatherV(), ReduceScatterV(), AllToAllV()]
