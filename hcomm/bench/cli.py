"""``hcomm bench OP ...``: argument checking, launching the ranks, rank 0's output.

Every mistake in the arguments is found here, before any process starts,
and reported as ``hcomm bench: <what>`` with exit status 2, naming the
argument and value.  Exit status 1 means the run finished but some data
check failed (#wrong > 0), as nccl-tests does.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import List, Optional

from hcomm.bench import backends as bk
from hcomm.bench import definitions
from hcomm.bench.base import DTYPES, REDOPS, canonical_dtype
from hcomm.bench.runner import BenchConfig

PROG = "hcomm bench"
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}  # nccl-tests: K/M/G are powers of 1024


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and sys.exit(2) itself
        raise UsageError(message)


def parse_size(text: str, flag: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise UsageError(f"{flag}: cannot parse {text!r} as a size (use e.g. 8, 64K, 128M, 1G)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def sweep_sizes(lo: int, hi: int, factor: int) -> List[int]:
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= factor
    return sizes


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="nccl-tests style bandwidth benchmark of one operation. "
                "Ops: " + ", ".join(definitions.op_names()))
    p.add_argument("op", help="operation to benchmark")
    p.add_argument("-b", "--min-bytes", default="8", help="smallest size (default 8)")
    p.add_argument("-e", "--max-bytes", default="128M", help="largest size (default 128M)")
    p.add_argument("-f", "--step-factor", type=int, default=2, help="size multiplier per step (default 2)")
    p.add_argument("-d", "--dtype", default="float", help="element type: " + ", ".join(DTYPES))
    p.add_argument("-o", "--op", dest="redop", default="sum", help="reduction: " + ", ".join(REDOPS))
    p.add_argument("-r", "--root", type=int, default=0, help="root rank of broadcast/reduce")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed calls per size (default 20)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed calls per size (default 5)")
    p.add_argument("--backends", default=None,
                   help="comma-separated, baseline first (default: gloo[,hcomm]; nccl[,hcomm] on CUDA)")
    p.add_argument("--algo", default=None, help="force hcomm's algorithm (sets HCOMM_ALGO) and verify it ran")
    p.add_argument("--nprocs", type=int, default=2, help="local ranks to spawn when not under torchrun")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--json", dest="json_path", help="write all records as JSON (schema hcomm-bench/1)")
    p.add_argument("--plot", dest="plot_path", help="write busbw vs size as a PNG")
    p.add_argument("--markdown", dest="markdown_path", help="write a dated results file (benchmarks/results)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _check_output_path(path: Optional[str], flag: str) -> None:
    if path:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise UsageError(f"{flag}: directory {parent!r} does not exist")


def config_from_args(argv: List[str]) -> tuple:
    """(BenchConfig, nprocs) from the command line; raises UsageError."""
    a = build_parser().parse_args(argv)
    if a.op not in definitions.OPS:
        raise UsageError(f"unknown op {a.op!r} (choose from: {', '.join(definitions.op_names())})")
    op = definitions.get(a.op)
    lo, hi = parse_size(a.min_bytes, "--min-bytes"), parse_size(a.max_bytes, "--max-bytes")
    if lo < 1:
        raise UsageError(f"--min-bytes ({lo}) must be at least 1")
    if hi < lo:
        raise UsageError(f"--max-bytes ({hi}) is smaller than --min-bytes ({lo})")
    if a.step_factor < 2:
        raise UsageError(f"--step-factor ({a.step_factor}) must be at least 2")
    if a.iters < 1:
        raise UsageError(f"--iters ({a.iters}) must be at least 1")
    if a.warmup < 0:
        raise UsageError(f"--warmup ({a.warmup}) must not be negative")
    dtype = canonical_dtype(a.dtype)
    if dtype is None:
        raise UsageError(f"unknown dtype {a.dtype!r} (choose from: {', '.join(DTYPES)})")
    if a.redop not in REDOPS:
        raise UsageError(f"unknown --op {a.redop!r} (choose from: {', '.join(REDOPS)})")

    import torch

    device = a.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")

    from hcomm.bench.spawn import under_launcher

    nranks = int(os.environ["WORLD_SIZE"]) if under_launcher() else a.nprocs
    if not under_launcher() and a.nprocs < 1:
        raise UsageError(f"--nprocs ({a.nprocs}) must be at least 1")
    problem = definitions.combination_problem(op, dtype, a.redop, nranks, a.root)
    if problem:
        raise UsageError(problem)

    names = [b.strip() for b in a.backends.split(",")] if a.backends else bk.default_backends(device)
    if not names or any(not b for b in names):
        raise UsageError(f"--backends {a.backends!r}: give comma-separated backend names")
    if len(set(names)) != len(names):
        raise UsageError(f"--backends {a.backends!r} names a backend twice")
    have = bk.available(device)
    for b in names:
        if b not in have:
            raise UsageError(f"backend {b!r} is not available here (available: {', '.join(have)})")
    if op.hcomm_api and "hcomm" in names and bk.missing_hcomm_api(op.hcomm_api):
        raise UsageError(f"{op.name} on backend hcomm needs hcomm.{op.hcomm_api}, which this build lacks")
    if a.algo:
        from hcomm import algorithms

        choices = [n for n, _ in algorithms()]
        if a.algo not in choices:  # only unknown names: a known one some ops lack falls back, as documented
            raise UsageError(f"--algo {a.algo!r} is not an algorithm (choose from: {', '.join(choices)})")
    if not a.algo and "hcomm" in names:
        from hcomm._backend import forced_algorithm

        try:  # a bad HCOMM_ALGO would otherwise fail in every rank after the launch
            forced_algorithm()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if a.algo and "hcomm" not in names:
        raise UsageError(f"--algo {a.algo} applies to backend hcomm, which is not in --backends")
    if a.plot_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib (pip install matplotlib)") from None
    for path, flag in ((a.json_path, "--json"), (a.plot_path, "--plot"), (a.markdown_path, "--markdown")):
        _check_output_path(path, flag)

    cfg = BenchConfig(op=a.op, sizes=sweep_sizes(lo, hi, a.step_factor), dtype=dtype, redop=a.redop,
                      root=a.root, iters=a.iters, warmup=a.warmup, backends=names, algo=a.algo,
                      device=device, progress=not a.no_progress, json_path=a.json_path,
                      plot_path=a.plot_path, markdown_path=a.markdown_path, argv=["bench", *argv])
    return cfg, a.nprocs


def _printer(cfg: BenchConfig):
    try:
        from tqdm import tqdm

        def out(line):  # keeps rows and the progress bar from overwriting each other
            tqdm.write(line, file=sys.stdout)
    except ImportError:
        def out(line):
            print(line, flush=True)
    return out


def _rank_main(rank: int, nranks: int, device, cfg: BenchConfig) -> int:
    import torch
    import torch.distributed as dist

    from hcomm.bench import results, table
    from hcomm.bench.runner import run_sweep

    out = _printer(cfg)

    def on_start(ranks):
        out(f"# hcomm bench {cfg.op}: {nranks} ranks, backends {','.join(cfg.backends)}, dtype {cfg.dtype}, "
            f"iters {cfg.iters}, warmup {cfg.warmup}, device {cfg.device}"
            + (f", HCOMM_ALGO={cfg.algo}" if cfg.algo else ""))
        for r in ranks:
            out(f"#  Rank {r['rank']:3d} host {r['host']} island {r['island'] or '-'} device {r['device']}")
        for line in table.header(cfg.backends[0]):
            out(line)

    def emit(record):
        for line in table.lines_for(record):
            out(line)

    result = run_sweep(cfg, rank, nranks, device, emit, on_start)
    rc = 0
    if rank == 0:
        for line in table.summary(result.records, cfg.backends):
            out(line)
        for w in result.warnings:
            print(f"{PROG}: warning: {w}", file=sys.stderr)
        try:
            results.write_all(cfg, result)
        except OSError as exc:
            print(f"{PROG}: cannot write results: {exc}", file=sys.stderr)
            rc = 1
        if any(r["wrong"] for r in result.records):
            rc = 1
    # every rank returns the same status (torchrun reports the worst one)
    status = torch.tensor([rc], dtype=torch.int64)
    dist.all_reduce(status, op=dist.ReduceOp.MAX)
    return int(status.item())


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg, nprocs = config_from_args(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    if cfg.algo:
        # read by the hcomm backend per op; set before any rank creates a group
        os.environ["HCOMM_ALGO"] = cfg.algo
    from hcomm.bench import spawn

    return spawn.run(_rank_main, nprocs, cfg.device, cfg)


if __name__ == "__main__":
    sys.exit(main())
