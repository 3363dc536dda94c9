"""Rank program for test_hier_emulated: hierarchical collectives on an
emulated cluster, checked exactly against the flat (gloo) reference."""
import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist

import hcomm

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
hc = dist.new_group(backend="hcomm")
topo = hcomm.topology(hc)
report = {"rank": rank, "islands": topo.islands, "links": sorted(topo.links)}
results = {}
for n in (1, 7, 100_003):
    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        x = ((torch.arange(n) % 11) * (rank + 1)).to(dtype)
        ref, mine = x.clone(), x.clone()
        dist.all_reduce(ref, group=gloo)
        hcomm.set_algorithm("hier", group=hc)
        dist.all_reduce(mine, group=hc)
        results[f"ar/{n}/{dtype}"] = [torch.equal(ref, mine), hcomm.last_op(hc)["algorithm"]]
counts = [3 * r + 1 for r in range(world)]
inp = torch.arange(sum(counts), dtype=torch.float64) * (rank + 1)
out = torch.zeros(counts[rank], dtype=torch.float64)
hcomm.set_algorithm("", group=hc)
hcomm.reduce_scatter_v(out, inp, counts, group=hc)
off = sum(counts[:rank])
results["rs_v"] = [torch.equal(out, torch.arange(off, off + counts[rank], dtype=torch.float64) * (world * (world + 1) / 2)),
                   hcomm.last_op(hc)["algorithm"]]
gathered = torch.zeros(sum(counts))
hcomm.all_gather_v(gathered, torch.full((counts[rank],), float(rank)), counts, group=hc)
results["ag_v"] = [torch.equal(gathered, torch.cat([torch.full((c,), float(r)) for r, c in enumerate(counts)])),
                   hcomm.last_op(hc)["algorithm"]]
hcomm.set_compression("bf16", group=hc)
y = torch.randn(50_000, generator=torch.Generator().manual_seed(rank))
dist.all_reduce(y, group=hc)
ys = [torch.zeros_like(y) for _ in range(world)]
dist.all_gather(ys, y, group=gloo)
results["bf16_identical"] = [all(torch.equal(ys[0], t) for t in ys), hcomm.last_op(hc)["algorithm"]]
report["results"] = results
print("HIER " + json.dumps(report), flush=True)
dist.destroy_process_group()
