"""Checkpoints of uneven 1-D ZeRO shards (hcomm.parallel.zero.checkpoint).

Saved from 3 ranks with uneven ranges (a rank holding nothing of some
tensors), loaded into 2 ranks with other ranges and into 4 ranks (one rank
empty, one holding two disjoint ranges): every element must come back bit for
bit (torch.equal; bf16 compared through float64, which is exact).  Every
error case must raise on every rank of the group, and none may hang (each
pool call has a timeout that kills the pool instead).

The case functions run in the worker processes of one 4-rank pool (gloo and
hcomm groups over ranks [0, k) for k = 1..4, see tests/helpers/mp.py).
"""
import math
import os
import shutil

import numpy as np
import pytest
import torch

from hcomm.parallel.zero import checkpoint as ck
from tests.helpers.mp import Pool

CALL_S = 60  # per pool call: an error case that hangs fails here instead of blocking the session

TENSORS = [  # name, shape, dtype
    ("model/tok_emb.weight", (6, 5), torch.float32),
    ("model/blocks.0.attn.wq.weight", (4, 4), torch.float32),
    ("model/blocks.0.norm.weight", (7,), torch.bfloat16),
    ("model/scale", (), torch.float32),
    ("model/empty", (0, 3), torch.float32),
    ("optim/blocks.0.attn.wq.weight/exp_avg", (4, 4), torch.float32),
    ("optim/blocks.0.attn.wq.weight/exp_avg_sq", (4, 4), torch.float64),
    ("optim/tok_emb.weight/count", (3, 2), torch.int64),
]

EXTRA = {
    "step": 12,
    "signature": "tiny/4f2a9c",
    "plan": "ranks:\n- {batch: 3, zero_fraction: 0.5}\n- {batch: 2, zero_fraction: 0.3}\n",
    "rng": torch.Generator().manual_seed(5).get_state(),
    "counters": {"tokens": 123456, "skipped": [1, 2]},
}


def full_tensors(scale: float = 1.0):
    out = {}
    for i, (name, shape, dtype) in enumerate(TENSORS):
        base = torch.arange(math.prod(shape), dtype=torch.float64) * 0.731 + i
        t = torch.sin(base) * 10 * scale if dtype.is_floating_point else (base * 7 * scale).long() + 3
        out[name] = t.to(dtype).reshape(shape)
    return out


def split(n, weights):
    """Contiguous (start, count) ranges of n elements in proportion to weights."""
    cum = [0]
    for w in weights:
        cum.append(cum[-1] + w)
    bounds = [round(n * c / cum[-1]) for c in cum]
    return [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(len(weights))]


def ranges(kind, name, n):
    """Per rank, the (start, count) ranges it holds of tensor `name` (n elements) in layout `kind`."""
    if kind == "save3":  # rank 0 holds nothing of wq, rank 2 nothing of exp_avg
        weights = {"model/blocks.0.attn.wq.weight": [0, 3, 2],
                   "optim/blocks.0.attn.wq.weight/exp_avg": [1, 3, 0]}.get(name, [5, 3, 2])
        return [[r] for r in split(n, weights)]
    if kind == "load2":  # other ranges, in the other order: rank 0 takes the tail, rank 1 the head
        head, tail = split(n, [3, 7])
        return [[tail], [head]]
    if kind == "load4":  # rank 2 holds nothing, rank 0 two disjoint ranges
        r = split(n, [1, 2, 0, 2, 2])
        return [[r[0], r[4]], [r[1]], [r[2]], [r[3]]]
    raise KeyError(kind)


def make_pieces(kind, rank, full=None):
    """This rank's pieces in layout `kind`: values from `full`, or a sentinel to be overwritten by load."""
    pieces = []
    for name, shape, dtype in TENSORS:
        n = math.prod(shape)
        for start, count in ranges(kind, name, n)[rank]:
            if full is not None:
                local = full[name].reshape(-1)[start:start + count].clone()
            else:
                local = torch.full((count,), -77, dtype=dtype)
            pieces.append(ck.FlatPiece(name, shape, dtype, start, local))
    return pieces


