"""Checkpoints of uneven 1-D ZeRO shards through torch.distributed.checkpoint (DCP).

Every rank holds, per tensor (parameter or optimizer state), one contiguous
range of its flattened elements: sized by memory, possibly empty, together
covering each element once.  ``save`` has each rank write only its own ranges
(no gather to one rank); ``load`` fills any other layout (other ranges,
another world size), since DCP intersects saved chunks with requested ones;
``load_full`` rebuilds whole tensors in one process.

On disk, a directory on a file system every rank sees: DCP's ``.metadata``
and ``__<rank>_0.distcp`` (per name one 1-D global tensor of numel(shape)
elements, one chunk per held range; ``extra`` is a DCP bytes item from rank
0), then ``hcomm_checkpoint.json``, the commit marker written last (shapes,
dtypes, world size, every file's size).  Ranks write into a fresh sibling
``.<name>.tmp-<id>``; once DCP has gathered every rank's write results (all
data fsynced), rank 0 writes the marker, moves an older checkpoint aside,
renames the new one into place and deletes the old one.  A directory without
the marker is never loaded; ``save`` returns on no rank before the rename.

Mechanism (checked on torch 2.13): a custom SavePlanner/LoadPlanner, DCP's
documented extension point.  It states which chunk ``[start, start+n)`` of
which global 1-D tensor a rank writes (``WriteItem`` + ``ChunkStorageMetadata``)
and which chunks it reads, through DCP's own resharding intersection
(``create_read_items_for_chunk_list``).  Empty ranges are simply not written;
a rank may hold several disjoint ranges of a tensor.  The alternatives:
- ``__create_write_items__`` / ``__create_chunk_list__`` on a small wrapper:
  the default planners honour them only on torch.Tensor subclasses.  Saving a
  plain wrapper fails in ``find_state_dict_object`` ("is not a ShardedTensor,
  can't find by offset") and loading replaces it with None
  (``_init_state_dict``); a tensor subclass to carry an offset is overkill.
- ShardedTensor with arbitrary ShardMetadata handles uneven and empty shards,
  but torch is deprecating it ("Please use DTensor instead"), its public
  constructor runs a collective per tensor and the collective-free one is
  private.
- DTensor with Shard(0): DCP takes chunk offsets from the even torch.chunk
  split of the placements, not the local sizes: uneven ranges land wrong.

Errors are agreed on: each rank checks what it can, the ranks all-gather the
outcome, and if any failed every rank raises the same error (naming ranks and
files), so no rank is left waiting in a collective.  Loading unpickles
``.metadata`` and ``extra`` (as DCP does): load only checkpoints you trust.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import glob
import io
import json
import math
import os
import shutil
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex, TensorProperties,
                                                  TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, ReadItem, SavePlan, SavePlanner,
                                                 TensorWriteData, WriteItem, WriteItemType)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from hcomm.parallel.zero.commit import MARKER, check_replaceable, sibling
from hcomm.parallel.zero.commit import commit as commit_dir

__all__ = ["FlatPiece", "save", "load", "load_full", "describe", "MARKER"]

_FORMAT = "hcomm.zero.flat"
_VERSION = 1
_EXTRA_KEY = "__hcomm__/extra"  # the DCP bytes item holding `extra`


@dataclass
class FlatPiece:
    """One rank's contiguous range of one tensor's flattened elements."""

    name: str                # e.g. "model/blocks.0.attn.wq.weight" or "optim/blocks.0.attn.wq.weight/exp_avg"
    shape: Tuple[int, ...]   # the full tensor's shape
    dtype: torch.dtype
    start: int               # offset of this rank's elements in the flattened full tensor
    local: torch.Tensor      # 1-D contiguous, this rank's elements (numel may be 0)


class _DamagedFile(ValueError):
    """A checkpoint file that could not be read; the message names it."""


# ---------------------------------------------------------------------------
# agreement between ranks

_KINDS = {k.__name__: k for k in (ValueError, TypeError, FileNotFoundError, FileExistsError,
                                   NotADirectoryError, PermissionError, OSError, RuntimeError)}


def _kind_name(e: BaseException) -> str:
    return next((k.__name__ for k in type(e).__mro__ if _KINDS.get(k.__name__) is k), "RuntimeError")


def _brief(e: BaseException) -> str:
    """Our own errors (and plain OS errors) verbatim; anything else (pickle, zip, asserts) as its first line."""
    if type(e) in _KINDS.values() or isinstance(e, _DamagedFile):
        return str(e)
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


class _Ranks:
    """The calling rank's view of `group` and the agreement on errors; works without torch.distributed."""

    def __init__(self, group, distributed: Optional[bool] = None):
        if distributed is None:
            distributed = dist.is_available() and dist.is_initialized()
        self.distributed = distributed
        self.group = group
        if not distributed:
            if group is not None:
                raise ValueError("a process group was given but torch.distributed is not initialized")
            self.rank, self.world = 0, 1
            return
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ValueError("this process is not a member of the given process group")
        self.world = dist.get_world_size(group)

    def all_gather(self, obj) -> list:
        if not self.distributed:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def capture(self, fn):
        """(result, None) or (None, (error kind, message)): errors become data the ranks agree on."""
        try:
            return fn(), None
        except CheckpointException as e:  # a BaseException: DCP raises it on every rank, with each rank's failure
            failures = sorted(e.failures.items())
            kinds = {_kind_name(exc) for _, (exc, _tb) in failures}
            parts = [_brief(exc) if self.world == 1 else f"rank {r}: {_brief(exc)}" for r, (exc, _tb) in failures]
            return None, (kinds.pop() if len(kinds) == 1 else "RuntimeError", "; ".join(parts))
        except Exception as e:  # noqa: BLE001 - every failure must reach the other ranks
            return None, (_kind_name(e), _brief(e))

    def agreed(self, fn):
        """Run `fn` on every rank; if it failed on any rank, raise on every rank (a collective)."""
        result, error = self.capture(fn)
        self.raise_any(self.all_gather(error))
        return result

    def raise_any(self, errors: list) -> None:
        """Raise, on this rank, one error made of every rank's failure in `errors` (already all-gathered)."""
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if not failed:
            return
        by_message: Dict[str, List[int]] = {}
        for r, (_, msg) in failed:
            by_message.setdefault(msg, []).append(r)
        if len(by_message) == 1:
            msg, ranks = next(iter(by_message.items()))
            if len(ranks) < self.world:
                msg += f" (on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
        else:
            msg = "; ".join(f"rank {', '.join(map(str, ranks))}: {m}" for m, ranks in by_message.items())
        raise _KINDS.get(failed[0][1][0], RuntimeError)(msg)


