"""torch's own sharding at what torch can do: the baselines hcomm's ZeRO is measured against.

``--plan uniform --zero 2|3`` is FSDP2 (``fully_shard`` on every piece of
``layer_modules()`` and on the root, even ``torch.chunk`` shards, its
default prefetch); stage 3 reshards after forward, stage 2 keeps the
parameters for backward (FSDP2's ``SHARD_GRAD_OP``).  ``--zero 1`` is DDP
with ``ZeroRedundancyOptimizer`` (optimizer state sharded, gradients
all-reduced whole).  Both average over ranks, so they need equal batches.
"""
from __future__ import annotations

import torch


def shard_with_fsdp2(model: torch.nn.Module, group, stage: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    if stage not in (2, 3):
        raise ValueError(f"the FSDP2 baseline runs ZeRO stage 2 or 3, not {stage}")
    mesh = DeviceMesh.from_group(group, "cpu" if not torch.cuda.is_available() else "cuda")
    reshard = stage == 3
    for piece in model.layer_modules():
        fully_shard(piece, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model


def zero_redundancy_optimizer(params, group, lr: float) -> torch.optim.Optimizer:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(list(params), optimizer_class=torch.optim.AdamW, process_group=group, lr=lr,
                                   weight_decay=0.1)
