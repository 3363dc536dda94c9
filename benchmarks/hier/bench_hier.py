"""Hierarchical all-reduce vs torch gloo's flat ring, side by side on an
emulated cluster, with the cost model's predictions and the alpha-beta bound.

Run on a preset (the ranks are the emulator's):

    hcomm emulate run --cluster two-islands -- python benchmarks/hier/bench_hier.py \
        --out benchmarks/results/hier-two-islands-2026-12-02

Per size it times gloo's all_reduce, hcomm with the algorithm the cost model
selects, and hcomm forced to each applicable algorithm (native = gloo under
hcomm, ring, hier), interleaved, and checks every result exactly.  Rank 0
writes OUT.md (table + machine) and OUT.png (time vs size).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from datetime import date, timedelta

import torch
import torch.distributed as dist

import hcomm

ALGOS = ["native", "ring", "hier"]


def sizes(lo: int, hi: int):
    s = lo
    while s <= hi:
        yield s
        s *= 4


def timed(fn, iters):
    fn()  # warm-up (connections, allocations)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--min-bytes", type=int, default=4 << 10)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--out", default="")
    p.add_argument("--compress", default="", help="comma list of wire formats to compare at --compress-bytes, e.g. bf16,fp8e4m3")
    p.add_argument("--compress-bytes", type=int, default=64 << 20)
    args = p.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    hc = dist.new_group(backend="hcomm")
    topo = hcomm.topology(hc)
    inter = topo.links.get("inter")
    rows = []
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        n = nbytes // 4
        base = (torch.arange(n, dtype=torch.float32) % 17) * (rank + 1)
        expected = (torch.arange(n, dtype=torch.float32) % 17) * (world * (world + 1) / 2)
        iters = args.iters if nbytes >= (1 << 20) else max(args.iters, 20)
        row = {"bytes": nbytes, "wrong": 0}

        def run(group, name):
            buf = base.clone()
            dist.all_reduce(buf, group=group)
            row["wrong"] += int((buf != expected).sum())
            work = base.clone()
            row[name] = timed(lambda: dist.all_reduce(work, group=group), iters)

        run(gloo, "gloo")
        hcomm.set_algorithm("", group=hc)
        run(hc, "auto")
        row["selected"] = hcomm.last_op(hc)["algorithm"]
        row["chunk"] = hcomm.last_op(hc)["chunk_bytes"]
        for algo in ALGOS:
            if algo == "hier" and len(topo.islands) < 2:
                continue
            hcomm.set_algorithm(algo, group=hc)
            run(hc, algo)
            rec = hcomm.last_op(hc)
            row[f"{algo}_ran"] = rec["algorithm"]
            row[f"{algo}_tiers"] = rec["tiers"]
            row[f"{algo}_pred"] = hcomm.predict("all_reduce", nbytes, algo, group=hc)
        hcomm.set_algorithm("", group=hc)
        # Max over ranks: the collective is as slow as its slowest rank.
        keys = [k for k in ("gloo", "auto", *ALGOS) if k in row]
        t = torch.tensor([row[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        for k, v in zip(keys, t.tolist()):
            row[k] = v
        w = torch.tensor([row["wrong"]])
        dist.all_reduce(w, group=gloo)
        row["wrong"] = int(w.item())
        # Lower bound: every island must send its partial of all n elements
        # across its uplink at least once (one message's latency on top).
        row["bound"] = (inter.alpha + nbytes / inter.beta) if inter else float("nan")
        rows.append(row)
        if rank == 0:
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("_tiers")}), flush=True)
    comp = compression_rows(args, rank, world, gloo, hc) if args.compress else []
    if rank == 0 and args.out:
        write(args.out, rows, topo, comp, args.compress_bytes)
    dist.destroy_process_group()


def compression_rows(args, rank, world, gloo, hc):
    """hier all-reduce with each wire format vs fp32 on random data: time and error."""
    n = args.compress_bytes // 4
    data = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    exact = torch.zeros(n, dtype=torch.float64)
    for r in range(world):
        exact += torch.randn(n, generator=torch.Generator().manual_seed(r)).double()
    out = []
    hcomm.set_algorithm("hier", group=hc)
    for spec in ["none"] + [s for s in args.compress.split(",") if s]:
        hcomm.set_compression(spec, group=hc)
        buf = data.clone()
        dist.all_reduce(buf, group=hc)
        err = ((buf.double() - exact).norm() / exact.norm()).item()
        gathered = [torch.zeros_like(buf) for _ in range(world)]
        dist.all_gather(gathered, buf, group=gloo)
        identical = all(torch.equal(gathered[0], g) for g in gathered)
        work = data.clone()
        t = torch.tensor([timed(lambda: dist.all_reduce(work, group=hc), args.iters)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        tiers = hcomm.last_op(hc)["tiers"]
        inter = next((x["bytes"] for x in tiers if x["tier"] == "inter"), 0)
        out.append({"wire": spec, "seconds": t.item(), "relerr": err, "identical": identical, "inter_bytes": inter})
        if rank == 0:
            print(json.dumps(out[-1]), flush=True)
    hcomm.set_compression("none", group=hc)
    hcomm.set_algorithm("", group=hc)
    return out


def write(out: str, rows, topo, comp=(), comp_bytes=0):
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# Hierarchical all-reduce on an emulated cluster — {date.today()}", "",
             f"Machine: {platform.node()}, {os.cpu_count()} cores, {platform.platform()}; "
             f"torch {torch.__version__}, hcomm {hcomm.__version__} ({rev}).", "",
             "```", str(topo), "```", "",
             "Times are the max over ranks of the mean per call (ms). `auto` is hcomm with the algorithm its cost "
             "model selects; `native` is gloo's ring run through hcomm; `bound` is the alpha-beta lower bound "
             "(each island sends its partial of every element across its uplink once). `best` is the fastest "
             "hcomm algorithm measured at that size; `auto/best` > 1.10 would be a selection miss.", "",
             "| bytes | gloo | auto (algo, chunk) | native | ring | hier | gloo/auto | auto/bound | auto/best | pred hier | pred err | #wrong |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        best = min(r[a] for a in ALGOS if a in r)
        pred = r.get("hier_pred", float("nan"))
        err = (pred - r["hier"]) / r["hier"] if "hier" in r else float("nan")
        lines.append(
            f"| {r['bytes']} | {r['gloo']*1e3:.2f} | {r['auto']*1e3:.2f} ({r['selected']}, {r['chunk']}) | "
            + " | ".join(f"{r[a]*1e3:.2f}" if a in r else "-" for a in ALGOS)
            + f" | {r['gloo']/r['auto']:.2f} | {r['auto']/r['bound']:.2f} | {r['auto']/best:.2f} | "
            f"{pred*1e3:.2f} | {err:+.0%} | {r['wrong']} |")
    lines += ["", "Predicted vs measured for every algorithm (ms, error = (pred - meas) / meas):", "",
              "| bytes | " + " | ".join(f"{a} pred | {a} meas | {a} err" for a in ALGOS) + " |",
              "| ---: |" + " ---: | ---: | ---: |" * len(ALGOS)]
    for r in rows:
        cells = []
        for a in ALGOS:
            if a in r:
                pr = r[f"{a}_pred"]
                cells.append(f"{pr*1e3:.2f} | {r[a]*1e3:.2f} | {(pr - r[a]) / r[a]:+.0%}")
            else:
                cells.append("- | - | -")
        lines.append(f"| {r['bytes']} | " + " | ".join(cells) + " |")
    tiers = [r for r in rows if r.get("hier_tiers")]
    if tiers:
        r = tiers[-1]
        lines += ["", f"Per-tier figures of `hier` at {r['bytes']} bytes (rank 0):", "",
                  "| tier | bytes sent | seconds | GB/s |", "| --- | ---: | ---: | ---: |"]
        for t in r["hier_tiers"]:
            bw = t["bytes"] / t["seconds"] / 1e9 if t["seconds"] else float("nan")
            lines.append(f"| {t['tier']} | {t['bytes']} | {t['seconds']:.4f} | {bw:.3f} |")
    if comp:
        base = comp[0]["seconds"]
        lines += ["", f"Inter-tier compression, `hier` all-reduce of {comp_bytes} bytes of random N(0,1) fp32 per rank "
                  "(error: relative L2 vs the exact fp64 sum; identical: every rank holds the same bits):", "",
                  "| wire | ms | speed-up vs fp32 | inter bytes sent (rank 0) | rel. error | identical |",
                  "| --- | ---: | ---: | ---: | ---: | --- |"]
        for c in comp:
            lines.append(f"| {c['wire']} | {c['seconds']*1e3:.1f} | {base / c['seconds']:.2f} | {c['inter_bytes']} | "
                         f"{c['relerr']:.2e} | {c['identical']} |")
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = [r["bytes"] for r in rows]
        for key, label in [("gloo", "torch gloo (flat ring)"), ("auto", "hcomm (selected)"), ("native", "hcomm native"),
                           ("ring", "hcomm ring"), ("hier", "hcomm hier"), ("bound", "alpha-beta bound")]:
            if all(key in r for r in rows):
                ax.plot(xs, [r[key] * 1e3 for r in rows], marker="o", label=label,
                        linestyle="--" if key == "bound" else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("ms per all_reduce")
        ax.set_title(os.path.basename(out))
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out + ".png", dpi=110)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
