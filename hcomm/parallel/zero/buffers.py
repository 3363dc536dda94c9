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

So the engine takes these buffers from a pool and gives them back to it: after the first round no
unit-sized block comes from the C library again, and what the pool holds is at most the most that was
in use at once (the high-water mark the memory model already counts).

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
    def __init__(self) -> None:
        self._blocks: Dict[Tuple[int, str], List[torch.UntypedStorage]] = defaultdict(list)
        self._flat: Dict[Tuple[int, torch.dtype, str], List[torch.Tensor]] = defaultdict(list)
        self.allocations = 0     # blocks that came from the allocator (for tests and the record)

    # -- a storage's memory (the unit's whole parameters) --------------------------------------
    def fill(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """Give an empty ``storage`` ``nbytes`` of memory (contents undefined): a pooled block if there
        is one of that size, else a new one."""
        if storage.nbytes() >= nbytes:
            return
        key = (nbytes, str(storage.device))
        if _SWAP and storage.nbytes() == 0:
            if self._blocks[key]:
                storage._swap_data_ptr_(self._blocks[key].pop())
                return
            block = torch.UntypedStorage(nbytes, device=storage.device)
            self.allocations += 1
            storage._swap_data_ptr_(block)
            return
        self.allocations += 1
        storage.resize_(nbytes)

    def empty(self, storage: torch.UntypedStorage) -> None:
        """Take ``storage``'s memory away (it keeps its identity, now 0 bytes); the block is kept."""
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        if not _SWAP:
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
        self.allocations += 1
        make = torch.zeros if zero else torch.empty
        return make(numel, dtype=dtype, device=device)

    def give(self, t: torch.Tensor) -> None:
        """Hand back a tensor from ``tensor`` once nothing (no collective in flight) uses it."""
        self._flat[(t.numel(), t.dtype, str(t.device))].append(t)

    def held_bytes(self) -> int:
        return sum(s.nbytes() for blocks in self._blocks.values() for s in blocks) + \
            sum(t.numel() * t.element_size() for ts in self._flat.values() for t in ts)