def _np(t):
    t = t.detach()
    return (t.to(torch.float64) if t.dtype == torch.bfloat16 else t).numpy()


# --------------------------------------------------------------------------- worker cases

def _group(ctx, k, backend):
    if backend == "gloo" and k == ctx.world:
        return None  # the default group
    gloo, hc = ctx.groups[k]
    return gloo if backend == "gloo" else hc


def case_save(ctx, path, kind, k, backend, scale=1.0, extra=EXTRA):
    if not ctx.in_group(k):
        return None
    pieces = make_pieces(kind, ctx.rank, full_tensors(scale))
    # only the group's rank 0 extra is saved
    ck.save(path, pieces, extra if ctx.rank == 0 else {"not": "saved"}, group=_group(ctx, k, backend))
    return "saved"


def case_load(ctx, path, kind, k, backend):
    if not ctx.in_group(k):
        return None
    pieces = make_pieces(kind, ctx.rank)
    extra = ck.load(path, pieces, group=_group(ctx, k, backend))
    return [(p.name, p.start, p.local) for p in pieces], extra


def _bad_load_pieces(rank, k, bad_rank, bad):
    pieces = make_pieces("load2" if k == 2 else "load4", rank)
    if rank != bad_rank:
        return pieces
    emb = pieces[0]  # model/tok_emb.weight, shape (6, 5)
    if bad == "name":
        pieces.append(ck.FlatPiece("model/x", (2,), torch.float32, 0, torch.zeros(2)))
    elif bad == "shape":
        pieces[0] = ck.FlatPiece(emb.name, (5, 6), emb.dtype, emb.start, emb.local)
    elif bad == "dtype":
        pieces[0] = ck.FlatPiece(emb.name, emb.shape, torch.float64, emb.start, emb.local.double())
    elif bad == "bounds":
        pieces[0] = ck.FlatPiece(emb.name, emb.shape, emb.dtype, 25, torch.zeros(8))
    elif bad == "overlap":
        pieces.append(ck.FlatPiece(emb.name, emb.shape, emb.dtype, emb.start + 1, torch.zeros(2)))
    return pieces


def _bad_save_pieces(rank, bad_rank, bad):
    pieces = make_pieces("save3", rank, full_tensors())
    if rank != bad_rank:
        return pieces
    emb = pieces[0]  # rank 1 holds [15, 24) of model/tok_emb.weight's 30 elements
    if bad == "gap":
        del pieces[0]
    elif bad == "cross_overlap":
        pieces[0] = ck.FlatPiece(emb.name, emb.shape, emb.dtype, emb.start - 1, torch.zeros(emb.local.numel() + 1))
    elif bad == "local_overlap":
        pieces.append(ck.FlatPiece(emb.name, emb.shape, emb.dtype, emb.start, torch.zeros(1)))
    elif bad == "shape":
        pieces[0] = ck.FlatPiece(emb.name, (5, 6), emb.dtype, emb.start, emb.local)
    elif bad == "not_contiguous":
        pieces[0] = ck.FlatPiece(emb.name, emb.shape, emb.dtype, emb.start, torch.zeros(2 * emb.local.numel())[::2])
    return pieces


class _NoSpace(ck.FileSystemWriter):
    def write_data(self, plan, planner):
        raise OSError(28, "No space left on device")


