"""Fuzz and soak (issue 18, item 4): many random operations, group churn, and what each rank holds.

4 worker processes (tests/helpers/mp.py) run the fuzz of tests/fuzz/fuzz_ops.py
in chunks that rotate over the configurations: a flat group of 4 (cost
model, and every algorithm forced at random), a flat group of 3, islands
2+2, uneven 3+1 and interleaved {0,2}{1,3}; every result is compared byte
for byte with an exact reference.  After each chunk, one group
create/destroy cycle: ``dist.new_group(backend="hcomm")`` (island layout
rotating flat, 2+2, 3+1, interleaved, so island groups and shared-memory
rings are created and torn down too), a few checked ops, then
``dist.destroy_process_group(g)``.

Each rank's RSS (VmRSS), threads (/proc/self/task) and open fds
(/proc/self/fd) are read at start, after the warm-up (--warmup-ops
operations, default 6,000, and 5 cycles), every 20 chunks and at the end, each time
after a barrier and a pause that lets lingering point-to-point waiters
(20 ms) end.

    python benchmarks/reliability/fuzz_soak.py [--ops 20000] [--cycles 100] [--seed 1] [--json out.json]

Bars: >= 10,000 operations with 0 mismatches; RSS growth after warm-up
< 50 MB, no growth in threads or fds after warm-up.  Exit status 1 if a bar is missed.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

CONFIGS = [("flat", False), ("flat", True), ("flat3", True), ("islands_2_2", True), ("islands_3_1", True),
           ("islands_interleaved", True)]
CYCLE_LAYOUTS = ["flat", "islands_2_2", "islands_3_1", "islands_interleaved"]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _thread_names() -> dict:
    names = collections.Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[f.read().strip()] += 1
        except OSError:
            pass
    return dict(names)


def probe(ctx):
    """This rank's RSS (MB), threads and open fds, read after the other ranks are idle too.

    rss_mb is VmRSS as it stands; rss_trim_mb is VmRSS after glibc's malloc_trim(0) hands
    the free memory it keeps back to the kernel, which separates memory still referenced
    (a leak) from memory the allocator retains after large tensors are freed."""
    import ctypes
    import gc

    import torch.distributed as dist

    dist.barrier(group=ctx.gloo)
    time.sleep(0.5)
    rss = _rss_mb()
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return {"rss_mb": rss, "rss_trim_mb": _rss_mb(), "threads": len(os.listdir("/proc/self/task")),
            "fds": len(os.listdir("/proc/self/fd")), "thread_names": _thread_names()}


def cycle(ctx, layout: str, seed: int):
    """Create an hcomm group, run a few checked ops on it, destroy it; returns the mismatches."""
    import torch
    import torch.distributed as dist

    import hcomm
    from tests.fuzz import fuzz_ops

    g = fuzz_ops.make_group(fuzz_ops.LAYOUTS[layout], ctx.rank)
    try:
        bad = []
        r, w = ctx.rank, ctx.world
        x = torch.arange(1001, dtype=torch.int64) + 1000 * r
        hcomm.all_reduce(x, group=g)
        if not torch.equal(x, sum(torch.arange(1001, dtype=torch.int64) + 1000 * q for q in range(w))):
            bad.append("all_reduce")
        out = torch.zeros(w * 7, dtype=torch.float32)
        hcomm.all_gather(out, torch.full((7,), float(r + seed)), group=g)
        if not torch.equal(out, torch.tensor([float(q + seed) for q in range(w) for _ in range(7)])):
            bad.append("all_gather")
        b = torch.full((5,), float(r))
        hcomm.broadcast(b, src=seed % w, group=g)
        if not torch.equal(b, torch.full((5,), float(seed % w))):
            bad.append("broadcast")
        got = torch.zeros(3, dtype=torch.int32)
        s = hcomm.send(torch.full((3,), r, dtype=torch.int32), (r + 1) % w, group=g, async_op=True)
        hcomm.recv(got, (r - 1) % w, group=g)
        s.wait()
        if not torch.equal(got, torch.full((3,), (r - 1) % w, dtype=torch.int32)):
            bad.append("send_recv")
        hcomm.barrier(group=g)
        return bad
    finally:
        dist.destroy_process_group(g)


def chunk(ctx, config: str, forced: bool, seed: int, n_ops: int, max_n: int):
    from tests.fuzz import fuzz_ops

    return fuzz_ops.case_fuzz(ctx, config, seed, n_ops, max_n, forced)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--chunks", type=int, default=100, help="fuzz chunks (one cycle follows each of the first --cycles)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-n", type=int, default=1 << 20)
    ap.add_argument("--warmup-ops", type=int, default=6000, help="fuzz operations of the warm-up (not counted)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    from tests.helpers.mp import Pool

    t0 = time.perf_counter()
    pool = Pool(4, setup="groups", env={"HCOMM_PROFILE": "off"}, timeout_s=900, group_timeout_s=120)
    me = sys.modules[__name__]
    probes = {}
    per_op, per_dtype, algos, noncanon = collections.Counter(), collections.Counter(), collections.Counter(), \
        collections.Counter()
    totals = {"ops": 0, "mismatches": 0, "cycles": 0, "cycle_mismatches": 0}
    first = []
    try:
        # Functions are sent by module and name: run this file's cases as benchmarks.reliability.fuzz_soak.
        from benchmarks.reliability import fuzz_soak as cases  # noqa: F401
    except ImportError:
        cases = me
    probes["start"] = pool.run(cases.probe)

    def run_chunk(i: int, n_ops: int, count: bool):
        config, forced = CONFIGS[i % len(CONFIGS)]
        res = [r for r in pool.run(cases.chunk, config, forced, args.seed * 100_000 + i, n_ops, args.max_n)
               if r is not None]
        if count:
            totals["ops"] += n_ops
            per_op.update(res[0]["per_op"])
            per_dtype.update(res[0]["per_dtype"])
            algos.update(res[0]["algorithms"])
            for r in res:
                noncanon.update(r["noncanonical_bool"])
        totals["mismatches"] += sum(r["mismatches"] for r in res)
        first.extend(line for r in res for line in r["first"][:2])

    def run_cycle(i: int, count: bool):
        res = pool.run(cases.cycle, CYCLE_LAYOUTS[i % len(CYCLE_LAYOUTS)], i)
        if count:
            totals["cycles"] += 1
        bad = [b for r in res for b in r]
        totals["cycle_mismatches"] += len(bad)
        if bad:
            first.append(f"cycle {i}: {bad}")

    # Warm-up (not counted): --warmup-ops fuzz operations in chunks of 200 over every configuration,
    # then 5 create/destroy cycles.  Lazily started threads (shared-memory progress threads, torch's
    # intra-op pool, gloo's) and the allocator's pools reach their working size here.
    for i in range(max(len(CONFIGS), args.warmup_ops // 200)):
        run_chunk(-1 - i, 200, count=False)
    for i in range(5):
        run_cycle(1000 + i, count=False)
    probes["warm"] = pool.run(cases.probe)
    t_main = time.perf_counter()

    n_chunks = max(args.chunks, args.cycles, 1)
    per_chunk = args.ops // n_chunks
    for i in range(n_chunks):
        run_chunk(i, per_chunk + (1 if i < args.ops % n_chunks else 0), count=True)
        if i < args.cycles:
            run_cycle(i, count=True)
        if (i + 1) % 20 == 0 and i + 1 < n_chunks:
            probes[f"after {i + 1} chunks"] = pool.run(cases.probe)
            print(f"  {i + 1}/{n_chunks} chunks, {totals['ops']} ops, {totals['mismatches']} mismatches, "
                  f"{time.perf_counter() - t_main:.0f} s", flush=True)
    main_s = time.perf_counter() - t_main
    probes["end"] = pool.run(cases.probe)
    pool.close()

    rss_growth = [probes["end"][r]["rss_mb"] - probes["warm"][r]["rss_mb"] for r in range(4)]
    rss_trim_growth = [probes["end"][r]["rss_trim_mb"] - probes["warm"][r]["rss_trim_mb"] for r in range(4)]
    thread_growth = [probes["end"][r]["threads"] - probes["warm"][r]["threads"] for r in range(4)]
    fd_growth = [probes["end"][r]["fds"] - probes["warm"][r]["fds"] for r in range(4)]
    verdict = {
        "ops >= 10000 with 0 mismatches": totals["ops"] >= 10000 and totals["mismatches"] == 0
        and totals["cycle_mismatches"] == 0,
        "RSS growth after warm-up < 50 MB": max(rss_growth) < 50,
        "RSS growth after warm-up < 50 MB, after malloc_trim": max(rss_trim_growth) < 50,
        "no thread growth after warm-up": max(thread_growth) <= 0,
        "no fd growth after warm-up": max(fd_growth) <= 0,
        f">= {args.cycles} create/destroy cycles": totals["cycles"] >= args.cycles,
    }
    summary = {"args": vars(args), "totals": totals, "per_op": dict(per_op), "per_dtype": dict(per_dtype),
               "algorithms": dict(algos), "noncanonical_bool": dict(noncanon), "first_mismatches": first[:10],
               "probes": probes, "rss_growth_mb": rss_growth, "rss_trim_growth_mb": rss_trim_growth, "thread_growth": thread_growth,
               "fd_growth": fd_growth, "main_seconds": main_s, "total_seconds": time.perf_counter() - t0,
               "verdict": verdict}
    print(json.dumps(summary, indent=1, default=str))
    print("\n| rank | RSS MB start / warm / end | RSS MB after malloc_trim start / warm / end "
          "| threads start / warm / end | fds start / warm / end |")
    print("|---|---|---|---|---|")
    for r in range(4):
        s, w, e = probes["start"][r], probes["warm"][r], probes["end"][r]
        print(f"| {r} | {s['rss_mb']:.1f} / {w['rss_mb']:.1f} / {e['rss_mb']:.1f} "
              f"| {s['rss_trim_mb']:.1f} / {w['rss_trim_mb']:.1f} / {e['rss_trim_mb']:.1f} "
              f"| {s['threads']} / {w['threads']} / {e['threads']} | {s['fds']} / {w['fds']} / {e['fds']} |")
    for k, v in verdict.items():
        print(f"{'PASS' if v else 'FAIL'}: {k}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return 0 if all(verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