@contextlib.contextmanager
def _dcp_quietly():
    """DCP warns that it runs in one process when no group is initialised; that is what we asked for."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


# ---------------------------------------------------------------------------
# pieces

def _check_pieces(pieces: List[FlatPiece]) -> None:
    """This rank's pieces on their own: types, bounds, no overlap, one shape and dtype per name."""
    by_name: Dict[str, List[FlatPiece]] = {}
    for p in pieces:
        if not isinstance(p, FlatPiece):
            raise TypeError(f"expected FlatPiece, got {type(p).__name__}")
        if not isinstance(p.name, str) or not p.name or p.name == _EXTRA_KEY:
            raise ValueError(f"invalid tensor name {p.name!r}")
        shape = tuple(p.shape)
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in shape):
            raise ValueError(f"piece {p.name!r}: invalid shape {p.shape}")
        if not isinstance(p.dtype, torch.dtype):
            raise ValueError(f"piece {p.name!r}: dtype {p.dtype!r} is not a torch.dtype")
        if not isinstance(p.local, torch.Tensor) or p.local.dim() != 1 or not p.local.is_contiguous():
            what = tuple(p.local.shape) if isinstance(p.local, torch.Tensor) else type(p.local).__name__
            raise ValueError(f"piece {p.name!r}: local must be a 1-D contiguous tensor, got {what}")
        if p.local.dtype != p.dtype:
            raise ValueError(f"piece {p.name!r}: local has dtype {p.local.dtype} but the piece says {p.dtype}")
        if not isinstance(p.start, int) or isinstance(p.start, bool):
            raise ValueError(f"piece {p.name!r}: start must be an int, got {p.start!r}")
        n, total = p.local.numel(), math.prod(shape)
        if p.start < 0 or p.start + n > total:
            raise ValueError(f"piece {p.name!r} covers elements [{p.start}, {p.start + n}) but the tensor "
                             f"of shape {shape} has {total} elements")
        by_name.setdefault(p.name, []).append(p)
    for name, ps in by_name.items():
        for p in ps[1:]:
            if (tuple(p.shape), p.dtype) != (tuple(ps[0].shape), ps[0].dtype):
                raise ValueError(f"pieces of {name!r} on one rank disagree: shape {tuple(ps[0].shape)} "
                                 f"{ps[0].dtype} vs shape {tuple(p.shape)} {p.dtype}")
        ranges = sorted((p.start, p.start + p.local.numel()) for p in ps if p.local.numel() > 0)
        for (a, b), (c, d) in zip(ranges, ranges[1:]):
            if c < b:
                raise ValueError(f"pieces of {name!r} on one rank overlap: elements [{a}, {b}) and [{c}, {d})")