def case_error(ctx, op, path, k, bad_rank, bad, backend="gloo"):
    """Run one failing operation on every rank of the group; return (exception type, message) per rank."""
    if not ctx.in_group(k):
        return None
    group = _group(ctx, k, backend)
    writer = ck.FileSystemWriter
    try:
        if op == "load":
            ck.load(path, _bad_load_pieces(ctx.rank, k, bad_rank, bad), group=group)
        elif bad == "write_fails":
            if ctx.rank == bad_rank:
                ck.FileSystemWriter = _NoSpace
            ck.save(path, make_pieces("save3", ctx.rank, full_tensors(3.0)), {"step": 99}, group=group)
        else:
            ck.save(path, _bad_save_pieces(ctx.rank, bad_rank, bad), {"step": 99}, group=group)
    except Exception as e:  # noqa: BLE001 - the case reports what was raised
        return type(e).__name__, str(e)
    finally:
        ck.FileSystemWriter = writer
    return "no error", ""


# --------------------------------------------------------------------------- fixtures and checks

@pytest.fixture(scope="module")
def pool():
    p = Pool(4, setup="groups")
    yield p
    p.close()


@pytest.fixture(scope="module")
def saved(pool, tmp_path_factory):
    """One checkpoint saved from 3 ranks (layout save3) over gloo; tests copy it before damaging it."""
    path = str(tmp_path_factory.mktemp("saved") / "ckpt")
    assert pool.run(case_save, path, "save3", 3, "gloo", timeout_s=CALL_S) == ["saved"] * 3 + [None]
    return path


def _copy(saved, tmp_path, name="ckpt"):
    dst = str(tmp_path / name)
    shutil.copytree(saved, dst)
    return dst


def _check_loaded(results, k, full, extra=EXTRA):
    """Every rank's pieces hold exactly the original elements; together they cover every tensor."""
    covered = {name: 0 for name, _, _ in TENSORS}
    for rank in range(k):
        pieces, got_extra = results[rank]
        for name, start, local in pieces:
            want = _np(full[name].reshape(-1)[start:start + len(local)])
            assert local.dtype == want.dtype and np.array_equal(local, want), (rank, name, start)
            covered[name] += len(local)
        _check_extra(got_extra, extra)
    assert covered == {name: math.prod(shape) for name, shape, _ in TENSORS}
    assert all(r is None for r in results[k:])


