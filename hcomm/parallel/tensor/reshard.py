"""New TP fractions mid-run, with the training state: ``reshard(pm, optimizer, plan, ...)``.

When a member of a TP group turns slow, moving rows between groups (``train.drift.resplit_rows``)
leaves its shard where it is, and its group still waits for it inside every layer.  A smaller
fraction for it changes the shape of every shard, so the state -- parameters and the optimizer's
moments -- is put together and cut again: each TP group gathers its members' shards (one gather of
their bytes inside the group, ``_gather_flat``), every rank rebuilds the whole reference
tensors, and the new plan's ``tensor_parallelize`` cuts them; the moments are cut by the very same
split (a model whose weights are a moment, cut like the parameters).  Values are copied, never
recomputed: from that step on the run trains what one started with the new split would.

The new plan may also regroup the ranks or reorder them inside a group: every old group holds the
whole model, so any new layout can be cut from it.  Plans of TP groups with data parallelism across
them (a pipeline of TP groups keeps its split: ``pipeline.restage``).  Memory: for the moment each
rank holds the whole model's parameters and moments as gathered (3x the reference model), a reference
model the loads copy (1x) and one whole model being cut (1x) -- the price of not writing a per-tensor
redistribution, paid once per re-split.
"""
from __future__ import annotations

import copy
import math
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from hcomm.collectives import all_gather_v, uses_hcomm
from hcomm.parallel.tensor.unshard import Shard, join_shards, piece_shards


PieceStates = Dict[str, Dict[str, object]]   # a piece's optimizer state per parameter name, by state key


def _state_shards(piece: nn.Module, shards: Dict[str, Shard], optimizer) -> Dict[str, Dict[str, object]]:
    """Per parameter of ``piece`` (``shards``: its ``piece_shards``): its optimizer state (none without an
    optimizer), each tensor shaped like the parameter as a ``Shard`` cut like it, anything else as is
    (AdamW's step)."""
    out: Dict[str, Dict[str, object]] = {}
    for full, p in _named(piece).items():
        index, dim, _ = shards[full]
        state = optimizer.state.get(p, {}) if optimizer is not None else {}
        out[full] = {key: ((index, dim, value.detach().cpu().clone())
                           if torch.is_tensor(value) and value.shape == p.shape and value.dim() else value)
                     for key, value in state.items()}
    return out


def _joined(gathered: List[Dict[int, Tuple[Dict[str, Shard], Dict[str, Dict[str, object]]]]], piece: int):
    """(whole parameters, {state key: whole tensor or the value}) of one piece from every member's shards."""
    params = join_shards([g[piece][0] for g in gathered])
    states: Dict[str, Dict[str, object]] = {}
    for name in params:
        keys = gathered[0][piece][1].get(name, {})
        states[name] = {}
        for key, value in keys.items():
            if isinstance(value, tuple):
                states[name][key] = join_shards([{name: g[piece][1][name][key]} for g in gathered])[name]
            else:
                states[name][key] = value
    return params, states


def _reference(config) -> nn.Module:
    """A reference model to load gathered tensors into (its initial weights are drawn, then overwritten;
    not from training's RNG)."""
    from hcomm.models.llama import Llama

    with torch.random.fork_rng():
        return Llama(config)


def _whole_model(config, pieces: List[Dict[str, torch.Tensor]], fill_missing: bool = False,
                 template: Optional[nn.Module] = None) -> nn.Module:
    """The reference model with every piece's parameters from ``pieces`` (by names inside the piece);
    ``fill_missing``: a parameter not given is zeros (a moment of a parameter that has no optimizer state
    yet: it gets none after the cut either), else a ValueError naming it.  ``template``: a reference model
    to copy instead of building one (a copy of memory, where building draws every initial weight)."""
    from hcomm.models.llama import layer_modules

    whole = copy.deepcopy(template) if template is not None else _reference(config)
    for i, piece in enumerate(layer_modules(whole)):
        missing = set(_named(piece)) - set(pieces[i])
        if missing and not fill_missing:
            raise ValueError(f"re-sharding: piece {i} lacks {sorted(missing)} in the gathered shards")
        given = dict(pieces[i], **{n: torch.zeros_like(p) for n, p in _named(piece).items() if n in missing})
        piece.load_state_dict(given, strict=False)   # buffers (rotary tables) are the model's own
    return whole


