"""hcomm: collectives and parallel training for heterogeneous clusters.

Importing hcomm registers the ``hcomm`` torch.distributed backend and does
nothing else (no environment changes, no patching of torch)::

    import hcomm, torch.distributed as dist
    dist.init_process_group("hcomm")          # or new_group(ranks, backend="hcomm")
    hcomm.all_gather_v(out, shard, sizes)     # uneven collectives, direct API
"""
__version__ = "0.1.0"

import torch  # noqa: F401  (hcomm._C links against libtorch; load it first)
import torch.distributed  # noqa: F401

from hcomm.errors import HCommError, HCommValueError  # noqa: F401
from hcomm._backend import register as _register
from hcomm.collectives import (  # noqa: F401
    ReduceOp, algorithms, all_gather, all_gather_v, all_reduce, all_to_all, all_to_all_v, barrier, broadcast,
    clear_history, gather, history, last_op, plan, predict, recv, reduce, reduce_scatter, reduce_scatter_v,
    scatter, send, set_algorithm, set_compression, set_timeout,
)

from hcomm.topology import topology  # noqa: F401,E402

_register()
