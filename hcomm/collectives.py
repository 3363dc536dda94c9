"""The direct collective API: ``hcomm.all_reduce(...)``, ``hcomm.all_gather_v(...)``.

Collectives torch also has go through ``torch.distributed`` on an hcomm
group, so profilers, DDP hooks and ``async_op`` behave as users expect.  The
uneven ``_v`` collectives have no torch equivalent for ``all_gather`` and
``reduce_scatter``; they call the hcomm backend directly.  Every function
takes ``group=None`` (the default group) and ``async_op=False``; with
``async_op=True`` it returns a work handle with ``wait()``.

Failures surface as :class:`hcomm.HCommError`; arguments that cannot be right
raise :class:`hcomm.HCommValueError` (a ``ValueError``) before anything is sent.
"""
from __future__ import annotations

import functools
import operator
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from hcomm.errors import HCommError, HCommValueError

ReduceOp = dist.ReduceOp

# torch 2.13 renamed the tensor forms (the old names warn); 2.11 has only the old ones.
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _backend(group=None, device: Optional[torch.device] = None):
    """The ProcessGroupHComm behind `group` (raises if the group is not hcomm)."""
    from hcomm import _C

    if device is not None and device.type == "meta":  # torch would say "no backend for meta"
        raise HCommValueError("hcomm: meta tensors have no data to communicate; "
                              "materialise them on the CPU or a GPU first (e.g. with to_empty)")
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(device or torch.device("cpu"))
    if not isinstance(backend, _C.ProcessGroupHComm):
        raise HCommValueError(
            f"group uses backend {type(backend).__name__}, not hcomm; create it with backend='hcomm'")
    return backend


def uses_hcomm(group=None) -> bool:
    """Whether ``group`` (default: the default group) runs its CPU tensors on the hcomm backend."""
    from hcomm import _C

    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        return isinstance(pg._get_backend(torch.device("cpu")), _C.ProcessGroupHComm)
    except RuntimeError:   # no backend for the CPU on this group
        return False


def _translated(fn):
    """Re-raise torch's errors from hcomm groups as HCommError / HCommValueError."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except HCommError:
            raise
        except ValueError as exc:
            raise HCommValueError(str(exc)) from exc
        except dist.DistBackendError as exc:
            raise HCommError(str(exc)) from exc

    return wrapper


class _Work:
    """A work handle whose wait() raises HCommError rather than torch's error."""

    def __init__(self, work):
        self._work = work

    @_translated
    def wait(self, timeout=None):
        return self._work.wait() if timeout is None else self._work.wait(timeout)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def get_future(self):
        return self._work.get_future()


def _finish(work, async_op: bool):
    if async_op:
        return _Work(work)
    _Work(work).wait()
    return None


