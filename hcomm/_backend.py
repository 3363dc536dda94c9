"""Registration of the ``hcomm`` torch.distributed backend.

``import hcomm`` calls :func:`register` once.  torch then calls
:func:`_create_backend` for every group that uses ``backend="hcomm"``
(``init_process_group``, ``new_group``, ``"cpu:hcomm"``) with a store that is
already prefixed for that group and device.  The host transport (gloo) is
created here, over its own ``PrefixStore``, because the torch wheel ships no
gloo headers; the C++ ProcessGroupHComm wraps it.
"""
from __future__ import annotations

import datetime
import json

import torch
import torch.distributed as dist

from hcomm.settings import declare

HCOMM_ALGO = declare(
    "HCOMM_ALGO", "",
    "force one algorithm for every collective that supports it (see `hcomm.algorithms()`); "
    "ops it cannot run fall back to the cost model's choice",
)
HCOMM_DEBUG = declare(
    "HCOMM_DEBUG", False,
    "before each collective, all ranks compare its number in the group's sequence, op, dtype, shape, element count, "
    "reduce op, root and split sizes; a mismatch, or a call one rank rejected as invalid, raises an error on every "
    "rank naming the disagreeing rank (costs one small all-gather per op)",
)
HCOMM_LINK_ALPHA = declare(
    "HCOMM_LINK_ALPHA", 50e-6, "latency (seconds) the cost model uses for flat algorithms; unset: the slowest tier's",
)
HCOMM_LINK_BETA = declare(
    "HCOMM_LINK_BETA", 1e9, "bandwidth (bytes/second) the cost model uses for flat algorithms; unset: the slowest tier's",
)

HCOMM_FORCE_STAGING = declare(
    "HCOMM_FORCE_STAGING", False,
    "push CPU tensors through the host-staged bridge between islands (copy up to separate staging blocks on "
    "copy threads, chunks on the host transport, copy down), exactly the path a GPU island's tensors take to a "
    "CPU or other-vendor island; for testing that path without a device (set it on every rank)",
)
HCOMM_HIER_EXCHANGE = declare(
    "HCOMM_HIER_EXCHANGE", "auto",
    "cross-island step of the hierarchical all-reduce: auto (the cost model's choice), direct (every island's "
    "partial to every other island) or owner (islands reduce shares sized by their uplinks, then send the results "
    "back; less traffic from 3 islands up)",
)
HCOMM_BRIDGE_CHUNK = declare(
    "HCOMM_BRIDGE_CHUNK", 1 << 20,
    "bytes per chunk of a host-staged cross-island message (copies of one chunk overlap the wire of the next; "
    "the same on every rank)",
)

_registered = False


def forced_algorithm() -> str:
    """HCOMM_ALGO, checked: an unknown name is an error here rather than silently ignored.

    Only unknown names fail; a known algorithm that some op cannot run falls
    back to the cost model for that op, as documented.
    """
    from hcomm.errors import HCommValueError

    name = str(HCOMM_ALGO.get()).strip()
    if not name:
        return ""
    from hcomm import _C

    choices = [n for n, _ in _C.algorithms()]
    if name not in choices:
        raise HCommValueError(f"HCOMM_ALGO={name!r} is not an algorithm (choose from: {', '.join(choices)})")
    return name


def _devices():
    from hcomm import _C

    devices = ["cpu"]
    if _C.has_cuda:
        devices.append("cuda")
    return devices


_exit_hook = False


def _destroy_groups_at_exit() -> None:
    """Tear the process groups down at interpreter exit when the script did not.

    An hcomm group holds gloo groups whose threads may still hold Python
    objects; left to Python's own finalisation, such a thread is unwound
    during shutdown and the process aborts ('terminate called without an
    active exception', about 1 run in 10 of a script without
    destroy_process_group; 0 in 10 with this hook)."""
    global _exit_hook
    if _exit_hook:
        return
    import atexit

    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    _exit_hook = True


