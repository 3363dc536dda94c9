"""ZeRO stages 1-3 over uneven shards: the collectives and the hooks that drive them.

Per unit (see layout.py) every rank holds an fp32 *master* shard, a flat
``nn.Parameter`` the optimizer steps (any element-wise ``torch.optim``
optimizer; one per unit, so per-parameter state is per shard element).

- Stage 1: parameters and gradients stay whole on every rank; gradients
  accumulate over micro-batches in a flat per-unit buffer and leave once per
  step through ``reduce_scatter_v`` into the master shard's grad.
- Stage 2: as 1, but every micro-batch's gradients are reduce-scattered and
  the whole-unit gradient buffer is freed as soon as its reduce-scatter ends.
- Stage 3: as 2, and a unit's parameters exist only between an
  ``all_gather_v`` of the shards and the end of their use: gathered before
  the unit's forward (prefetched ``prefetch`` units ahead), freed after it
  (unless ``reshard_after_forward`` is off, or it is the last unit, which
  backward needs next), gathered again before its backward (prefetched in
  reverse order) and freed after its gradients are reduced.

After the optimizer step, stages 1 and 2 all-gather every updated shard into
the whole parameters; each unit's gather is waited for only when its forward
starts, so it overlaps the forward of the units before it.

Collectives must be issued in the same order on every rank.  Gathers and
reduce-scatters use two separate groups (they also run concurrently, like
NCCL's separate streams), so each group's order is simply unit order:
forward gathers 0..U-1, backward gathers U-1..0 of the units freed after
forward, reduce-scatters U-1..0 (launched in that order even if autograd
finishes a unit early).  Ranks run different numbers of micro-batches
(uneven batch shares); every rank runs ``rounds`` of them and a round
without samples is a *ghost* round that issues the same collectives with
nothing computed and zeros reduced.  A rank with batch share 0 only runs
ghost rounds: it reduces, steps its shard and serves its parameters, and
never runs forward or backward (an aggregation-only rank).

Gradients are exact global-batch means: each micro-batch's loss is divided
by the global token count, so per-rank sums add up to the single process's
gradient (up to reduction order).

Island-aware layout (HSDP): the shard group is the island, and each
reduce-scatter is followed by an all-reduce of the shard among the ranks at
the same position of every island (the ``replicate`` group), through hcomm's
(optionally compressed) path; per-layer gathers never leave the island.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

import hcomm
from hcomm.parallel.zero.buffers import BufferPool
from hcomm.parallel.zero.layout import Unit, flatten
from hcomm.parallel.zero.memory import GRAD_BUFFERS_IN_FLIGHT, whole_param_bytes


@dataclass
class UnitStats:
    """What one unit's collectives did in one step (per rank)."""
    gathers: int = 0
    gather_bytes: int = 0        # bytes this rank received
    reduce_bytes: int = 0        # bytes this rank sent into reduce-scatters (and replica all-reduces)
    exposed_s: float = 0.0       # time compute waited for this unit's collectives
    overlapped_s: float = 0.0    # time they were in flight before anyone waited (hidden behind compute)
    issue_s: float = 0.0         # time the calling thread spent starting them (inside compute)


@dataclass
class _Pending:
    unit: int
    work: object
    issued: float
    scratch: Optional[torch.Tensor] = None
    grad_full: Optional[torch.Tensor] = None
    phase: str = "reduce"        # reduce -> (replicate) -> done
    waited: bool = False         # its reduce-scatter was already waited for (and its time counted)


@dataclass
class _UnitState:
    unit: Unit
    full: torch.Tensor                          # whole flat parameters (storage freed when resharded)
    master: nn.Parameter                        # fp32 shard the optimizer steps
    grad_full: Optional[torch.Tensor] = None    # whole flat gradient of the current round
    gathered: bool = True
    gather_work: Optional[object] = None
    gather_issued: float = 0.0
    ready: int = 0                              # parameters whose gradient arrived this round
    stats: UnitStats = field(default_factory=UnitStats)


