"""The host-staged bridge vs the direct path, side by side on an emulated cluster.

Two hcomm groups over the same ranks: one direct, one created with HCOMM_FORCE_STAGING=1, so the staged
group's cross-island tier goes through the copy engine (copy up to a staging block, chunks on the host
transport, copy down) exactly as a GPU island's would.  Per size it times ``hier`` all-reduce and
``hier_ag`` all-gather on each group round-robin, checks every staged result against the direct one
bitwise, and reports the staging overhead (staged / direct) with the cost model's predictions for both.

    hcomm emulate run --cluster two-islands -- python benchmarks/hier/bench_staging.py \
        --out benchmarks/results/staging-two-islands-2026-12-04.md
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from datetime import date, timedelta

import torch
import torch.distributed as dist

import hcomm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="0.25,1,4,16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    os.environ["HCOMM_FORCE_STAGING"] = "0"
    direct = dist.new_group(backend="hcomm")
    os.environ["HCOMM_FORCE_STAGING"] = "1"
    staged = dist.new_group(backend="hcomm")
    groups = {"direct": direct, "staged": staged}
    rows = []
    for mib in (float(s) for s in a.sizes_mib.split(",")):
        n = int(mib * (1 << 20)) // 4
        for op, algo in (("all_reduce", "hier"), ("all_gather", "hier_ag")):
            times = {k: [] for k in groups}
            results, staged_bytes = {}, 0
            for k, g in groups.items():
                hcomm.set_algorithm(algo, group=g)
            for _ in range(a.rounds + 1):  # the first round warms up
                for k, g in groups.items():
                    x = (torch.arange(n, dtype=torch.float32) % 13) + rank
                    out = torch.zeros(n * world) if op == "all_gather" else None
                    dist.barrier(group=gloo)
                    t0 = time.perf_counter()
                    if op == "all_gather":
                        dist.all_gather_into_tensor(out, x, group=g)
                    else:
                        dist.all_reduce(x, group=g)
                    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
                    times[k].append(t.item())
                    results[k] = out if op == "all_gather" else x
                    if k == "staged":
                        staged_bytes = hcomm.last_op(g)["staged_bytes"]
                        assert hcomm.last_op(g)["algorithm"] == algo
            same = torch.tensor([int(torch.equal(results["direct"], results["staged"]))])
            dist.all_reduce(same, op=dist.ReduceOp.MIN, group=gloo)
            med = {k: statistics.median(v[1:]) for k, v in times.items()}
            pred = {k: hcomm.predict(op, n * 4, algo, group=g) for k, g in groups.items()}
            rows.append(dict(op=op, mib=mib, **med, pred_direct=pred["direct"], pred_staged=pred["staged"],
                             same=bool(same.item()), staged_bytes=staged_bytes))
            if rank == 0:
                print(rows[-1], flush=True)
            hcomm.set_algorithm("", group=direct)
            hcomm.set_algorithm("", group=staged)
    if rank == 0 and a.out:
        topo = hcomm.topology(direct)
        lines = [f"# Host-staged bridge vs direct, hierarchical collectives on an emulated cluster — {date.today()}", "",
                 f"Machine: {platform.node()}, {os.cpu_count()} cores; torch {torch.__version__}; {world} ranks.", "",
                 "```", str(topo), "```", "",
                 "Both groups span the same ranks; `staged` was created with HCOMM_FORCE_STAGING=1 (emulated "
                 "copy engine, HCOMM_BRIDGE_CHUNK default 1 MiB).  Times: median over rounds of the max over "
                 "ranks (ms).  `equal`: the staged result equals the direct one bitwise on every rank.", "",
                 "| op | MiB per rank | direct | staged | staged/direct | pred direct | pred staged | "
                 "staged bytes (rank 0) | equal |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            lines.append(f"| {r['op']} | {r['mib']:g} | {r['direct']*1e3:.2f} | {r['staged']*1e3:.2f} | "
                         f"{r['staged']/r['direct']:.2f} | {r['pred_direct']*1e3:.2f} | {r['pred_staged']*1e3:.2f} | "
                         f"{r['staged_bytes']} | {'yes' if r['same'] else 'NO'} |")
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