def _device(*tensors) -> torch.device:
    """The device `tensors` run on: the first one's, or meta if any is a meta tensor (which _backend refuses)."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_meta:
            return t.device
    return tensors[0].device


def _counts(sizes: Sequence[int], name: str, op: str, tensor: torch.Tensor, what: str, backend,
            rows: bool = False) -> List[int]:
    """`sizes` as ints, checked against `tensor` (the `what`, "input" or "output") before anything is sent.

    The C++ core makes the same checks, with the same messages, and must:
    torch's own entry points reach it without this wrapper.  Checking here
    too covers what the binding cannot take: Python ints do not wrap, and one
    past int64 would otherwise surface as the binding's TypeError.  With
    ``rows`` the sizes count rows of dim 0 (all_to_all_v), not elements.
    """
    if rows and (sizes is None or len(sizes) == 0):
        return []  # as torch's all_to_all_single: an even split
    why = _counts_problem(sizes, name, tensor, what, backend.size(), rows)
    if isinstance(why, str):
        message = f"hcomm: {op} on rank {backend.rank()}: {why}"
        # The core never sees this call; under HCOMM_DEBUG it still tells the
        # other ranks, so they raise now instead of waiting out the timeout.
        backend.reject(op, message)
        raise HCommValueError(message)
    return why


def _counts_problem(sizes, name: str, tensor: torch.Tensor, what: str, world: int, rows: bool):
    """The checked counts, or a string saying what is wrong with them."""
    try:
        counts = [operator.index(s) for s in sizes]
    except TypeError:
        return f"{name} must be a sequence of integers, got {sizes!r}"
    unit = "rows" if rows and tensor.dim() > 1 else "elements"
    total = tensor.size(0) if unit == "rows" else tensor.numel()
    if len(counts) != world:
        return f"{name} has {len(counts)} entries but the group has {world} ranks"
    for i, c in enumerate(counts):
        if c < 0:
            return f"{name} has a negative entry {c} at index {i}"
    for i, c in enumerate(counts):
        if c > total:
            return f"{name}[{i}] = {c} exceeds the {what}'s {total} {unit}"
    if sum(counts) != total:
        return f"{name} sums to {sum(counts)} {unit} but the {what} has {total}"
    return counts


@_translated
def all_reduce(tensor: torch.Tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce ``tensor`` across the group in place (sum, avg, product, min, max, band, bor, bxor)."""
    _backend(group, _device(tensor))
    return _finish(dist.all_reduce(tensor, op=op, group=group, async_op=True), async_op)


@_translated
def broadcast(tensor: torch.Tensor, src: int = 0, group=None, async_op: bool = False):
    """Copy ``tensor`` from group rank ``src`` to every rank (``src`` is a rank within ``group``)."""
    _backend(group, _device(tensor))
    return _finish(dist.broadcast(tensor, group_src=src, group=group, async_op=True), async_op)