def _cut_like(tp_model: nn.Module, whole: nn.Module) -> nn.Module:
    """``whole`` cut exactly as ``tp_model`` was (same group, fractions, shard): its parameters are then
    ``whole``'s tensors in the shapes of ``tp_model``'s."""
    from hcomm.parallel.tensor.parallelize import tensor_parallelize

    return tensor_parallelize(whole, tp_model.group, tp_model.fractions, index=tp_model.index,
                              sequence_parallel=tp_model.seq is not None, shard_ranks=tp_model.shard_ranks)


def gather_whole(tp_model: nn.Module, optimizer=None) -> List[Tuple[Dict[str, torch.Tensor], PieceStates]]:
    """Per piece of a TP model: (whole parameters, whole optimizer state) by the names inside the piece,
    on every member of its group (collective over the group)."""
    from hcomm.models.llama import layer_modules

    mine = {}
    for i, piece in enumerate(layer_modules(tp_model)):
        shards = piece_shards(piece, tp_model.index)
        mine[i] = (shards, _state_shards(piece, shards, optimizer))
    gathered = _gather_flat(mine, tp_model.group)
    return [_joined(gathered, i) for i in range(len(mine))]


ALIGN = 16   # bytes: every tensor starts at a multiple of its element size in the gathered buffer


def _map_slots(tree: Dict[int, tuple], fn: Callable) -> Dict[int, tuple]:
    """``tree`` (per piece: shards and their optimizer states) with every (index, dim, tensor) slot
    replaced by ``fn(slot)``, anything else (AdamW's step) as is."""
    return {i: ({name: fn(slot) for name, slot in shards.items()},
                {name: {key: fn(v) if isinstance(v, tuple) else v for key, v in state.items()}
                 for name, state in states.items()})
            for i, (shards, states) in tree.items()}


def _gather_flat(mine: Dict[int, tuple], group) -> List[Dict[int, tuple]]:
    """Every member's ``mine`` (per piece: its shards and their optimizer states) on every member.

    The tensors travel as one byte buffer per rank in one uneven gather (the members' shards differ by
    their fractions), only the skeleton -- names, how each was cut, AdamW's step -- as Python objects.
    Gathering the whole structure as objects pickled every byte: on 2 local ranks (small model, AdamW)
    1.18 s against 0.35 s as bytes (``benchmarks/train/bench_reshard_gather.py``).  On the emulator's
    quotas the copies around it dominate either way (the move 6.9 vs 7.5 s)."""
    tensors: List[torch.Tensor] = []

    def strip(slot):
        index, dim, tensor = slot
        tensors.append(tensor.contiguous())
        return index, dim, len(tensors) - 1

    skeleton = _map_slots(mine, strip)
    layout, offset = [], 0
    for t in tensors:
        layout.append((offset, t.dtype, tuple(t.shape)))
        offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    metas: List = [None] * dist.get_world_size(group)
    dist.all_gather_object(metas, (skeleton, layout, offset), group=group)
    lengths = [m[2] for m in metas]
    uneven = uses_hcomm(group)
    flat = torch.zeros(offset if uneven else max(lengths), dtype=torch.uint8)
    for (at, _, _), t in zip(layout, tensors):
        flat[at:at + t.numel() * t.element_size()] = t.view(-1).view(torch.uint8)
    if uneven:
        # the uneven gather into one buffer: 2 x 45 MB in 0.03 s on 2 local ranks, where torch's list
        # form took 0.14 s on the same hcomm group (0.09 s on gloo)
        whole = torch.empty(sum(lengths), dtype=torch.uint8)
        all_gather_v(whole, flat, lengths, group=group)
        buffers = list(whole.split(lengths))
    else:   # any other backend: torch's list form, every rank's buffer padded to the longest
        buffers = [torch.empty(len(flat), dtype=torch.uint8) for _ in metas]
        dist.all_gather(buffers, flat, group=group)
    out = []
    for (skel, lay, _), buf in zip(metas, buffers):
        views = [buf[at:at + math.prod(shape) * torch.empty((), dtype=dtype).element_size()].view(dtype).view(shape)
                 for at, dtype, shape in lay]
        out.append(_map_slots(skel, lambda slot, views=views: (slot[0], slot[1], views[slot[2]])))
    return out


