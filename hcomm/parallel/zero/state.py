"""ZeRO state <-> checkpoints: each rank saves its own uneven shard, any plan loads it.

A unit's shard is a range of the unit's flat buffer, so it touches each of
the unit's parameters in one contiguous range of that parameter's flattened
elements.  The checkpoint (checkpoint.py, DCP underneath) stores every
parameter as ``model/<name>`` and every per-element optimizer state as
``optim/<name>/<key>`` (AdamW: ``exp_avg``, ``exp_avg_sq``), each rank
writing only its ranges.  Scalar optimizer state (AdamW's ``step``) is the
same for every shard and goes in ``extra``.  Loading intersects the saved
ranges with the loading plan's own: other fractions, another world size,
another ZeRO stage, or one process (``load_into_model``).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from hcomm.parallel.zero import checkpoint
from hcomm.parallel.zero.checkpoint import FlatPiece


def _slices(engine):
    """(master, unit, param index, first, last, local view of the master) for every piece this rank owns."""
    for s in engine.units:
        u = s.unit
        for k, lo, hi in u.param_slices(u.shard_start, u.shard_start + u.shard_numel):
            begin = u.offsets[k] + lo - u.shard_start
            yield s.master, u, k, lo, hi, begin


def _pieces(engine, optimizer, keys: List[str]) -> List[FlatPiece]:
    pieces = []
    for master, u, k, lo, hi, begin in _slices(engine):
        name, shape = u.names[k], tuple(u.params[k].shape)
        pieces.append(FlatPiece(f"model/{name}", shape, torch.float32, lo, master.data[begin: begin + hi - lo]))
        state = optimizer.state[master] if optimizer is not None else {}
        for key in keys:
            pieces.append(FlatPiece(f"optim/{name}/{key}", shape, torch.float32, lo,
                                    state[key].data[begin: begin + hi - lo]))
    return pieces


def _elementwise_keys(optimizer, engine) -> Tuple[List[str], Dict[str, float]]:
    """The optimizer's per-element state (tensors shaped like the shard) and its scalars."""
    keys, scalars = set(), {}
    for s in engine.units:
        for key, value in optimizer.state.get(s.master, {}).items():
            if torch.is_tensor(value) and value.shape == s.master.shape and value.dim() == 1 and s.master.numel() > 1:
                keys.add(key)
            elif torch.is_tensor(value) and value.numel() == 1:
                scalars[key] = float(value)
            elif isinstance(value, (int, float)):
                scalars[key] = float(value)
    return sorted(keys), scalars


def save(path: str, engine, optimizer, group=None, extra: dict = None) -> None:
    """Every rank writes its shard of parameters and optimizer state (collective; atomic).  Under the
    island layout (HSDP) every island holds the whole model in its own shards, equal across islands (the
    replica all-reduce): only the first island's ranks write, so each element is written once."""
    import torch.distributed as dist

    keys, scalars = _elementwise_keys(optimizer, engine)
    info = dict(extra or {}, optimizer=type(optimizer).__name__, optim_keys=keys, optim_scalars=scalars,
                units=[s.unit.name for s in engine.units])
    replica = engine.replicate_group
    writes = replica is None or dist.get_rank(group=replica) == 0
    checkpoint.save(path, _pieces(engine, optimizer, keys) if writes else [], info, group=group)


def load(path: str, engine, optimizer, group=None) -> dict:
    """Fill this rank's shard (parameters, optimizer state) from a checkpoint of any plan (collective)."""
    info = checkpoint.describe(path)["extra"]
    if info.get("optimizer") not in (None, type(optimizer).__name__):
        raise ValueError(f"checkpoint at {path} holds {info['optimizer']} state; the optimizer here is "
                         f"{type(optimizer).__name__}")
    keys = list(info.get("optim_keys", []))
    for s in engine.units:   # the state the optimizer would create at its first step, to be overwritten
        state = optimizer.state[s.master]
        for key in keys:
            state[key] = torch.zeros_like(s.master)
        for key, value in info.get("optim_scalars", {}).items():
            state[key] = torch.tensor(value, dtype=torch.float32)
    extra = checkpoint.load(path, _pieces(engine, optimizer, keys), group=group)
    engine.after_step()        # stages 1-2: whole parameters from the loaded shards (stage 3 gathers on use)
    engine.wait_all_gathers()
    return extra


def load_into_model(path: str, model: torch.nn.Module) -> dict:
    """One process, no process group: the checkpoint's parameters into a plain model."""
    tensors, extra = checkpoint.load_full(path)
    names = dict(model.named_parameters())
    missing = [n for n in names if f"model/{n}" not in tensors]
    if missing:
        raise ValueError(f"checkpoint at {path} does not hold parameters {missing[:5]} of this "
                         f"{type(model).__name__} (is it another model?)")
    with torch.no_grad():
        for name, p in names.items():
            saved = tensors[f"model/{name}"]
            if tuple(saved.shape) != tuple(p.shape):
                raise ValueError(f"checkpoint at {path}: {name} has shape {tuple(saved.shape)}, the model's is "
                                 f"{tuple(p.shape)}")
            p.copy_(saved)
    return extra
