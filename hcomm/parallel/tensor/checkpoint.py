"""A TP model's training state in the layout-free checkpoint of ``train.checkpoint``.

``hcomm train``'s checkpoints key every tensor by the reference model's parameter names (the
optimizer's state flattened as torch's ``flatten_optimizer_state_dict`` does: ``state.<name>.<key>``,
``param_groups.<name>.<option>``), so one written by data parallelism or a pipeline loads into any
other cut.  A TP rank holds uneven shards of 2-D weights, which DCP cannot describe as chunks of one
tensor (its DTensor path takes offsets from an even split; the ZeRO format is 1-D ranges).  So the
shards go through the reference layout, as a re-shard does (``tensor.reshard``): each TP group gathers
its members' shards, every member holds the whole parameters and moments, and DCP writes each
tensor once (a pipeline of TP groups: the pieces of its stage); loading reads the whole tensors on
every rank and cuts them as this rank's shard is cut.

Memory: for the moment of a save or a load a rank holds the whole model's parameters and moments
(3x the reference model with AdamW), as a re-shard does -- the price of not describing uneven 2-D
chunks to DCP, paid per checkpoint, not per step.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from torch import nn

from hcomm.parallel.tensor.reshard import _cut_like, _named, _reference, _whole_model, gather_whole


def _reference_names(config) -> List[Dict[str, str]]:
    """Per piece of the reference model: its parameters' names inside the piece -> in the whole model
    (built on the meta device: no memory, no weights drawn)."""
    from hcomm.models.llama import Llama, layer_modules

    with torch.device("meta"):
        model = Llama(config)
    full = {id(p): n for n, p in model.named_parameters()}
    return [{inner: full[id(p)] for inner, p in _named(piece).items()} for piece in layer_modules(model)]


def state_dicts(tp_model: nn.Module, optimizer) -> Tuple[dict, dict]:
    """(model, flattened optimizer) state dicts of the pieces this TP group steps -- the whole reference
    model, or a pipeline stage's pieces (the others are stale copies) -- on every rank of the group
    (collective over the group)."""
    from hcomm.models.llama import layer_modules

    joined = gather_whole(tp_model, optimizer)
    names = _reference_names(tp_model.config)
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    stepped = [any(id(p) in group_of for p in piece.parameters()) for piece in layer_modules(tp_model)]
    options = {}   # the options of the group that steps each piece's parameters (shards of one name share it)
    for i, piece in enumerate(layer_modules(tp_model)):
        for inner, p in _named(piece).items():
            if id(p) in group_of:
                options[names[i][inner]] = {k: v for k, v in group_of[id(p)].items() if k != "params"}
    model_state, optim_state = {}, {}
    for i, (params, states) in enumerate(joined):
        if not stepped[i]:
            continue
        for inner, tensor in params.items():
            full = names[i][inner]
            model_state[full] = tensor
            for key, value in states.get(inner, {}).items():
                optim_state[f"state.{full}.{key}"] = value
            for key, value in options.get(full, {}).items():
                optim_state[f"param_groups.{full}.{key}"] = value
    return model_state, optim_state


def load(path: str, tp_model: nn.Module, optimizer, group) -> None:
    """Fill this rank's shards, of every piece, and the optimizer state of those it steps, from a
    checkpoint of any plan (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from hcomm.models.llama import layer_modules

    config = tp_model.config
    names = _reference_names(config)
    template = _reference(config)
    pieces = [_named(piece) for piece in layer_modules(template)]
    model_state = {names[i][inner]: p.data for i, piece in enumerate(pieces) for inner, p in piece.items()}
    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    optim_state = {key[len("optimizer."):]: torch.empty(meta.size, dtype=meta.properties.dtype)
                   for key, meta in saved.items()
                   if key.startswith("optimizer.state.") and isinstance(meta, TensorStorageMetadata)}
    dcp.load({"model": model_state, "optimizer": optim_state}, checkpoint_id=path, process_group=group)
    where = {full: (i, inner) for i, piece in enumerate(names) for inner, full in piece.items()}
    states: List[Dict[str, Dict[str, torch.Tensor]]] = [{} for _ in names]   # per piece, name, key
    for key, value in optim_state.items():
        full, what = key[len("state."):].rsplit(".", 1)
        i, inner = where[full]
        states[i].setdefault(inner, {})[what] = value
    whole = _whole_model(config, [{inner: p.data for inner, p in piece.items()} for piece in pieces],
                         template=template)
    mine = layer_modules(tp_model)
    for piece, cut in zip(mine, layer_modules(_cut_like(tp_model, whole))):
        cut_params = _named(cut)
        with torch.no_grad():
            for inner, p in _named(piece).items():
                p.copy_(cut_params[inner])
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    moments = sorted({k for piece in states for s in piece.values() for k, v in s.items() if v.dim()})
    cut_moments = {}
    for key in moments:
        model = _whole_model(config, [{inner: s[key] for inner, s in piece.items() if key in s} for piece in states],
                             fill_missing=True, template=template)
        cut_moments[key] = [_named(piece) for piece in layer_modules(_cut_like(tp_model, model))]
    for i, piece in enumerate(mine):
        for inner, p in _named(piece).items():
            if id(p) in held and states[i].get(inner):
                optimizer.state[p] = {key: cut_moments[key][i][inner].detach().clone() if value.dim() else value.clone()
                                      for key, value in states[i][inner].items()}