def whole_model(tp_model: nn.Module) -> nn.Module:
    """The reference model from a TP model's shards (collective over its group)."""
    return _whole_model(tp_model.config, [params for params, _ in gather_whole(tp_model, None)])


def reshard(pm, optimizer, plan, build_optimizer: Callable, lr: float):
    """``pm``'s training state cut for ``plan``'s TP groups and fractions (same world and model): (new
    ParallelModel, new optimizer).  Every rank calls it with the same plan; the old ``pm`` is closed."""
    from hcomm.models.llama import layer_modules
    from hcomm.parallel.parallelize import parallelize

    if pm.pipe is not None or plan.pipeline_groups() or not plan.tensor_groups() or not pm.plan.tensor_groups():
        raise ValueError("re-sharding moves the TP split of plans of TP groups without a pipeline (a pipeline of "
                         "TP groups re-stages its layers instead)")
    clock = time.perf_counter()
    phases = {}

    def phase(name):   # where the seconds go (the run's record shows them beside the predicted move)
        nonlocal clock
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - clock
        clock = now
    tp_model = pm.model
    joined = gather_whole(tp_model, optimizer)
    phase("gather")
    scale = pm.precision.loss_scale if pm.precision is not None else None
    steps, groups, config = pm.steps, pm.groups, tp_model.config
    pm.close()
    template = _reference(config)   # one draw of initial weights; the parameters and each moment copy it
    whole = _whole_model(config, [params for params, _ in joined], template=template)
    phase("rebuild")
    new = parallelize(whole, plan, groups)
    phase("cut")
    new.steps = steps
    if new.precision is not None and scale is not None and new.precision.loss_scale is not None:
        new.precision.loss_scale = scale   # an fp16 run's dynamic loss scale goes on where it was
    new_optimizer = build_optimizer(new.parameters(), lr)
    states = [piece_states for _, piece_states in joined]
    keys = sorted({k for piece_states in states for state in piece_states.values()
                   for k, v in state.items() if torch.is_tensor(v) and v.dim()})
    moments = {}   # key -> per piece, the new shards of that moment by the piece's parameter names
    for key in keys:
        model = _whole_model(config, [{n: state[key] for n, state in piece_states.items() if key in state}
                                      for piece_states in states], fill_missing=True, template=template)
        moments[key] = [_named(piece) for piece in layer_modules(_cut_like(new.model, model))]
        phase("moments")
    held = {id(p) for p in new.parameters()}
    for i, piece in enumerate(layer_modules(new.model)):
        for name, p in _named(piece).items():
            if id(p) in held and states[i].get(name):
                new_optimizer.state[p] = {key: moments[key][i][name].detach().clone() if key in moments else
                                          (value.clone() if torch.is_tensor(value) else value)
                                          for key, value in states[i][name].items()}
    phase("optimizer")
    new.reshard_phases = phases
    return new, new_optimizer


def _named(piece: nn.Module) -> Dict[str, nn.Parameter]:
    """A piece's parameters by their names inside it (``unshard.piece_shards``'s names)."""
    return {f"{m}.{n}" if m else n: p for m, module in piece.named_modules()
            for n, p in module.named_parameters(recurse=False)}