def _check_cover(summaries: List[list]) -> Dict[str, Tuple[Tuple[int, ...], str]]:
    """All ranks' pieces together: one shape and dtype per name, every element held exactly once."""
    tensors: Dict[str, Tuple[int, Tuple[int, ...], str]] = {}
    ranges: Dict[str, List[Tuple[int, int, int]]] = {}
    for r, items in enumerate(summaries):
        for name, shape, dtype, start, n in items:
            first = tensors.setdefault(name, (r, shape, dtype))
            if (first[1], first[2]) != (shape, dtype):
                raise ValueError(f"ranks {first[0]} and {r} disagree about tensor {name!r}: shape {first[1]} "
                                 f"{first[2]} vs shape {shape} {dtype}")
            if n:
                ranges.setdefault(name, []).append((start, start + n, r))
    for name, (_, shape, _) in tensors.items():
        pos, prev = 0, None
        for a, b, r in sorted(ranges.get(name, [])):
            if a > pos:
                raise ValueError(f"elements [{pos}, {a}) of {name!r} (shape {shape}) are held by no rank")
            if a < pos:
                raise ValueError(f"ranks {prev} and {r} both hold elements [{a}, {min(b, pos)}) of {name!r}")
            pos, prev = b, r
        if pos < math.prod(shape):
            raise ValueError(f"elements [{pos}, {math.prod(shape)}) of {name!r} (shape {shape}) are held by no rank")
    return {name: (shape, dtype) for name, (_, shape, dtype) in tensors.items()}


def _parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)  # written as str(dtype) without "torch."
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


# ---------------------------------------------------------------------------
# DCP planners and reader

class _SavePlanner(SavePlanner):
    """Writes each non-empty piece as chunk [start, start+n) of a 1-D tensor of numel(shape) elements."""

    def __init__(self, pieces: List[FlatPiece], extra_bytes: Optional[bytes]):
        self.pieces = [p for p in pieces if p.local.numel() > 0]
        self.extra_bytes = extra_bytes  # only the coordinator writes extra
        self._src: Dict[Tuple[str, int], torch.Tensor] = {}

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator: bool = False) -> None:
        pass  # the pieces are the state

    def create_local_plan(self) -> SavePlan:
        items = []
        for p in self.pieces:
            offset = torch.Size([p.start])
            items.append(WriteItem(
                index=MetadataIndex(p.name, offset), type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(offsets=offset, sizes=p.local.shape),
                                            properties=TensorProperties(dtype=p.dtype),
                                            size=torch.Size([math.prod(p.shape)]))))
            self._src[(p.name, p.start)] = p.local
        if self.extra_bytes is not None:
            items.append(WriteItem(index=MetadataIndex(_EXTRA_KEY), type=WriteItemType.BYTE_IO))
        return SavePlan(items)

    def create_global_plan(self, all_plans):
        return create_default_global_save_plan(all_plans)  # concatenates the chunks into the metadata

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        return new_plan

    def resolve_data(self, write_item: WriteItem):
        if write_item.type == WriteItemType.BYTE_IO:
            return io.BytesIO(self.extra_bytes)
        # DCP copies to CPU and clones views of larger buffers before torch.save.
        return self._src[(write_item.index.fqn, write_item.index.offset[0])].detach()