def _create_backend(store, rank: int, size: int, timeout: datetime.timedelta):
    from hcomm import _C

    _destroy_groups_at_exit()

    from hcomm.profiling import resolve
    from hcomm.topology import HCOMM_PROPORTIONAL_SHARDS, exchange

    host = dist.ProcessGroupGloo(dist.PrefixStore("hcomm/host", store), rank, size, timeout)
    device = None
    if _C.has_cuda and torch.cuda.is_available() and dist.is_nccl_available():
        device = dist.ProcessGroupNCCL(dist.PrefixStore("hcomm/nccl", store), rank, size)
    topo = exchange(store, rank, size)
    island_pg = None
    if len(topo.islands) > 1:
        # This rank's island group.  Every member creates it together, over a
        # prefix of its own.  On CPU the island's library is gloo; across
        # islands hcomm uses the host (gloo) group: host-staged, which is what
        # joins islands of different vendors.
        me = topo.island_of(rank)
        members = topo.islands[me]
        island_pg = dist.ProcessGroupGloo(dist.PrefixStore(f"hcomm/island/{me}", store),
                                          members.index(rank), len(members), timeout)
    shm = None
    if island_pg is not None:
        from hcomm import shm as shm_mod

        shm = shm_mod.island_transport(dist.PrefixStore("hcomm/shm", store), topo, rank, timeout)
        probe_pg = shm_mod.ProbeGroup(shm) if shm is not None else island_pg
        topo.links = resolve(topo, rank, host, probe_pg, shm_mod.cache_variant(topo))
        if shm is not None and "intra" in topo.links:  # say what the intra figures are of
            link = topo.links["intra"]
            topo.links["intra"] = type(link)(link.alpha, link.beta, f"{link.source}, shared memory")
    else:
        topo.links = resolve(topo, rank, host, None)
    flat = topo.links.get("flat") or topo.links["inter"]
    alpha = HCOMM_LINK_ALPHA.get() if HCOMM_LINK_ALPHA.raw() else flat.alpha
    beta = HCOMM_LINK_BETA.get() if HCOMM_LINK_BETA.raw() else flat.beta
    pg = _C.ProcessGroupHComm(store, rank, size, timeout, host, device,
                              algorithm=forced_algorithm(), debug=HCOMM_DEBUG.get(), alpha=alpha, beta=beta)
    if island_pg is not None:
        intra, inter = topo.links["intra"], topo.links["inter"]
        pg.set_hierarchy(topo.islands, island_pg, intra.alpha, intra.beta, inter.alpha, inter.beta,
                         [r.inter_weight for r in topo.ranks], bool(HCOMM_PROPORTIONAL_SHARDS.get()),
                         topo.uplink_sharing(), intra_transport=shm, island_betas=list(topo.uplinks),
                         exchange=_exchange())
        from hcomm.compress import resolve as compression

        cfg = compression(None)  # HCOMM_COMPRESS
        if cfg.enabled:
            from hcomm.collectives import _dtype_code

            pg.set_compression(_dtype_code(cfg.wire), cfg.chunk, cfg.error_feedback)
        _set_staging(pg, device is not None)
    pg.topology_json = json.dumps(topo.to_dict())
    return pg


def _exchange() -> int:
    from hcomm.errors import HCommValueError

    choices = {"auto": 0, "direct": 1, "owner": 2}
    name = str(HCOMM_HIER_EXCHANGE.get()).strip().lower()
    if name not in choices:
        raise HCommValueError(f"HCOMM_HIER_EXCHANGE={name!r} is not one of {', '.join(choices)}")
    return choices[name]


def _set_staging(pg, has_device: bool) -> None:
    """Host staging of the inter-island tier: forced (CPU tensors too), or for this rank's device tensors."""
    from hcomm.errors import HCommValueError

    chunk = int(HCOMM_BRIDGE_CHUNK.get())
    if chunk <= 0:
        raise HCommValueError(f"HCOMM_BRIDGE_CHUNK must be a positive number of bytes, got {chunk}")
    forced = bool(HCOMM_FORCE_STAGING.get())
    # Copy-up/down link for the cost model: a memcpy on a copy thread when
    # emulated; pinned PCIe (~25 GB/s per direction, Gen4 x16 measured) on a GPU.
    alpha, beta = (20e-6, 5e9) if forced or not has_device else (10e-6, 25e9)
    pg.set_staging(forced, chunk, alpha, beta)


def register() -> None:
    """Register backend ``hcomm`` with torch.distributed (idempotent)."""
    global _registered
    if _registered or "HCOMM" in dist.Backend._plugins:
        _registered = True
        return
    dist.Backend.register_backend("hcomm", _create_backend, extended_api=False, devices=_devices())
    _registered = True
