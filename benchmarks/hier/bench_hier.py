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


def count_wrong(buf, world):
    """Elements of an all-reduced buf that differ from the exact sum, checked in
    slices so that no second full-size tensor is held (256 MB under a 2 GiB cgroup)."""
    total = world * (world + 1) / 2
    wrong, step = 0, 1 << 22
    for lo in range(0, buf.numel(), step):
        hi = min(lo + step, buf.numel())
        ref = (torch.arange(lo, hi, dtype=torch.float32) % 17) * total
        wrong += int((buf[lo:hi] != ref).sum())
    return wrong


def time_round_robin(methods, buf, budget_s, min_iters, max_iters, gloo):
    """Per-call times of every method, taken round-robin (one call of each per
    round, in a fresh order each round) so that drift of the shared 2-core
    box and the effects of one method on the next hit all methods alike.
    Each call starts after a barrier; a call's time is the max over ranks, and
    a method's figure is the median over rounds.  The round count follows the
    budget, from the slowest method's warm-up time, agreed across ranks."""
    def one_call(i):
        _, group, algo = methods[i]
        if algo is not None:
            hcomm.set_algorithm(algo, group=group)
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        dist.all_reduce(buf, group=group)
        return time.perf_counter() - t0

    # Two warm-up passes; the second (connections and buffers in place) sizes the rounds.
    for i in range(len(methods)):
        one_call(i)
    warm = torch.tensor([one_call(i) for i in range(len(methods))], dtype=torch.float64)
    dist.all_reduce(warm, op=dist.ReduceOp.MAX, group=gloo)
    rounds = int(max(min_iters, min(max_iters, budget_s / max(float(warm.sum()), 1e-6))))
    times = torch.zeros(len(methods), rounds, dtype=torch.float64)
    for r in range(rounds):
        # A fresh order every round (same seed on every rank): a call right
        # after gloo's (whose threads may still hold the cores' quota) must not
        # always be the same method, which a mere rotation would keep.
        for i in torch.randperm(len(methods), generator=torch.Generator().manual_seed(r)).tolist():
            times[i, r] = one_call(i)
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=gloo)
    med = times.median(dim=1).values
    return {name: float(med[i]) for i, (name, _, _) in enumerate(methods)}, rounds


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--min-bytes", type=int, default=4 << 10)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--iters", type=int, default=5, help="fewest timed rounds per size")
    p.add_argument("--max-iters", type=int, default=60, help="most timed rounds per size")
    p.add_argument("--budget", type=float, default=6.0, help="seconds of timed rounds per size (all methods)")
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
        buf = torch.empty_like(base)
        row = {"bytes": nbytes, "wrong": 0}
        methods = [("gloo", gloo, None), ("auto", hc, "")]
        methods += [(a, hc, a) for a in ALGOS if not (a == "hier" and len(topo.islands) < 2)]
        # Correctness first, on patterned data, once per method.
        for name, group, algo in methods:
            if algo is not None:
                hcomm.set_algorithm(algo, group=group)
            buf.copy_(base)
            dist.all_reduce(buf, group=group)
            row["wrong"] += count_wrong(buf, world)
            if algo is None:
                continue
            rec = hcomm.last_op(hc)
            if name == "auto":
                row["selected"], row["chunk"] = rec["algorithm"], rec["chunk_bytes"]
            else:
                row[f"{name}_ran"], row[f"{name}_tiers"] = rec["algorithm"], rec["tiers"]
                row[f"{name}_pred"] = hcomm.predict("all_reduce", nbytes, name, group=hc)
        del base
        # Timed on zeros: repeated in-place sums of real data would overflow
        # to inf over the rounds; no algorithm treats zeros specially.
        buf.zero_()
        med, row["rounds"] = time_round_robin(methods, buf, args.budget, args.iters, args.max_iters, gloo)
        row.update(med)
        hcomm.set_algorithm("", group=hc)
        del buf
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
             "Times are the median over rounds of the max over ranks per call (ms); the methods are timed round-robin, one call each per round after a barrier, in a fresh random order every round (rounds per size in the last column). `auto` is hcomm with the algorithm its cost "
             "model selects; `native` is gloo's ring run through hcomm; `bound` is the alpha-beta lower bound "
             "(each island sends its partial of every element across its uplink once). `best` is the fastest "
             "hcomm algorithm measured at that size; `auto/best` > 1.10 would be a selection miss.", "",
             "| bytes | gloo | auto (algo, chunk) | native | ring | hier | gloo/auto | auto/bound | auto/best | pred hier | pred err | #wrong | rounds |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        best = min(r[a] for a in ALGOS if a in r)
        pred = r.get("hier_pred", float("nan"))
        err = (pred - r["hier"]) / r["hier"] if "hier" in r else float("nan")
        lines.append(
            f"| {r['bytes']} | {r['gloo']*1e3:.2f} | {r['auto']*1e3:.2f} ({r['selected']}, {r['chunk']}) | "
            + " | ".join(f"{r[a]*1e3:.2f}" if a in r else "-" for a in ALGOS)
            + f" | {r['gloo']/r['auto']:.2f} | {r['auto']/r['bound']:.2f} | {r['auto']/best:.2f} | "
            f"{pred*1e3:.2f} | {err:+.0%} | {r['wrong']} | {r['rounds']} |")
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