class _LoadPlanner(LoadPlanner):
    """Reads, for each non-empty piece, the saved chunks that intersect [start, start+n) into piece.local."""

    def __init__(self, pieces: List[FlatPiece], path: str):
        self.pieces = [p for p in pieces if p.local.numel() > 0]
        self.path = path
        self.extra: Any = None
        self._dest: Dict[Tuple[str, int], torch.Tensor] = {}

    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        self.metadata = metadata

    def create_local_plan(self) -> LoadPlan:
        items: List[ReadItem] = []
        for p in self.pieces:
            md = self.metadata.state_dict_metadata.get(p.name)
            total = math.prod(p.shape)
            if not isinstance(md, TensorStorageMetadata) or md.size != torch.Size([total]):
                raise ValueError(f"checkpoint at {self.path} holds no {total}-element data for {p.name!r}")
            n = p.local.numel()
            chunk = ChunkStorageMetadata(offsets=torch.Size([p.start]), sizes=torch.Size([n]))
            reads = create_read_items_for_chunk_list(p.name, md, [chunk])
            got = sum(r.lengths[0] for r in reads)
            if got != n:
                raise ValueError(f"checkpoint at {self.path} holds only {got} of the {n} elements "
                                 f"[{p.start}, {p.start + n}) requested of {p.name!r}")
            self._dest[(p.name, p.start)] = p.local
            items += reads
        items.append(ReadItem(type=LoadItemType.BYTE_IO, dest_index=MetadataIndex(_EXTRA_KEY),
                              dest_offsets=torch.Size([0]), storage_index=MetadataIndex(_EXTRA_KEY),
                              storage_offsets=torch.Size([0]), lengths=torch.Size([0])))
        return LoadPlan(items)

    def create_global_plan(self, global_plan):
        return global_plan

    def finish_plan(self, new_plan: LoadPlan) -> LoadPlan:
        return new_plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        self.extra = torch.load(value, weights_only=False)

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        local = self._dest[(read_item.dest_index.fqn, read_item.dest_index.offset[0])]
        return local.narrow(0, read_item.dest_offsets[0], read_item.lengths[0])

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        pass  # resolve_tensor returned a view of piece.local: already in place


