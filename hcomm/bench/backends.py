"""Which torch.distributed backends can be benchmarked, and what hcomm says it ran.

Everything that touches hcomm's own API is here and defensive: the bench
must run (gloo only) on a build without the hcomm backend, and must not
break when ``hcomm.last_op`` or ``hcomm.topology`` are missing or return
None.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist


def hcomm_registered() -> bool:
    """True if importing hcomm registered the ``hcomm`` backend."""
    try:
        import hcomm  # noqa: F401  (registers the backend as a side effect)
    except Exception:  # a broken extension build must not take the bench down
        return False
    return "hcomm" in dist.Backend.backend_list


def available(device: str) -> List[str]:
    names = ["gloo"]
    if device == "cuda" and torch.cuda.is_available() and dist.is_nccl_available():
        names.append("nccl")
    if hcomm_registered():
        names.append("hcomm")
    return names


def default_backends(device: str) -> List[str]:
    """Baseline first (the ratio column is relative to it), then hcomm."""
    have = available(device)
    base = "nccl" if "nccl" in have else "gloo"
    return [base] + (["hcomm"] if "hcomm" in have else [])


def missing_hcomm_api(name: str) -> bool:
    try:
        import hcomm
    except Exception:
        return True
    return not callable(getattr(hcomm, name, None))


def last_op(backend: str, group) -> Optional[Dict[str, Any]]:
    """hcomm's record of the last op on ``group`` as a plain dict, or None."""
    if backend != "hcomm":
        return None
    try:
        import hcomm

        fn = getattr(hcomm, "last_op", None)
        info = fn(group) if callable(fn) else None
    except Exception:
        return None
    if info is None:
        return None
    try:
        return dict(info)
    except (TypeError, ValueError):
        return None


def topology_summary(group) -> Optional[Dict[str, Any]]:
    """hcomm.topology(group) as JSON-able data, when hcomm provides it."""
    try:
        import hcomm

        fn = getattr(hcomm, "topology", None)
        topo = fn(group) if callable(fn) else None
    except Exception:
        return None
    if topo is None:
        return None

    def plain(x):
        if isinstance(x, (str, int, float, bool)) or x is None:
            return x
        if isinstance(x, dict):
            return {str(k): plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if hasattr(x, "__dict__"):
            return {k: plain(v) for k, v in vars(x).items() if not k.startswith("_")}
        return str(x)

    return {"ranks": plain(getattr(topo, "ranks", None)), "links": plain(getattr(topo, "links", None))}
