"""Hierarchical collectives under different hcomm settings, side by side on an emulated cluster.

One hcomm group per variant over the same ranks, each created with its own settings (environment
variables read at group creation), plus torch's gloo: per size it times each variant's all_reduce and
all_gather round-robin, checks every variant's result bitwise against the first variant's, and reports
the times, the ratio to the first variant and to gloo, and the cost model's predictions.

    # the host-staged bridge vs the direct path
    hcomm emulate run --cluster two-islands -- python benchmarks/hier/bench_variants.py \
        --variant direct:HCOMM_FORCE_STAGING=0 --variant staged:HCOMM_FORCE_STAGING=1 --out FILE.md
    # the cross-island exchange of the hierarchical all-reduce
    hcomm emulate run --cluster uneven -- python benchmarks/hier/bench_variants.py --ops all_reduce \
        --variant direct:HCOMM_HIER_EXCHANGE=direct --variant owner:HCOMM_HIER_EXCHANGE=owner --out FILE.md
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


ALGO = {"all_reduce": "hier", "all_gather": "hier_ag"}


def parse_variant(text: str):
    """'name:KEY=VAL,KEY=VAL' -> (name, {KEY: VAL})."""
    name, _, env = text.partition(":")
    pairs = dict(kv.split("=", 1) for kv in env.split(",") if kv)
    if not name or not all(k.startswith("HCOMM_") for k in pairs):
        raise SystemExit(f"--variant wants NAME:HCOMM_X=V[,HCOMM_Y=W], got {text!r}")
    return name, pairs


def run_once(op, group, n, rank, world):
    x = (torch.arange(n, dtype=torch.float32) % 13) + rank
    if op == "all_gather":
        out = torch.zeros(n * world)
        dist.all_gather_into_tensor(out, x, group=group)
        return out
    dist.all_reduce(x, group=group)
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", required=True, help="NAME:HCOMM_X=V[,HCOMM_Y=W] (repeat)")
    ap.add_argument("--ops", default="all_reduce,all_gather")
    ap.add_argument("--sizes-mib", default="0.25,1,4,16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    variants = [parse_variant(v) for v in a.variant]
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    groups = {}
    for name, env in variants:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        groups[name] = dist.new_group(backend="hcomm")
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    names, first = list(groups), variants[0][0]
    rows = []
    for mib in (float(s) for s in a.sizes_mib.split(",")):
        n = int(mib * (1 << 20)) // 4
        for op in a.ops.split(","):
            times = {k: [] for k in [*names, "gloo"]}
            results, records = {}, {}
            for g in groups.values():
                hcomm.set_algorithm(ALGO[op], group=g)
            for _ in range(a.rounds + 1):  # the first round warms up
                for k in times:
                    g = gloo if k == "gloo" else groups[k]
                    dist.barrier(group=gloo)
                    t0 = time.perf_counter()
                    results[k] = run_once(op, g, n, rank, world)
                    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
                    times[k].append(t.item())
                    if k != "gloo":
                        records[k] = hcomm.last_op(g)
                        assert records[k]["algorithm"] == ALGO[op], records[k]
            same = torch.tensor([int(all(torch.equal(results[first], results[k]) for k in names))])
            dist.all_reduce(same, op=dist.ReduceOp.MIN, group=gloo)
            inter = torch.tensor([[next((t["bytes"] for t in records[k]["tiers"] if t["tier"] == "inter"), 0)
                                   for k in names]], dtype=torch.float64)
            gathered = [torch.zeros_like(inter) for _ in range(world)]
            dist.all_gather(gathered, inter, group=gloo)
            row = dict(op=op, mib=mib, same=bool(same.item()),
                       med={k: statistics.median(v[1:]) for k, v in times.items()},
                       pred={k: hcomm.predict(op, n * 4, ALGO[op], group=g) for k, g in groups.items()},
                       max_inter={k: max(int(x[0, i]) for x in gathered) for i, k in enumerate(names)})
            rows.append(row)
            if rank == 0:
                print(row, flush=True)
    for g in groups.values():
        hcomm.set_algorithm("", group=g)
    if rank == 0 and a.out:
        write(a.out, rows, names, variants, world, hcomm.topology(groups[first]))
    dist.destroy_process_group()
    return 0


def write(out, rows, names, variants, world, topo):
    first = names[0]
    lines = [f"# Hierarchical collectives under {len(names)} settings, side by side — {date.today()}", "",
             f"Machine: {platform.node()}, {os.cpu_count()} cores; torch {torch.__version__}; {world} ranks.", "",
             "```", str(topo), "```", "",
             "Variants (hcomm groups over the same ranks, each created with these settings): "
             + "; ".join(f"`{n}`: {', '.join(f'{k}={v}' for k, v in env.items())}" for n, env in variants) + ".", "",
             "Times: median over rounds of the max over ranks (ms), each variant and gloo timed round-robin. "
             f"`x {first}`: time / {first}'s. `inter max`: the most bytes one rank sent across islands. "
             f"`equal`: every variant's result equals `{first}`'s bitwise on every rank.", "",
             "| op | MiB per rank | gloo | " + " | ".join(f"{n} | x {first} | pred | inter max" for n in names)
             + " | equal |",
             "|---|---:|---:|" + "---:|---:|---:|---:|" * len(names) + "---|"]
    for r in rows:
        m = r["med"]
        cells = [f"{m[n]*1e3:.2f} | {m[n]/m[first]:.2f} | {r['pred'][n]*1e3:.2f} | {r['max_inter'][n]}" for n in names]
        lines.append(f"| {r['op']} | {r['mib']:g} | {m['gloo']*1e3:.2f} | " + " | ".join(cells)
                     + f" | {'yes' if r['same'] else 'NO'} |")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
