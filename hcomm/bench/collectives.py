"""The even collectives, one definition each (nccl-tests' ``testColl``).

Size conventions follow nccl-tests (PERFORMANCE.md), so numbers compare:
``size`` is the per-rank buffer for all_reduce/broadcast/reduce, the total
(= output) buffer for all_gather, the total (= input) buffer for
reduce_scatter and the per-rank send buffer for all_to_all.  ``count`` is
size / element size.  algbw = size / time; busbw = algbw * factor.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from hcomm.bench.base import (Buffers, Collective, count_wrong, movement_values,
                              poison_like, reduction_expected, reduction_input)

# torch 2.13 renamed the tensor-in/tensor-out collectives and deprecates the
# old names; accept both so the bench runs on older torch (e.g. on a GPU box).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class AllReduce(Collective):
    name = "all_reduce"
    description = "in-place all-reduce of a size-byte buffer"
    reduces = True

    def busbw_factor(self, nranks):
        # each rank must send and receive 2(n-1)/n of the buffer (RS + AG)
        return 2.0 * (nranks - 1) / nranks

    def prepare(self, ctx, count):
        t = torch.empty(count, dtype=ctx.dtype, device=ctx.device)
        buf = Buffers(inp=t, out=t)
        self.reset(ctx, buf)
        return buf

    def reset(self, ctx, buf):
        buf.inp.copy_(reduction_input(ctx.rank, ctx.nranks, ctx.redop, ctx.dtype, 0,
                                      buf.inp.numel(), ctx.device))

    def run(self, ctx, buf):
        dist.all_reduce(buf.inp, op=ctx.torch_redop, group=ctx.group)

    def wrong(self, ctx, buf):
        return count_wrong(buf.out, reduction_expected(ctx.nranks, ctx.redop, ctx.dtype, 0,
                                                       buf.out.numel(), ctx.device))


class Reduce(AllReduce):
    name = "reduce"
    description = "in-place reduce of a size-byte buffer to --root"
    has_root = True

    def busbw_factor(self, nranks):
        return 1.0

    def run(self, ctx, buf):
        dist.reduce(buf.inp, dst=ctx.root, op=ctx.torch_redop, group=ctx.group)

    def wrong(self, ctx, buf):
        # only the root's buffer is defined after a reduce
        return super().wrong(ctx, buf) if ctx.rank == ctx.root else 0


class Broadcast(Collective):
    name = "broadcast"
    description = "in-place broadcast of a size-byte buffer from --root"
    has_root = True

    def busbw_factor(self, nranks):
        return 1.0

    def prepare(self, ctx, count):
        t = torch.empty(count, dtype=ctx.dtype, device=ctx.device)
        buf = Buffers(inp=t, out=t)
        self.reset(ctx, buf)
        return buf

    def reset(self, ctx, buf):
        values = movement_values(0, buf.inp.numel(), ctx.dtype, ctx.device)
        # non-roots start from values that differ everywhere, so an element the
        # broadcast never wrote counts as wrong
        buf.inp.copy_(values if ctx.rank == ctx.root else poison_like(values))

    def run(self, ctx, buf):
        dist.broadcast(buf.inp, src=ctx.root, group=ctx.group)

    def wrong(self, ctx, buf):
        return count_wrong(buf.out, movement_values(0, buf.out.numel(), ctx.dtype, ctx.device))

    def corrupt_target(self, buf):
        return buf.inp  # corrupting a non-root is harmless by design: it is overwritten


class AllGather(Collective):
    name = "all_gather"
    description = "all-gather; size is the gathered (output) buffer"

    def granule(self, nranks):
        return nranks

    def busbw_factor(self, nranks):
        # each rank receives everything but its own 1/n
        return (nranks - 1) / nranks

    def prepare(self, ctx, count):
        per = count // ctx.nranks
        buf = Buffers(inp=torch.empty(per, dtype=ctx.dtype, device=ctx.device),
                      out=torch.empty(count, dtype=ctx.dtype, device=ctx.device))
        self.reset(ctx, buf)
        return buf

    def reset(self, ctx, buf):
        per = buf.inp.numel()
        buf.inp.copy_(movement_values(ctx.rank * per, per, ctx.dtype, ctx.device))
        buf.out.copy_(poison_like(movement_values(0, buf.out.numel(), ctx.dtype, ctx.device)))

    def run(self, ctx, buf):
        _all_gather_single(buf.out, buf.inp, group=ctx.group)

    def wrong(self, ctx, buf):
        return count_wrong(buf.out, movement_values(0, buf.out.numel(), ctx.dtype, ctx.device))


class ReduceScatter(Collective):
    name = "reduce_scatter"
    description = "reduce-scatter; size is the reduced (input) buffer"
    reduces = True

    def granule(self, nranks):
        return nranks

    def busbw_factor(self, nranks):
        return (nranks - 1) / nranks

    def prepare(self, ctx, count):
        buf = Buffers(inp=torch.empty(count, dtype=ctx.dtype, device=ctx.device),
                      out=torch.empty(count // ctx.nranks, dtype=ctx.dtype, device=ctx.device))
        self.reset(ctx, buf)
        return buf

    def reset(self, ctx, buf):
        buf.inp.copy_(reduction_input(ctx.rank, ctx.nranks, ctx.redop, ctx.dtype, 0,
                                      buf.inp.numel(), ctx.device))
        buf.out.copy_(poison_like(self._expected(ctx, buf)))

    def _expected(self, ctx, buf):
        per = buf.out.numel()
        return reduction_expected(ctx.nranks, ctx.redop, ctx.dtype, ctx.rank * per, per, ctx.device)

    def run(self, ctx, buf):
        _reduce_scatter_single(buf.out, buf.inp, op=ctx.torch_redop, group=ctx.group)

    def wrong(self, ctx, buf):
        return count_wrong(buf.out, self._expected(ctx, buf))


class AllToAll(Collective):
    name = "all_to_all"
    description = "all-to-all; size is the per-rank send buffer (n equal chunks)"

    def granule(self, nranks):
        return nranks

    def busbw_factor(self, nranks):
        # everything but the chunk a rank keeps crosses its link
        return (nranks - 1) / nranks

    def prepare(self, ctx, count):
        buf = Buffers(inp=torch.empty(count, dtype=ctx.dtype, device=ctx.device),
                      out=torch.empty(count, dtype=ctx.dtype, device=ctx.device))
        self.reset(ctx, buf)
        return buf

    def reset(self, ctx, buf):
        count = buf.inp.numel()
        # rank r's chunk for peer p is global element range r*count + p*chunk
        buf.inp.copy_(movement_values(ctx.rank * count, count, ctx.dtype, ctx.device))
        buf.out.copy_(poison_like(self._expected(ctx, buf)))

    def _expected(self, ctx, buf):
        count, n = buf.out.numel(), ctx.nranks
        chunk = count // n
        return torch.cat([movement_values(src * count + ctx.rank * chunk, chunk, ctx.dtype, ctx.device)
                          for src in range(n)])

    def run(self, ctx, buf):
        dist.all_to_all_single(buf.out, buf.inp, group=ctx.group)

    def wrong(self, ctx, buf):
        return count_wrong(buf.out, self._expected(ctx, buf))


EVEN = [AllReduce(), AllGather(), ReduceScatter(), Broadcast(), Reduce(), AllToAll()]
