"""The table of benchmarked operations, and which argument combinations make sense.

Each operation is one small class (``collectives.py``, ``uneven.py``,
``p2p.py``); this module only lists them, so the CLI, the runner and the
docs all see one registry.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from hcomm.bench.base import Collective, redop_problem
from hcomm.bench.collectives import EVEN
from hcomm.bench.p2p import P2P
from hcomm.bench.uneven import UNEVEN

OPS: Dict[str, Collective] = {op.name: op for op in EVEN + P2P + UNEVEN}


def op_names() -> List[str]:
    return list(OPS)


def get(name: str) -> Collective:
    return OPS[name]


def combination_problem(op: Collective, dtype_name: str, redop: str, nranks: int,
                        root: int) -> Optional[str]:
    """A message naming what is wrong with running ``op`` this way, or None."""
    if nranks < max(op.min_ranks, 1):
        return f"{op.name} needs at least {op.min_ranks} ranks, got {nranks}"
    if op.reduces:
        problem = redop_problem(dtype_name, redop)
        if problem:
            return problem
    if op.has_root and not 0 <= root < nranks:
        return f"--root ({root}) must be a rank in 0..{nranks - 1}"
    return None


def busbw(algbw: float, op: Collective, nranks: int) -> float:
    return algbw * op.busbw_factor(nranks)
