"""Unit-sized buffers kept for reuse, as a device's caching allocator keeps them.

Every round of ZeRO-3 gives each unit its whole parameters again (a gather into the unit's flat storage)
and takes them away after use, and every round's backward makes a whole-unit gradient buffer and a
shard-sized reduction result per unit.  On a GPU torch's caching allocator hands the same blocks back
each time.  On the CPU each of these goes to glibc, and a unit-sized block freed between smaller
allocations gets carved up by them: the next one extends the heap, whose fresh pages the kernel must
clear on first touch.  Measured on ``mixed`` (ZeRO-3 after another plan in the same launch, perf on every
rank): the heap grew by one unit (6.75 MiB) about twice a second per rank, 32 such extensions in 5 s,
11 from the gathers' storage ``resize_`` and 21 from the gradient buffers' ``torch.zeros``, and the
kernel's ``clear_page`` took 20-23 % of the ranks' CPU; in launches where the heap happened to stay
compact it took ~0 %, so the same plan measured 1860 or 2460 ms per step depending on what ran before it.

So the engine takes these buffers from a pool and gives them back to it, but the pool never holds more
than the memory model (memory.py) counts at all times.  Parameter blocks, in use and kept together: at
most the bytes of the units a rank holds whole at once (``prefetch + 2`` of the largest, or every unit
without ``reshard_after_forward``), so ZeRO-3 takes no parameter block from the C library after its
start.  Flat buffers come back as their reductions end and are handed out again within the round;
before the next round's forward the pool keeps only the largest two (stages 2-3 count two whole-unit
gradient buffers in flight, stage 1 every whole gradient), the rest goes back to the C library.
Measured the same way with these limits: ``clear_page`` 10-13 % of the ranks' CPU (5 % with a pool
that kept every buffer, which the memory model would not have covered).

A unit's parameters are views of its flat storage, and autograd keeps those views for backward, so the
storage object must stay the same while its memory comes and goes; ``UntypedStorage._swap_data_ptr_``
moves a block between two storage objects without copying.  Where a torch lacks it, the storage is
resized as before (correct, just not pooled)."""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Tuple

import torch

_SWAP = hasattr(torch.UntypedStorage, "_swap_data_ptr_")


class BufferPool:
    def __init__(self, max_block_bytes: int, max_kept_tensors: int = 2) -> None:
        """``max_block_bytes``: parameter blocks in use and kept, together; ``max_kept_tensors``: flat
        buffers kept across ``trim``."""
        if max_block_bytes < 0 or max_kept_tensors < 0:
            raise ValueError(f"BufferPool: limits must be >= 0, got {max_block_bytes} and {max_kept_tensors}")
        self.max_block_bytes, self.max_kept_tensors = max_block_bytes, max_kept_tensors
        self._blocks: Dict[Tuple[int, str], List[torch.UntypedStorage]] = defaultdict(list)
        self._out_bytes = 0      # in storages filled from here and not emptied yet
        self._flat: Dict[Tuple[int, torch.dtype, str], List[torch.Tensor]] = defaultdict(list)
        self.block_allocations = 0    # parameter blocks that came from the allocator (tests, the record)
        self.tensor_allocations = 0   # flat buffers that did

    def _kept_block_bytes(self) -> int:
        return sum(key[0] * len(b) for key, b in self._blocks.items())

    # -- a storage's memory (the unit's whole parameters) --------------------------------------
    def fill(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """Give an empty ``storage`` ``nbytes`` of memory (contents undefined): a kept block of that size
        if there is one, else a new one (dropping kept blocks of other sizes past the limit)."""
        if storage.nbytes() >= nbytes:
            return
        key = (nbytes, str(storage.device))
        self._out_bytes += nbytes
        self.block_allocations += not self._blocks[key]
        if not _SWAP or storage.nbytes():
            storage.resize_(nbytes)
            return
        if self._blocks[key]:
            storage._swap_data_ptr_(self._blocks[key].pop())
            return
        while self._kept_block_bytes() and self._kept_block_bytes() + self._out_bytes > self.max_block_bytes:
            largest = max((k for k in self._blocks if self._blocks[k]), key=lambda k: k[0])
            self._blocks[largest].pop()
        block = torch.UntypedStorage(nbytes, device=storage.device)
        storage._swap_data_ptr_(block)

    def empty(self, storage: torch.UntypedStorage) -> None:
        """Take ``storage``'s memory away (it keeps its identity, now 0 bytes); the block is kept while
        blocks in use and kept stay within the limit."""
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        # never below 0: the engine's start empties blocks that were not filled here
        self._out_bytes = max(0, self._out_bytes - nbytes)
        if not _SWAP or self._kept_block_bytes() + self._out_bytes + nbytes > self.max_block_bytes:
            storage.resize_(0)
            return
        holder = torch.UntypedStorage(0, device=storage.device)
        storage._swap_data_ptr_(holder)
        self._blocks[(nbytes, str(storage.device))].append(holder)

    # -- flat tensors (gradient buffers, reduction results) -------------------------------------
    def tensor(self, numel: int, dtype: torch.dtype, device, zero: bool = False) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements, zeroed if asked."""
        free = self._flat[(numel, dtype, str(device))]
        if free:
            t = free.pop()
            return t.zero_() if zero else t
        self.tensor_allocations += 1
        make = torch.zeros if zero else torch.empty
        return make(numel, dtype=dtype, device=device)

    def give(self, t: torch.Tensor) -> None:
        """Hand back a tensor from ``tensor`` once nothing (no collective in flight) uses it."""
        self._flat[(t.numel(), t.dtype, str(t.device))].append(t)

    def trim(self) -> None:
        """Keep the ``max_kept_tensors`` largest flat buffers, release the rest (before a forward, where the
        memory model gives activations the room)."""
        kept = sorted(((t.numel() * t.element_size(), key, i) for key, ts in self._flat.items()
                       for i, t in enumerate(ts)), key=lambda x: x[0], reverse=True)[: self.max_kept_tensors]
        keep = {(key, i) for _, key, i in kept}
        for key in list(self._flat):
            self._flat[key] = [t for i, t in enumerate(self._flat[key]) if (key, i) in keep]

    def held_bytes(self) -> int:
        return sum(s.nbytes() for blocks in self._blocks.values() for s in blocks) + \
            sum(t.numel() * t.element_size() for ts in self._flat.values() for t in ts)