class ZeroEngine:
    def __init__(self, units: List[Unit], *, stage: int, gather_group, reduce_group, replicate_group=None,
                 prefetch: int = 1, reshard_after_forward: bool = True, rounds: int = 1):
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeroEngine: stage must be 1, 2 or 3, got {stage}")
        if prefetch < 0:
            raise ValueError(f"ZeroEngine: prefetch must be >= 0, got {prefetch}")
        if stage == 3 and units[-1].name == "rest":
            raise ValueError(f"ZeRO-3 gathers parameters per piece of layer_modules(); these are in none: "
                             f"{', '.join(units[-1].names)}")
        self.stage = stage
        self.gather_group, self.reduce_group, self.replicate_group = gather_group, reduce_group, replicate_group
        self.prefetch = prefetch
        self.reshard_after_forward = reshard_after_forward
        self.rounds = rounds
        self.units: List[_UnitState] = []
        # unit-sized blocks reused round after round (buffers.py: why), no more than memory.py counts
        whole = [u.numel * max((p.element_size() for p in u.params), default=4) for u in units]
        self.pool = BufferPool(whole_param_bytes(whole, stage=stage, prefetch=prefetch,
                                                 reshard_after_forward=reshard_after_forward),
                               max_kept_tensors=GRAD_BUFFERS_IN_FLIGHT)
        for u in units:
            full = flatten(u)
            master = nn.Parameter(full[u.shard_start: u.shard_start + u.shard_numel].float().clone())
            state = _UnitState(u, full, master)
            for p, off in zip(u.params, u.offsets):
                p.data = full[off: off + p.numel()].view_as(p)   # parameters become views of the flat buffer
            self.units.append(state)
        self._by_param: Dict[int, tuple] = {id(p): (s.unit.index, k) for s in self.units
                                            for k, p in enumerate(s.unit.params)}
        self._pending: Deque[_Pending] = deque()
        self.grad_buffers_peak = 0
        self._next_reduce = len(self.units) - 1
        self._reducing = True       # this round's gradients leave (stage 1: only the last round)
        self._hooks = []
        for s in self.units:
            for p in s.unit.params:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))
        for s in self.units:
            # Stages 1-2: waits for the unit's post-step gather; stage 3: gathers (and prefetches) it.
            self._hooks.append(s.unit.module.register_forward_pre_hook(self._pre_forward(s.unit.index)))
            if stage == 3:
                self._hooks.append(s.unit.module.register_forward_hook(self._post_forward(s.unit.index)))
                self._free(s)

    # -- what the trainer calls ---------------------------------------------------------------
    def parameters(self) -> List[nn.Parameter]:
        """The master shards, one per unit: build the optimizer over these."""
        return [s.master for s in self.units]

    def begin_step(self) -> None:
        self.grad_buffers_peak = 0   # most whole-unit gradient buffers held at once this step (tests)
        for s in self.units:
            s.stats = UnitStats()
            s.master.grad = torch.zeros_like(s.master)

    def begin_round(self, last: bool) -> None:
        """Before a micro-batch's forward; ``last`` = this rank's last round of the step."""
        self._reducing = self.stage >= 2 or last
        self._next_reduce = len(self.units) - 1
        self.pool.trim()   # the forward's activations get the room the memory model gives them
        for s in self.units:
            s.ready = 0

    def end_round(self) -> float:
        """After a micro-batch's backward: launch what autograd did not reach, finish every
        reduction due this round; seconds waited."""
        start = time.perf_counter()
        if self._reducing:
            for s in self.units:
                s.ready = len(s.unit.params)
            self._launch_reductions()
            self._drain(0)
        if self.stage == 3:
            for s in self.units:
                self._wait_gather(s)
                self._free(s)
        return time.perf_counter() - start

    def ghost_round(self, last: bool) -> float:
        """A round without samples: the same collectives as a real one, nothing computed."""
        start = time.perf_counter()
        self.begin_round(last)
        if self.stage < 3:
            self.wait_all_gathers()
        if self.stage == 3:
            # The very hooks a real round runs, in the order it runs them, so every gather is issued
            # in the same sequence as on ranks that compute (prefetch windows included).
            for i in self._forward_order():
                self._pre_forward(i)(None, None)
                if not self._kept_after_forward(i):
                    self._free(self.units[i])
        # Backward, unit by unit in the order a real backward reaches them: its gathers (stage 3), then
        # its reduce-scatter (zeros), so the two groups' collectives interleave as on computing ranks
        # and a rank waiting for a reduce-scatter mid-backward never waits on this one's gathers.
        for i in reversed(self._forward_order()):
            s = self.units[i]
            if self.stage == 3:
                self._pre_backward(i)(None)
                self._free(s)
            if self._reducing:
                s.ready = len(s.unit.params)
                self._launch_reductions()
        if self._reducing:
            self._drain(0)
        return time.perf_counter() - start

    def after_step(self) -> None:
        """After the optimizer stepped the shards: stages 1-2 gather the new parameters (waited per unit
        when its forward starts, or by ``wait_all_gathers``)."""
        if self.stage < 3:
            for s in self.units:
                s.gathered = False
                self._issue_gather(s)

    def wait_all_gathers(self) -> float:
        start = time.perf_counter()
        for s in self.units:
            self._wait_gather(s)
        return time.perf_counter() - start

    def stats(self) -> List[dict]:
        return [dict(unit=s.unit.name, **vars(s.stats)) for s in self.units]

    def consolidate(self) -> None:
        """Every rank gets the whole parameters for good (evaluation, export); hooks removed."""
        for s in self.units:
            self._issue_gather(s)
        for s in self.units:
            self._wait_gather(s)
            s.master.grad = None
        self.remove()

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # -- stage 3 hooks ---------------------------------------------------------------------------
    def _forward_order(self) -> List[int]:
        return list(range(len(self.units)))

    def _kept_after_forward(self, i: int) -> bool:
        return not self.reshard_after_forward or i == len(self.units) - 1

    def _backward_gather_order(self) -> List[int]:
        return [i for i in reversed(range(len(self.units))) if not self._kept_after_forward(i)]

    def _pre_forward(self, i: int):
        def hook(module, args):
            for j in range(i, min(len(self.units), i + 1 + self.prefetch)):
                self._issue_gather(self.units[j])
            self._wait_gather(self.units[i])
        return hook

    def _post_forward(self, i: int):
        def hook(module, args, output):
            training = torch.is_grad_enabled()
            if training:
                out = _first_tensor_needing_grad(output)
                if out is not None:
                    out.register_hook(self._pre_backward(i))
            if not training or not self._kept_after_forward(i):
                self._free(self.units[i])
        return hook

    def _pre_backward(self, i: int):
        def hook(grad):
            order = self._backward_gather_order()
            later = [j for j in order if j < i][: self.prefetch]
            self._issue_gather(self.units[i])
            for j in later:
                self._issue_gather(self.units[j])
            self._wait_gather(self.units[i])
        return hook

    # -- gathers ----------------------------------------------------------------------------------
    def _issue_gather(self, s: _UnitState) -> None:
        if s.gathered or s.gather_work is not None:
            return
        nbytes = s.unit.numel * s.full.element_size()
        self.pool.fill(s.full.untyped_storage(), nbytes)
        send = s.master.detach() if s.master.dtype == s.full.dtype else s.master.detach().to(s.full.dtype)
        t = time.perf_counter()
        s.gather_work = hcomm.all_gather_v(s.full, send, s.unit.counts, group=self.gather_group, async_op=True)
        s.gather_issued = time.perf_counter()
        s.stats.issue_s += s.gather_issued - t
        s.stats.gathers += 1
        s.stats.gather_bytes += (s.unit.numel - s.unit.shard_numel) * s.full.element_size()

    def _wait_gather(self, s: _UnitState) -> None:
        if s.gather_work is None:
            return
        _timed_wait(s.gather_work, s.gather_issued, s.stats)
        s.gather_work = None
        s.gathered = True

    def _free(self, s: _UnitState) -> None:
        if self.stage == 3 and s.gather_work is None:
            self.pool.empty(s.full.untyped_storage())
            s.gathered = False

    # -- gradients --------------------------------------------------------------------------------
    def _on_grad(self, p: nn.Parameter) -> None:
        index, k = self._by_param[id(p)]
        s = self.units[index]
        u = s.unit
        if s.grad_full is None:
            self._take_grad_buffer(s, p.dtype)
        s.grad_full[u.offsets[k]: u.offsets[k] + p.numel()].add_(p.grad.reshape(-1))
        p.grad = None   # the flat buffer holds it now; autograd's copy is freed at once
        s.ready += 1
        if s.ready == len(u.params):
            # Autograd accumulates a parameter's gradient after every use of it has run its
            # backward, so once all of the unit's gradients are in, nothing reads its weights.
            self._free(s)
        if self._reducing:
            self._launch_reductions()

    def _launch_reductions(self) -> None:
        while self._next_reduce >= 0 and self.units[self._next_reduce].ready >= len(
                self.units[self._next_reduce].unit.params):
            s = self.units[self._next_reduce]
            if s.grad_full is None:     # no parameter of the unit was used: it contributes zeros
                self._take_grad_buffer(s, s.full.dtype)
            scratch = self.pool.tensor(s.unit.shard_numel, s.grad_full.dtype, s.grad_full.device)
            t = time.perf_counter()
            work = hcomm.reduce_scatter_v(scratch, s.grad_full, s.unit.counts, group=self.reduce_group,
                                          async_op=True)
            s.stats.issue_s += time.perf_counter() - t
            s.stats.reduce_bytes += (s.unit.numel - s.unit.shard_numel) * s.grad_full.element_size()
            self._pending.append(_Pending(s.unit.index, work, time.perf_counter(), scratch, s.grad_full))
            s.grad_full = None
            self._next_reduce -= 1
            self._reap()

    def _take_grad_buffer(self, s: _UnitState, dtype: torch.dtype) -> None:
        """Give unit ``s`` a zeroed whole-unit gradient buffer, holding no more of them than memory.py
        counts (``GRAD_BUFFERS_IN_FLIGHT``): first wait, oldest first, for the reduce-scatters that still
        hold theirs (as FSDP2 makes the next reduce-scatter wait for the last one's input).

        Waiting here, mid-backward, cannot deadlock: every rank issues its gathers and reduce-scatters
        in one interleaving (a ghost round follows a real backward's order, unit by unit), and the
        reduce-scatter waited for was issued units before the gathers this rank has not issued yet.
        Only reduce-scatters are waited for here; a replica all-reduce (HSDP) is started lazily, when
        its reduce-scatter is finished, so it waits for ``end_round``.  Only launched reductions can
        be waited for: reductions launch in unit order, so a unit whose gradients arrive late (a weight
        shared with a later unit) holds the later units' buffers until it is complete."""
        self._reap()   # reductions done by now hand their buffers back for this one
        holding = [job for job in self._pending if job.grad_full is not None]
        # stage 1 keeps every unit's whole gradient through the step anyway (memory.py counts it)
        waited = holding[: max(0, len(holding) - (GRAD_BUFFERS_IN_FLIGHT - 1))] if self.stage >= 2 else []
        for job in waited:
            _timed_wait(job.work, job.issued, self.units[job.unit].stats)
            job.waited = True
            self.pool.give(job.grad_full)
            job.grad_full = None
        s.grad_full = self.pool.tensor(s.unit.numel, dtype, s.full.device, zero=True)
        held = sum(u.grad_full is not None for u in self.units) + \
            sum(job.grad_full is not None for job in self._pending)
        self.grad_buffers_peak = max(self.grad_buffers_peak, held)

    def _reap(self) -> None:
        """Finish the reductions that are done, without blocking (the only waits mid-backward are
        ``_take_grad_buffer``'s, on reduce-scatters; ``end_round`` waits for the rest)."""
        while self._pending and self._pending[0].work.is_completed():
            self._finish_front()

    def _drain(self, keep: int) -> None:
        """Finish the oldest reductions (waiting) until at most ``keep`` are in flight."""
        while len(self._pending) > keep:
            self._finish_front()

    def _finish_front(self) -> None:
        """Wait for the oldest reduction; then either start its cross-island all-reduce (HSDP, put
        back at the front: launches stay in unit order on every rank) or add it to the shard's grad."""
        job = self._pending.popleft()
        s = self.units[job.unit]
        if job.waited:   # counted when _take_grad_buffer waited for it
            job.work.wait()
        else:
            _timed_wait(job.work, job.issued, s.stats)
        job.waited = False
        now = time.perf_counter()
        if job.grad_full is not None:   # the whole-unit gradient is done with here
            self.pool.give(job.grad_full)
            job.grad_full = None
        if job.phase == "reduce" and self.replicate_group is not None:
            # HSDP: sum the island's shard with the same shard of every other island.
            job.work = dist.all_reduce(job.scratch, group=self.replicate_group, async_op=True)
            job.issued, job.phase = time.perf_counter(), "replicate"
            s.stats.issue_s += job.issued - now
            s.stats.reduce_bytes += job.scratch.numel() * job.scratch.element_size()
            self._pending.appendleft(job)
            return
        s.master.grad.add_(job.scratch.to(s.master.dtype))
        self.pool.give(job.scratch)


def _timed_wait(work, issued: float, stats: UnitStats) -> None:
    """Wait for ``work``: the time waited is exposed, the time it ran before the wait was hidden."""
    t = time.perf_counter()
    work.wait()
    stats.exposed_s += time.perf_counter() - t
    stats.overlapped_s += t - issued


def _first_tensor_needing_grad(output) -> Optional[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, (tuple, list)):
        for x in output:
            t = _first_tensor_needing_grad(x)
            if t is not None:
                return t
    if isinstance(output, dict):
        return _first_tensor_needing_grad(list(output.values()))
    return None