def _check_extra(got, want):
    assert set(got) == set(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert np.array_equal(np.asarray(got[key]), value.numpy())
        else:
            assert got[key] == value


def _check_everyone_raised(results, k, kind, *fragments):
    assert all(r is None for r in results[k:])
    for rank, (got_kind, message) in enumerate(results[:k]):
        assert got_kind == kind, (rank, got_kind, message)
        for fragment in fragments:
            assert fragment in message, (rank, fragment, message)


# --------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("kind, k", [("load2", 2), ("load4", 4)])
def test_three_ranks_uneven_to_other_layouts(pool, saved, kind, k):
    results = pool.run(case_load, saved, kind, k, "gloo", timeout_s=CALL_S)
    _check_loaded(results, k, full_tensors())


def test_hcomm_backend_save_and_load(pool, tmp_path):
    path = str(tmp_path / "ckpt")
    assert pool.run(case_save, path, "save3", 3, "hcomm", timeout_s=CALL_S) == ["saved"] * 3 + [None]
    _check_loaded(pool.run(case_load, path, "load4", 4, "hcomm", timeout_s=CALL_S), 4, full_tensors())


def test_load_full_describe_and_files(saved):
    full, extra = ck.load_full(saved)
    want = full_tensors()
    assert list(full) == [name for name, _, _ in TENSORS]
    for name, t in full.items():
        assert t.dtype == want[name].dtype and t.shape == want[name].shape and torch.equal(t, want[name]), name
    _check_extra(extra, EXTRA)
    info = ck.describe(saved)
    assert info["world_size"] == 3
    assert info["tensors"] == {name: {"shape": shape, "dtype": dtype, "numel": math.prod(shape)}
                               for name, shape, dtype in TENSORS}
    _check_extra(info["extra"], EXTRA)
    # each of the 3 ranks wrote its own data file; the marker is there; nothing else
    assert sorted(os.listdir(saved)) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", ck.MARKER]


def test_single_process_without_process_group(tmp_path):
    # several disjoint pieces of one tensor on one rank, in any order; empty pieces allowed
    full = full_tensors(2.0)
    pieces = []
    for name, shape, dtype in TENSORS:
        flat, n = full[name].reshape(-1), math.prod(shape)
        for start, count in reversed(split(n, [2, 0, 1])):
            pieces.append(ck.FlatPiece(name, shape, dtype, start, flat[start:start + count].clone()))
    path = str(tmp_path / "one")
    ck.save(path, pieces, {"step": 3})
    got, extra = ck.load_full(path)
    assert extra == {"step": 3}
    assert all(torch.equal(got[name], full[name]) for name in full)
    part = ck.FlatPiece("model/tok_emb.weight", (6, 5), torch.float32, 7, torch.zeros(11))
    assert ck.load(path, [part]) == {"step": 3}
    assert torch.equal(part.local, full["model/tok_emb.weight"].reshape(-1)[7:18])


def test_overwrite_replaces_only_when_complete(pool, saved, tmp_path):
    path = _copy(saved, tmp_path)
    # a write failing on rank 1: every rank raises, the old checkpoint is untouched, no leftovers
    results = pool.run(case_error, "save", path, 3, 1, "write_fails", timeout_s=CALL_S)
    _check_everyone_raised(results, 3, "OSError", f"saving the checkpoint to {path} failed, nothing was committed",
                           "rank 1", "No space left on device")
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    full, extra = ck.load_full(path)
    assert all(torch.equal(full[name], t) for name, t in full_tensors().items()) and extra["step"] == 12
    # a complete save replaces it, and leaves no temporary or old directory behind
    assert pool.run(case_save, path, "save3", 3, "gloo", 3.0, {"step": 13}, timeout_s=CALL_S)[:3] == ["saved"] * 3
    full, extra = ck.load_full(path)
    assert all(torch.equal(full[name], t) for name, t in full_tensors(3.0).items()) and extra == {"step": 13}
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_refuses_to_replace_a_directory_that_is_not_a_checkpoint(pool, tmp_path):
    path = tmp_path / "ckpt"
    path.mkdir()
    (path / "notes.txt").write_text("keep me")
    results = pool.run(case_error, "save", str(path), 3, 0, "none", timeout_s=CALL_S)
    _check_everyone_raised(results, 3, "FileExistsError", f"{path} holds files that are not a checkpoint",
                           "'notes.txt'", "refusing to replace it")
    assert sorted(os.listdir(tmp_path)) == ["ckpt"] and (path / "notes.txt").read_text() == "keep me"


# --------------------------------------------------------------------------- errors, on every rank

@pytest.mark.parametrize("bad, fragments", [
    ("name", ["has no tensor 'model/x' (it holds 8 tensors, e.g. 'model/tok_emb.weight'", "(on rank 1)"]),
    ("shape", ["tensor 'model/tok_emb.weight' has shape (6, 5)", "asks for shape (5, 6)"]),
    ("dtype", ["has dtype torch.float32", "asks for dtype torch.float64"]),
    ("bounds", ["piece 'model/tok_emb.weight' covers elements [25, 33) but the tensor of shape (6, 5) has 30"]),
    ("overlap", ["pieces of 'model/tok_emb.weight' on one rank overlap: elements [0, 9) and [1, 3)"]),
])
def test_bad_load_requests_raise_on_every_rank(pool, saved, bad, fragments):
    results = pool.run(case_error, "load", saved, 2, 1, bad, timeout_s=CALL_S)
    _check_everyone_raised(results, 2, "ValueError", *fragments)


@pytest.mark.parametrize("backend", ["gloo", "hcomm"])
def test_errors_on_the_whole_world(pool, saved, backend):
    """The default group (gloo) and an hcomm group: one rank's bad request, a missing path."""
    results = pool.run(case_error, "load", saved, 4, 3, "name", backend, timeout_s=CALL_S)
    _check_everyone_raised(results, 4, "ValueError", "has no tensor 'model/x'", "(on rank 3)")
    results = pool.run(case_error, "load", "/nonexistent/ckpt", 4, 0, "none", backend, timeout_s=CALL_S)
    _check_everyone_raised(results, 4, "FileNotFoundError", "no checkpoint at /nonexistent/ckpt")


@pytest.mark.parametrize("bad, kind, fragments", [
    ("gap", "ValueError", ["elements [15, 24) of 'model/tok_emb.weight' (shape (6, 5)) are held by no rank"]),
    ("cross_overlap", "ValueError", ["ranks 0 and 1 both hold elements [14, 15) of 'model/tok_emb.weight'"]),
    ("local_overlap", "ValueError", ["pieces of 'model/tok_emb.weight' on one rank overlap", "(on rank 1)"]),
    ("shape", "ValueError", ["ranks 0 and 1 disagree about tensor 'model/tok_emb.weight': shape (6, 5) float32 "
                             "vs shape (5, 6) float32"]),
    ("not_contiguous", "ValueError", ["local must be a 1-D contiguous tensor"]),
])
def test_bad_save_layouts_raise_on_every_rank_and_write_nothing(pool, tmp_path, bad, kind, fragments):
    path = str(tmp_path / "ckpt")
    results = pool.run(case_error, "save", path, 3, 1, bad, timeout_s=CALL_S)
    _check_everyone_raised(results, 3, kind, *fragments)
    assert os.listdir(tmp_path) == []


def test_missing_and_uncommitted_checkpoints(pool, saved, tmp_path):
    missing = str(tmp_path / "nowhere")
    _check_everyone_raised(pool.run(case_error, "load", missing, 2, 0, "none", timeout_s=CALL_S), 2,
                           "FileNotFoundError", f"no checkpoint at {missing}")
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        ck.load_full(missing)
    path = _copy(saved, tmp_path)
    os.remove(os.path.join(path, ck.MARKER))
    _check_everyone_raised(pool.run(case_error, "load", path, 2, 0, "none", timeout_s=CALL_S), 2, "ValueError",
                           f"checkpoint at {path} was not completely written")
    with pytest.raises(ValueError, match="was not completely written"):
        ck.load_full(path)
    with pytest.raises(ValueError, match="was not completely written"):
        ck.describe(path)
    # a save interrupted between moving the old checkpoint aside and renaming the new one
    aside = os.path.join(str(tmp_path), ".moved.old-1234")
    shutil.copytree(saved, aside)
    with pytest.raises(FileNotFoundError, match=f"left the previous checkpoint at {aside}"):
        ck.load_full(str(tmp_path / "moved"))


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _scribble(path):  # same size, header destroyed: only reading it can tell
    with open(path, "r+b") as f:
        f.write(b"\0" * 64)


@pytest.mark.parametrize("file, damage, kind, fragment", [
    ("__1_0.distcp", _truncate, "ValueError", "bytes but {size} were written (truncated or overwritten)"),
    ("__2_0.distcp", os.remove, "FileNotFoundError", "is missing"),
    ("__0_0.distcp", _scribble, "ValueError", "is damaged: reading it failed with"),
    (".metadata", _scribble, "ValueError", "is damaged: reading it failed with"),
])
def test_damaged_files_are_named_on_every_rank(pool, saved, tmp_path, file, damage, kind, fragment):
    path = _copy(saved, tmp_path)
    target = os.path.join(path, file)
    size = os.path.getsize(target)
    damage(target)
    results = pool.run(case_error, "load", path, 2, 0, "none", timeout_s=CALL_S)
    _check_everyone_raised(results, 2, kind, target, fragment.format(size=size))
    with pytest.raises(ValueError if kind == "ValueError" else FileNotFoundError, match=file):
        ck.load_full(path)
