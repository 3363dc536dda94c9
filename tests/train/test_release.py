"""Between plans a rank hands freed memory back (``hcomm.train.release``): glibc keeps a freed heap's
pages otherwise, and a small-memory emulated rank was OOM-killed in a later plan of one launch."""
import re

import torch

from hcomm.train.release import release_memory


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


def test_freed_heap_pages_go_back_only_when_released():
    """2,000 tensors of 100 KB (under glibc's 128 KiB mmap threshold: they come from the heap), all freed
    but the last (it pins the heap's top, so glibc's own top trim cannot return the rest): the freed
    ~190 MiB stay resident until ``release_memory`` trims them."""
    before = _rss_mib()
    blocks = [torch.ones(25_000) for _ in range(2_000)]   # 100,000 bytes each, touched
    pin = torch.ones(25_000)
    held = _rss_mib()
    assert held - before > 150, (before, held)
    del blocks
    freed = _rss_mib()
    assert held - freed < 50, (held, freed)      # freed, but still resident
    assert release_memory() is True              # glibc on this platform
    released = _rss_mib()
    assert freed - released > 150, (freed, released)
    del pin