@_translated
def reduce(tensor: torch.Tensor, dst: int = 0, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce into ``tensor`` on group rank ``dst``; other ranks' tensors are left unchanged."""
    _backend(group, _device(tensor))
    return _finish(dist.reduce(tensor, group_dst=dst, op=op, group=group, async_op=True), async_op)


@_translated
def all_gather(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    """Concatenate every rank's ``input`` into ``output`` (world_size x input elements)."""
    _backend(group, _device(input, output))
    return _finish(_all_gather_tensor(output, input, group=group, async_op=True), async_op)


@_translated
def reduce_scatter(output: torch.Tensor, input: torch.Tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce ``input`` (world_size x output elements) and keep this rank's block in ``output``."""
    _backend(group, _device(input, output))
    return _finish(_reduce_scatter_tensor(output, input, op=op, group=group, async_op=True), async_op)


@_translated
def all_to_all(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    """Exchange equal blocks of dim 0: block r of ``input`` goes to rank r."""
    _backend(group, _device(input, output))
    return _finish(dist.all_to_all_single(output, input, group=group, async_op=True), async_op)


@_translated
def all_to_all_v(output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int],
                 input_split_sizes: Sequence[int], group=None, async_op: bool = False):
    """Uneven all-to-all along dim 0, argument order as torch's ``all_to_all_single``.

    ``input_split_sizes[r]`` rows go to rank r; ``output_split_sizes[r]`` rows come from rank r.
    """
    backend = _backend(group, _device(input, output))
    # Send splits first, as the core checks them.
    in_splits = _counts(input_split_sizes, "input_split_sizes", "all_to_all_v", input, "input", backend, rows=True)
    out_splits = _counts(output_split_sizes, "output_split_sizes", "all_to_all_v", output, "output", backend, rows=True)
    work = dist.all_to_all_single(output, input, out_splits, in_splits, group=group, async_op=True)
    return _finish(work, async_op)


@_translated
def all_gather_v(output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int],
                 group=None, async_op: bool = False):
    """Uneven all-gather of 1-D data: rank r contributes ``output_split_sizes[r]`` elements.

    ``output`` holds ``sum(output_split_sizes)`` elements, rank 0's first.
    This is the primitive non-uniform tensor parallelism and heterogeneous
    ZeRO gather their unequal shards with.
    """
    backend = _backend(group, _device(input, output))
    counts = _counts(output_split_sizes, "output_split_sizes", "all_gather_v", output, "output", backend)
    return _finish(backend.all_gather_v(output, input, counts), async_op)


@_translated
def reduce_scatter_v(output: torch.Tensor, input: torch.Tensor, input_split_sizes: Sequence[int],
                     op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Uneven reduce-scatter of 1-D data: rank r receives the reduction of block r,
    ``input_split_sizes[r]`` elements long, into ``output``."""
    backend = _backend(group, _device(input, output))
    counts = _counts(input_split_sizes, "input_split_sizes", "reduce_scatter_v", input, "input", backend)
    work = backend.reduce_scatter_v(output, input, counts, op)
    return _finish(work, async_op)


@_translated
def gather(input: torch.Tensor, gather_list: Optional[List[torch.Tensor]] = None, dst: int = 0, group=None,
           async_op: bool = False):
    """Collect every rank's ``input`` into ``gather_list`` on group rank ``dst``."""
    _backend(group, _device(input, *(gather_list or [])))
    return _finish(dist.gather(input, gather_list, group_dst=dst, group=group, async_op=True), async_op)


@_translated
def scatter(output: torch.Tensor, scatter_list: Optional[List[torch.Tensor]] = None, src: int = 0, group=None,
            async_op: bool = False):
    """Send ``scatter_list[r]`` from group rank ``src`` to rank r's ``output``."""
    _backend(group, _device(output, *(scatter_list or [])))
    return _finish(dist.scatter(output, scatter_list, group_src=src, group=group, async_op=True), async_op)


@_translated
def send(tensor: torch.Tensor, dst: int, group=None, tag: int = 0, async_op: bool = False):
    """Send ``tensor`` to group rank ``dst``."""
    _backend(group, _device(tensor))
    return _finish(dist.isend(tensor, group_dst=dst, group=group, tag=tag), async_op)


@_translated
def recv(tensor: torch.Tensor, src: Optional[int] = None, group=None, tag: int = 0, async_op: bool = False):
    """Receive into ``tensor`` from group rank ``src`` (any rank when None)."""
    _backend(group, _device(tensor))
    return _finish(dist.irecv(tensor, group_src=src, group=group, tag=tag), async_op)


@_translated
def barrier(group=None, async_op: bool = False):
    """Wait until every rank of the group has reached the barrier."""
    return _finish(_backend(group).barrier(dist.BarrierOptions()), async_op)


# ----------------------------------------------------------------- introspection

def history(group=None) -> List[dict]:
    """Records of this rank's recent ops on ``group``, oldest first.

    Each record: op, dtype, count, bytes, algorithm, chunk_bytes, seconds
    (issue to completion on the worker), predicted_seconds (the cost model's
    estimate for the algorithm it chose), tiers (bytes sent per tier), ok
    (False when the op failed) and error (its message, None when ok).  Under
    HCOMM_DEBUG a call this rank rejected as invalid is recorded too, with
    algorithm "rejected".
    """
    return list(_backend(group).history())


def last_op(group=None) -> Optional[dict]:
    """The most recent record of :func:`history`, or None."""
    records = _backend(group).history()
    return dict(records[-1]) if records else None


def clear_history(group=None) -> None:
    _backend(group).clear_history()


def set_algorithm(name: str, group=None) -> None:
    """Force algorithm ``name`` on ``group`` ("" returns to the cost model), like HCOMM_ALGO."""
    _backend(group).set_algorithm(name)


def set_compression(spec, group=None) -> None:
    """Compress the inter-island tier of ``group``'s hierarchical all-reduce.

    ``spec`` is what ``HCOMM_COMPRESS`` takes (``"none"``, ``"bf16"``,
    ``"fp16"``, ``"fp8e4m3"``, ``"fp8e5m2"``, with ``":ef"`` for error
    feedback) or a :class:`hcomm.compress.CompressConfig`.  Results are exact
    only with ``"none"``; see docs/kernels.md for the measured error.

    On a group of one island (``torchrun --standalone``) there is no weak tier
    and the call is accepted with nothing to act on, so one script runs
    unchanged on one host and on many (README's snippet does this).
    """
    from hcomm.compress import resolve

    try:
        cfg = resolve(spec)
    except ValueError as exc:  # parse's plain ValueError: the direct API raises HCommValueError
        raise HCommValueError(str(exc)) from exc
    backend = _backend(group)
    if cfg.enabled:
        backend.set_compression(_dtype_code(cfg.wire), cfg.chunk, cfg.error_feedback)
    else:
        backend.set_compression(-1)


def set_timeout(timeout, group=None) -> None:
    """Change ``group``'s timeout (a ``timedelta``) for the ops issued from now on.

    torch's ``_set_pg_timeout`` only reaches gloo and NCCL groups; this is its
    hcomm counterpart (torchtitan shortens the timeout after the first step).
    """
    _backend(group)._set_default_timeout(timeout)


def algorithms() -> List[tuple]:
    """The algorithm table: (name, description), in preference order."""
    from hcomm import _C

    return list(_C.algorithms())


def _dtype_code(dtype: torch.dtype) -> int:
    from hcomm import _C

    name = str(dtype).replace("torch.", "")
    if name not in _C.DTYPES:
        raise HCommValueError(f"dtype {dtype} is not supported by hcomm")
    return _C.DTYPES[name]


def _op_code(op) -> int:
    from hcomm import _C

    name = {"SUM": "sum", "AVG": "avg", "PRODUCT": "product", "MIN": "min", "MAX": "max",
            "BAND": "band", "BOR": "bor", "BXOR": "bxor"}.get(str(op).split(".")[-1].upper(), str(op))
    if name not in _C.REDUCE_OPS:
        raise HCommValueError(f"reduce op {op} is not supported by hcomm")
    return _C.REDUCE_OPS[name]


def _plan_count(fn: str, nbytes: int, dtype: torch.dtype, backend) -> int:
    """`nbytes` per rank as elements of `dtype`, refused where no tensor could hold it.

    The cost model takes any int64: a negative size came back as a huge
    predicted time rather than an error, and the core multiplies the count by
    the group size for the gather-like ops, which must not wrap.
    """
    try:
        nbytes = operator.index(nbytes)
    except TypeError:
        raise HCommValueError(f"hcomm.{fn}: nbytes must be an integer byte count, got {nbytes!r}") from None
    if nbytes < 0:
        raise HCommValueError(f"hcomm.{fn}: nbytes is {nbytes}; a byte count cannot be negative")
    count = nbytes // torch.tensor([], dtype=dtype).element_size()
    if count * backend.size() > 2**63 - 1:
        raise HCommValueError(f"hcomm.{fn}: nbytes = {nbytes} is too large: {backend.size()} ranks x {count} "
                              f"elements overflow int64")
    return count


def plan(op: str, nbytes: int, dtype: torch.dtype = torch.float32, reduce_op=ReduceOp.SUM, group=None) -> dict:
    """Which algorithm hcomm would run for ``op`` with ``nbytes`` per rank, and its predicted seconds."""
    backend = _backend(group)
    count = _plan_count("plan", nbytes, dtype, backend)
    name, seconds, note = backend.plan(op, _dtype_code(dtype), count, _op_code(reduce_op))
    return {"algorithm": name, "predicted_seconds": seconds, "note": note}


def predict(op: str, nbytes: int, algorithm: str, dtype: torch.dtype = torch.float32, reduce_op=ReduceOp.SUM,
            group=None) -> float:
    """The cost model's predicted seconds for ``algorithm`` (NaN if it cannot run the op)."""
    backend = _backend(group)
    count = _plan_count("predict", nbytes, dtype, backend)
    return backend.predict(op, _dtype_code(dtype), count, _op_code(reduce_op), algorithm)
