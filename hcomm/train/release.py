"""Give a finished plan's memory back before the next one builds its model.

One ``hcomm train`` launch trains its plans (and the search's trial candidates) one after another in
each rank's process.  Dropping a plan's model, optimizer and engine frees their tensors to glibc's heap,
which keeps most of it: measured on ``mixed-speed`` (small model, seven plans in one launch), the V100
rank's resident memory after each plan climbed 771 -> 917 MiB against its emulated 1 GiB, and a launch of
all nine accuracy plans had that rank OOM-killed in its sixth (ZeRO-3, step 3) where the same plan alone
fits.  ``malloc_trim(0)`` hands the free pages back: the same launch then stood at 396-412 MiB after
every plan (peak 844 MiB, in the plan with the V100's largest batch).  A device allocator has the
same question (torch's ``empty_cache``); on the CPU it is glibc's."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from typing import Callable, Optional


@functools.lru_cache(maxsize=None)
def _malloc_trim() -> Optional[Callable[[int], int]]:
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim") if name else None
    except (OSError, AttributeError):   # not glibc (musl, macOS): nothing to trim
        return None


def release_memory() -> bool:
    """Collect cycles (a plan's hooks hold its model and engine in them) and return the heap's free pages
    to the system; True where the C library could trim."""
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
