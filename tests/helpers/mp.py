"""A pool of worker processes that run many test cases over one rendezvous.

Starting a process and importing torch costs seconds on a 2-core box, so a
module (or the whole session) starts W workers once and then sends them
cases: ``pool.run(fn, *args)`` calls ``fn(ctx, *args)`` on every rank and
returns the per-rank results.  `fn` must be a module-level function (it is
sent by module and name and imported in the worker).  An exception on any
rank fails the call with every rank's traceback; a call that does not
finish within its timeout kills the pool (so a hang fails one test, not the
whole session) and later calls fail at once.

Setups (what a worker does before serving cases):
- "groups": default gloo group over a FileStore, an hcomm group of all
  ranks, and gloo/hcomm subgroups of ranks [0, k) for every k < W, so one
  pool covers world sizes 1..W (``ctx.groups[k] == (gloo, hcomm)``).
- "bare": nothing; each case initialises (and destroys) its own groups.
"""
from __future__ import annotations

import datetime
import importlib
import multiprocessing
import os
import sys
import tempfile
import traceback
from typing import Any, Dict, List, Optional


class Ctx:
    """What a case function gets on its rank."""

    def __init__(self, rank: int, world: int, tmp: str):
        self.rank = rank
        self.world = world
        self.tmp = tmp
        self.gloo = None  # the default group (gloo) in the "groups" setup
        self.hcomm = None  # an hcomm group over every rank
        self.groups: Dict[int, tuple] = {}  # k -> (gloo group, hcomm group) over ranks [0, k); None off-group
        self.state: Dict[str, Any] = {}  # cases may cache groups they create here

    def in_group(self, k: int) -> bool:
        return self.rank < k


def _plain(obj):
    """Make results picklable without torch's shared-memory reductions."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return obj
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        if t.dtype in (torch.bfloat16, torch.float16) or "float8" in str(t.dtype):
            t = t.to(torch.float64)
        return t.numpy().copy()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _setup_groups(ctx: Ctx, timeout_s: float) -> None:
    import torch.distributed as dist

    import hcomm  # noqa: F401  (registers the backend)

    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", init_method=f"file://{ctx.tmp}/store", rank=ctx.rank, world_size=ctx.world,
                            timeout=timeout)
    ctx.gloo = dist.group.WORLD
    ctx.hcomm = dist.new_group(backend="hcomm", timeout=timeout)
    ctx.groups[ctx.world] = (ctx.gloo, ctx.hcomm)
    for k in range(1, ctx.world):
        g = dist.new_group(ranks=list(range(k)), backend="gloo", timeout=timeout)
        h = dist.new_group(ranks=list(range(k)), backend="hcomm", timeout=timeout)
        ctx.groups[k] = (g, h) if ctx.rank < k else (None, None)


def _worker(rank: int, world: int, tmp: str, setup: str, conn, env: Dict[str, str], timeout_s: float) -> None:
    os.environ.update(env)
    ctx = Ctx(rank, world, tmp)
    try:
        if setup == "groups":
            _setup_groups(ctx, timeout_s)
        conn.send(("ready", None))
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        os._exit(1)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        module, name, args = msg
        try:
            fn = getattr(importlib.import_module(module), name)
            conn.send(("ok", _plain(fn(ctx, *args))))
        except BaseException:
            conn.send(("err", traceback.format_exc()))
    conn.close()
    # Skip interpreter teardown: process groups with peers already gone can block in destructors.
    os._exit(0)


class PoolError(AssertionError):
    pass


class Pool:
    def __init__(self, world: int, setup: str = "groups", env: Optional[Dict[str, str]] = None,
                 timeout_s: float = 120.0, group_timeout_s: float = 60.0, tmp: Optional[str] = None):
        self.world = world
        self.timeout_s = timeout_s
        self.broken: Optional[str] = None
        self._tmpdir = None if tmp else tempfile.TemporaryDirectory(prefix="hcomm-mp-")
        self.tmp = tmp or self._tmpdir.name
        mpc = multiprocessing.get_context("spawn")
        self._conns, self._procs = [], []
        for rank in range(world):
            parent, child = mpc.Pipe()
            p = mpc.Process(target=_worker, args=(rank, world, self.tmp, setup, child, dict(env or {}),
                                                  group_timeout_s), daemon=True)
            p.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(p)
        self._collect("setup", timeout_s)

    def _collect(self, what: str, timeout_s: float, expect_dead=()) -> List[Any]:
        import time

        deadline = time.monotonic() + timeout_s
        results: List[Any] = [None] * self.world
        errors = []
        for rank, conn in enumerate(self._conns):
            left = max(0.0, deadline - time.monotonic())
            try:
                ready = conn.poll(left)
                status, value = conn.recv() if ready else ("timeout", None)
            except (EOFError, OSError):
                status, value = "dead", f"worker exited with code {self._procs[rank].exitcode}"
            if status == "timeout":
                self.kill()
                self.broken = f"{what} timed out after {timeout_s:.0f} s on rank {rank}"
                raise PoolError(self.broken)
            if status == "dead" and rank in expect_dead:
                value = None
            elif status in ("err", "dead"):
                errors.append(f"--- rank {rank} ---\n{value}")
            results[rank] = value
        if errors:
            if any("worker exited" in e for e in errors):
                self.broken = f"a worker died during {what}"
            raise PoolError(f"{what} failed:\n" + "\n".join(errors))
        return results

    def run(self, fn, *args, timeout_s: Optional[float] = None, expect_dead=()) -> List[Any]:
        """Run module-level `fn(ctx, *args)` on every rank; returns the results by rank.

        Ranks in `expect_dead` may exit instead of answering (fault tests); their result is None.
        """
        if self.broken:
            raise PoolError(f"pool unusable: {self.broken}")
        msg = (fn.__module__, fn.__name__, args)
        for conn in self._conns:
            conn.send(msg)
        results = self._collect(fn.__name__, timeout_s or self.timeout_s, expect_dead)
        if expect_dead:
            self.broken = f"ranks {sorted(expect_dead)} exited in {fn.__name__}"
        return results

    def kill(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(5)

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for p in self._procs:
            p.join(10)
        self.kill()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


if _repo_root() not in sys.path:  # workers import cases as tests.torch.<module>
    sys.path.insert(0, _repo_root())