class _Reader(FileSystemReader):
    """DCP's file reader, with the metadata read up front and every read error naming its file."""

    def __init__(self, path: str, metadata):
        super().__init__(path)
        self._metadata = metadata

    def read_metadata(self, *args, **kwargs):
        return self._metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future:
        per_file: Dict[str, List[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for relative, items in per_file.items():
            try:
                super().read_data(dataclasses.replace(plan, items=items), planner).wait()
            except Exception as e:  # noqa: BLE001 - reported with the file's name
                raise _DamagedFile(f"checkpoint file {os.path.join(self.path, relative)} is damaged: "
                                   f"reading it failed with {_brief(e)}") from None
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(None)
        return done


# ---------------------------------------------------------------------------
# files

def _read_manifest(path: str) -> dict:
    if not os.path.exists(path):
        msg = f"no checkpoint at {path}"
        parent, base = os.path.split(path)
        aside = [d for d in sorted(glob.glob(os.path.join(parent, f".{glob.escape(base)}.old-*")))
                 if os.path.exists(os.path.join(d, MARKER))]
        if aside:
            msg += f" (an interrupted save left the previous checkpoint at {aside[0]})"
        raise FileNotFoundError(msg)
    if not os.path.isdir(path):
        raise ValueError(f"{path} is not a checkpoint directory")
    marker = os.path.join(path, MARKER)
    if not os.path.exists(marker):
        raise ValueError(f"checkpoint at {path} was not completely written (it has no commit marker {MARKER}); "
                         f"it cannot be loaded")
    try:
        with open(marker) as f:
            manifest = json.load(f)
        if manifest.get("format") != _FORMAT:
            raise ValueError(f"format {manifest.get('format')!r} is not {_FORMAT!r}")
        if manifest.get("version") != _VERSION:
            raise ValueError(f"version {manifest.get('version')!r} is not {_VERSION}")
        manifest["tensors"] = {name: (tuple(int(s) for s in t["shape"]), _parse_dtype(t["dtype"]))
                               for name, t in manifest["tensors"].items()}
        files = {str(k): int(v) for k, v in manifest["files"].items()}
        manifest["files"] = files
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"commit marker {marker} is damaged: {e}") from None
    for name, size in files.items():
        fpath = os.path.join(path, name)
        if not os.path.exists(fpath):
            raise FileNotFoundError(f"checkpoint at {path} is damaged: file {fpath} is missing")
        actual = os.path.getsize(fpath)
        if actual != size:
            raise ValueError(f"checkpoint at {path} is damaged: file {fpath} has {actual} bytes but {size} were "
                             f"written (truncated or overwritten)")
    return manifest


def _read_metadata(path: str):
    try:
        return FileSystemReader(path).read_metadata()
    except Exception as e:  # noqa: BLE001 - reported with the file's name
        raise _DamagedFile(f"checkpoint file {os.path.join(path, '.metadata')} is damaged: "
                           f"reading it failed with {_brief(e)}") from None


def _check_against(path: str, manifest: dict, pieces: List[FlatPiece]) -> None:
    saved = manifest["tensors"]
    for p in pieces:
        if p.name not in saved:
            names = list(saved)
            msg = f"checkpoint at {path} has no tensor {p.name!r} (it holds {len(names)} tensors"
            msg += (", e.g. " + ", ".join(repr(n) for n in names[:3])) if names else ""
            close = difflib.get_close_matches(p.name, names, n=1)
            raise ValueError(msg + (f"; did you mean {close[0]!r}?)" if close else ")"))
        shape, dtype = saved[p.name]
        if tuple(p.shape) != shape:
            raise ValueError(f"tensor {p.name!r} has shape {shape} in the checkpoint at {path} but the piece "
                             f"asks for shape {tuple(p.shape)}")
        if p.dtype != dtype:
            raise ValueError(f"tensor {p.name!r} has dtype {dtype} in the checkpoint at {path} but the piece "
                             f"asks for dtype {p.dtype}")


def _open(path: str, pieces: List[FlatPiece]):
    """Everything one rank can check before reading: committed, files intact, pieces fit."""
    manifest = _read_manifest(path)
    metadata = _read_metadata(path)
    _check_pieces(pieces)
    _check_against(path, manifest, pieces)
    return manifest, metadata


def _read(path: str, pieces: List[FlatPiece], metadata, ranks: _Ranks) -> Any:
    planner = _LoadPlanner(pieces, path)
    with _dcp_quietly():
        dcp.load({}, storage_reader=_Reader(path, metadata), planner=planner,
                 process_group=ranks.group, no_dist=not ranks.distributed)
    return planner.extra


# ---------------------------------------------------------------------------
# public API

def save(path: str, pieces: List[FlatPiece], extra: dict, group=None) -> None:
    """Collective over `group` (default: the world; none without torch.distributed): write a checkpoint.

    Each rank passes its own pieces; together they must cover every element
    of every named tensor exactly once (a rank may hold nothing of a tensor).
    `extra` (small: step, signature, plan YAML, RNG state) is taken from the
    group's rank 0.  Returns on every rank once the checkpoint is committed at
    `path` (an older one there is replaced only then); raises on every rank if
    anything failed, leaving `path` as it was.
    """
    path = os.path.abspath(os.fspath(path))
    ranks = _Ranks(group)

    def check():
        _check_pieces(pieces)
        summary = [(p.name, tuple(p.shape), str(p.dtype).removeprefix("torch."), p.start, p.local.numel()) for p in pieces]
        blob = None
        if ranks.rank == 0:
            check_replaceable(path)
            buf = io.BytesIO()
            try:
                torch.save(extra, buf)
            except Exception as e:  # noqa: BLE001 - a lambda, an open file, ...
                raise ValueError(f"extra cannot be saved: {_brief(e)}") from None
            blob = buf.getvalue()
        return summary, blob

    checked, error = ranks.capture(check)
    gathered = ranks.all_gather((error, None if checked is None else checked[0]))  # outcome + layout, one collective
    ranks.raise_any([e for e, _ in gathered])
    blob = checked[1]
    tensors, error = ranks.capture(lambda: _check_cover([summary for _, summary in gathered]))
    if error is not None:  # every rank computed the same verdict from the same data
        raise _KINDS[error[0]](error[1])

    def make_tmp():
        if ranks.rank == 0:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = sibling(path, "tmp")
            os.mkdir(tmp)
            return tmp

    tmp = ranks.all_gather(ranks.agreed(make_tmp))[0]

    def write():
        planner = _SavePlanner(pieces, blob)
        with _dcp_quietly():
            dcp.save({}, storage_writer=FileSystemWriter(tmp, single_file_per_rank=True, sync_files=True),
                     planner=planner, process_group=ranks.group, no_dist=not ranks.distributed)

    def commit():
        if ranks.rank == 0:
            manifest = {"format": _FORMAT, "version": _VERSION, "world_size": ranks.world,
                        "torch": torch.__version__,
                        "tensors": {name: {"shape": list(shape), "dtype": dtype}
                                    for name, (shape, dtype) in tensors.items()}}
            commit_dir(tmp, path, manifest)

    for step in (write, commit):
        try:
            ranks.agreed(step)  # after `write`: every rank's data is on disk (or the save failed everywhere)
        except Exception as e:
            if ranks.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise type(e)(f"saving the checkpoint to {path} failed, nothing was committed: {e}") from None


def load(path: str, pieces: List[FlatPiece], group=None) -> dict:
    """Collective over `group`: fill each piece.local in place from the checkpoint at `path`; returns extra.

    Each rank passes the ranges it wants, in any layout: other ranges and
    another world size than at save time.  Raises on every rank if any rank's
    request or the checkpoint is wrong.
    """
    path = os.path.abspath(os.fspath(path))
    ranks = _Ranks(group)
    _, metadata = ranks.agreed(lambda: _open(path, pieces))
    return ranks.agreed(lambda: _read(path, pieces, metadata, ranks))


def load_full(path: str) -> Tuple[Dict[str, torch.Tensor], dict]:
    """In one process, without a process group: every tensor whole, in its shape, and extra."""
    path = os.path.abspath(os.fspath(path))
    ranks = _Ranks(None, distributed=False)
    manifest, metadata = ranks.agreed(lambda: _open(path, []))
    full = {name: torch.empty(shape, dtype=dtype) for name, (shape, dtype) in manifest["tensors"].items()}
    pieces = [FlatPiece(name, t.shape, t.dtype, 0, t.view(-1)) for name, t in full.items()]
    return full, ranks.agreed(lambda: _read(path, pieces, metadata, ranks))


def describe(path: str) -> dict:
    """In one process: {"path", "world_size", "torch", "tensors": {name: {"shape", "dtype", "numel"}}, "extra"}."""
    path = os.path.abspath(os.fspath(path))
    ranks = _Ranks(None, distributed=False)
    manifest, metadata = ranks.agreed(lambda: _open(path, []))
    extra = ranks.agreed(lambda: _read(path, [], metadata, ranks))
    return {"path": path, "world_size": manifest["world_size"], "torch": manifest.get("torch"),
            "tensors": {name: {"shape": shape, "dtype": dtype, "numel": math.prod(shape)}
                        for name, (shape, dtype) in manifest["tensors"].items()},
            "extra": extra}
