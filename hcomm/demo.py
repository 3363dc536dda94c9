"""``hcomm demo``: the main job until the end-to-end training job exists.

With no arguments it brings up the default emulated cluster (two islands of
two ranks, the link between them ~10x slower than inside them) and runs
``hcomm bench all_reduce`` there, hcomm against torch's gloo side by side,
every result checked.  Where the emulator cannot run (not root, no ``ip``/
``tc``/cgroups) it says why and runs the same benchmark on local ranks.
``--local`` asks for the local run; under ``torchrun`` or
``hcomm emulate run`` the benchmark uses the launcher's ranks.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional


def _parse(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hcomm demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--nprocs", type=int, default=4, help="local ranks to spawn when not on the emulator")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--max-bytes", default="16M", help="largest size, as hcomm bench takes it (e.g. 64K, 16M)")
    p.add_argument("--local", action="store_true", help="local ranks, no emulated cluster")
    p.add_argument("--cluster", default=None, help="emulator preset or spec (default: the default preset)")
    args = p.parse_args(argv)
    from hcomm.bench.cli import UsageError, parse_size

    try:  # the one size parser, so demo takes what bench takes
        args.max_bytes = parse_size(args.max_bytes, "--max-bytes")
    except UsageError as exc:
        p.error(str(exc))
    if args.nprocs < 1 or args.iters < 1 or args.warmup < 0:
        p.error("--nprocs and --iters must be >= 1, --warmup >= 0")
    return args


def _bench_args(args: argparse.Namespace) -> List[str]:
    return ["all_reduce", "--backends", "gloo,hcomm", "--min-bytes", "4K", "--max-bytes", str(args.max_bytes),
            "--step-factor", "4", "--iters", str(args.iters), "--warmup", str(args.warmup), "--no-progress"]


def _emulated(args: argparse.Namespace) -> Optional[int]:
    """Runs the benchmark on the emulated cluster; None when it cannot."""
    from hcomm.emulate import DEFAULT_PRESET, load_spec, run
    from hcomm.emulate.preflight import message, missing

    lacking = missing()
    if lacking:
        print(f"hcomm demo: the emulator cannot run here ({message(lacking)}); comparing on local ranks instead",
              file=sys.stderr)
        return None
    spec = load_spec(args.cluster or DEFAULT_PRESET)
    print(f"hcomm demo: all_reduce, hcomm vs gloo, on emulated cluster '{spec.name}' "
          f"({spec.world_size} ranks in {len(spec.islands)} islands)", flush=True)
    return run(spec, [sys.executable, "-m", "hcomm", "bench"] + _bench_args(args))


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(list(argv or []))
    if not args.local and "RANK" not in os.environ:
        rc = _emulated(args)
        if rc is not None:
            return rc
    from hcomm.bench.cli import main as bench

    return bench(_bench_args(args) + ["--nprocs", str(args.nprocs)])
