"""Shared-memory transport for the ranks of an island that share one host.

An island whose ranks all run on one host (one emulated node, one server's
GPUs staged through host memory) moves its intra-island traffic through
``/dev/shm`` rings (``csrc/core/shm``) instead of gloo's loopback TCP.  The
ranks meet through the group's store:

1. the island's first rank picks a unique name and publishes it;
2. every rank creates its region and reports "ok" or why it could not;
3. if all succeeded, every rank maps its peers' regions and reports again;
4. each rank removes its own name, so nothing stays in ``/dev/shm`` even if
   a process is killed later.

If any rank of the island fails a step, all of them fall back to the
island's vendor library together (the decision is read from the same store
keys), with a warning naming the rank and the reason.
"""
from __future__ import annotations

import datetime
import os
import uuid
import warnings
from typing import Optional

from hcomm.settings import declare

HCOMM_SHM = declare(
    "HCOMM_SHM", True,
    "move intra-island traffic through shared memory when all of an island's ranks share a host "
    "(off: the island's vendor library, gloo over loopback on CPU)")
HCOMM_SHM_RING = declare(
    "HCOMM_SHM_RING", 4 << 20,
    "bytes of each shared-memory ring (one per ordered pair of ranks in an island; multiple of 64)")


def _round(store, prefix: str, local: int, size: int, status: str) -> Optional[str]:
    """Publish this rank's status for one step; None when every rank is ok, else the first failure."""
    store.set(f"{prefix}/{local}", status)
    for r in range(size):
        got = store.get(f"{prefix}/{r}").decode()
        if got != "ok":
            return f"island rank {r}: {got}"
    return None


def single_host(topo, island: int) -> bool:
    members = topo.islands[island]
    return len(members) >= 2 and len({topo.ranks[r].host for r in members}) == 1


def cache_variant(topo) -> str:
    """Which islands use shared memory, for the link-profile cache key (same on every rank)."""
    if not HCOMM_SHM.get():
        return "noshm"
    return "shm" + "".join("1" if single_host(topo, i) else "0" for i in range(len(topo.islands)))


def island_transport(store, topo, rank: int, timeout: datetime.timedelta):
    """This rank's ShmTransport for its island, or None (not all on one host, off, or it failed)."""
    from hcomm import _C

    me = topo.island_of(rank)
    members = topo.islands[me]
    if not HCOMM_SHM.get() or not single_host(topo, me):
        return None  # every member sees the same topology, so all decide alike
    local = members.index(rank)
    prefix = f"hcomm/shm/{me}"
    if local == 0:
        store.set(f"{prefix}/name", f"hcomm-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    name = store.get(f"{prefix}/name").decode()
    transport, status = None, "ok"
    try:
        transport = _C.ShmTransport(name, local, len(members), timeout, int(HCOMM_SHM_RING.get()))
    except Exception as exc:  # /dev/shm full or missing, bad ring size, ...
        status = str(exc)
    failed = _round(store, f"{prefix}/created", local, len(members), status)
    if failed is None:
        try:
            transport.connect()
        except Exception as exc:
            status = str(exc)
        failed = _round(store, f"{prefix}/mapped", local, len(members), status)
    if transport is not None:
        transport.unlink()
    if failed is not None:
        warnings.warn(f"hcomm: island {me} uses its vendor library, not shared memory: {failed}")
        return None
    return transport


class ProbeGroup:
    """The send/recv surface of a process group that hcomm.profiling's probe uses, over a ShmTransport."""

    def __init__(self, transport):
        self.transport = transport

    class _Done:
        def wait(self):
            return True

    def send(self, tensors, peer: int, tag: int):
        self.transport.send(tensors[0].numpy(), peer, tag)
        return self._Done()

    def recv(self, tensors, peer: int, tag: int):
        self.transport.recv(tensors[0].numpy(), peer, tag)
        return self._Done()
