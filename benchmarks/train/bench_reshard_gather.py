"""How long a TP re-shard's gather takes: the shards as Python objects vs as one byte buffer per rank.

A TP group re-sharding mid-run (``hcomm.parallel.tensor.reshard``) first gathers every member's shards
of the parameters and of AdamW's two moments.  It used to gather the whole structure with
``all_gather_object`` (every byte pickled, sent, unpickled); ``_gather_flat`` sends the tensors as one
byte buffer per rank and only the names as objects.  Both run here side by side, alternating, on a TP
group of 2 local ranks (an hcomm group, as training builds it; the ``small`` model, fractions 0.6 / 0.4,
AdamW's moments filled by one step): median seconds of each, and a check that both give every whole tensor bit for bit.  Then the
whole re-shard to fractions 0.75 / 0.25 with its phases.

Writes ``benchmarks/results/train-reshard-gather-<date>.md``.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def _as_objects(tp_model, optimizer):
    """The gather as it was: every member's shards and states as one Python object."""
    from hcomm.models.llama import layer_modules
    from hcomm.parallel.tensor.reshard import _joined, _state_shards
    from hcomm.parallel.tensor.unshard import piece_shards

    mine = {}
    for i, piece in enumerate(layer_modules(tp_model)):
        shards = piece_shards(piece, tp_model.index)
        mine[i] = (shards, _state_shards(piece, shards, optimizer))
    gathered = [None] * dist.get_world_size(tp_model.group)
    dist.all_gather_object(gathered, mine, group=tp_model.group)
    return [_joined(gathered, i) for i in range(len(mine))]


def _same(a, b) -> bool:
    for (pa, sa), (pb, sb) in zip(a, b):
        if pa.keys() != pb.keys() or any(not torch.equal(pa[n], pb[n]) for n in pa):
            return False
        for n in sa:
            for k, v in sa[n].items():
                w = sb[n][k]
                if torch.is_tensor(v) and not torch.equal(v, w):
                    return False
    return True


def _worker(rank: int, world: int, port: int, model: str, repeats: int, queue):
    import hcomm  # noqa: F401  (registers the hcomm backend)
    from hcomm.models import Llama
    from hcomm.models.configs import CONFIGS
    from hcomm.parallel.tensor.parallelize import tensor_parallelize
    from hcomm.parallel.tensor.reshard import _cut_like, _reference, _whole_model, gather_whole

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    group = dist.new_group(backend="hcomm")   # a TP group as training builds it (``groups.replica_groups``)
    torch.manual_seed(0)
    config = CONFIGS[model]
    tp = tensor_parallelize(Llama(config), group, [0.6, 0.4])
    optimizer = torch.optim.AdamW(tp.parameters(), lr=1e-3)
    for p in tp.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    times = {"objects": [], "bytes": []}
    for k in range(2 * repeats):
        name, fn = (("objects", _as_objects), ("bytes", gather_whole))[k % 2]
        dist.barrier()
        start = time.perf_counter()
        fn(tp, optimizer)
        times[name].append(time.perf_counter() - start)
    same = _same(_as_objects(tp, optimizer), gather_whole(tp, optimizer))
    start = time.perf_counter()
    joined = gather_whole(tp, optimizer)
    gathered = time.perf_counter() - start
    template = _reference(config)   # as ``reshard`` does: one draw of initial weights, copied for each model
    whole = _whole_model(config, [params for params, _ in joined], template=template)
    rebuilt = time.perf_counter() - start - gathered
    cut = tensor_parallelize(whole, group, [0.75, 0.25])
    cutting = time.perf_counter() - start - gathered - rebuilt
    moments = time.perf_counter()
    for key in ("exp_avg", "exp_avg_sq"):
        model_of = _whole_model(config, [{n: s[key] for n, s in states.items() if key in s} for _, states in joined],
                                fill_missing=True, template=template)
        _cut_like(cut, model_of)
    moments = time.perf_counter() - moments
    elements = sum(p.numel() for p in tp.parameters())
    queue.put((rank, times, same, elements, gathered, rebuilt, moments, cutting))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=_worker, args=(r, 2, port, args.model, args.repeats, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=900) for _ in procs)
    for p in procs:
        p.join()
    slowest = {name: [max(r[1][name][k] for r in results) for k in range(args.repeats)] for name in ("objects", "bytes")}
    med = {name: statistics.median(v) for name, v in slowest.items()}
    same = all(r[2] for r in results)
    rest = results[0][5] + results[0][6] + results[0][7]   # rebuild, cut, moments: the same either way
    lines = [
        f"# TP re-shard: gathering the shards as objects vs as bytes, {datetime.date.today()}", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, torch "
        f"{torch.__version__}.  `benchmarks/train/bench_reshard_gather.py --model {args.model}`: a TP group of 2 local "
        f"ranks (an hcomm group as in training, one thread each), fractions 0.6 / 0.4, AdamW's moments filled; each gather "
        f"{args.repeats} times, alternating (the slowest rank's seconds, median).", "",
        "| gather | median s | runs (s) |", "|---|---|---|",
        *(f"| {name} | {med[name]:.3f} | {' / '.join(f'{t:.3f}' for t in slowest[name])} |" for name in slowest),
        "",
        f"- **{med['objects'] / med['bytes']:.1f}x** faster as bytes; every whole tensor equal bit for bit: "
        f"**{'yes' if same else 'NO'}** ({results[0][3] / 1e6:.1f} M parameters on rank 0, 3 tensors each)",
        f"- the rest of a re-shard to 0.75 / 0.25 on rank 0: gather {results[0][4]:.3f} s, rebuild the whole "
        f"model {results[0][5]:.3f} s, cut it {results[0][7]:.3f} s, cut the two moments {results[0][6]:.3f} s",
        f"- the whole move then: **{rest + med['bytes']:.2f} s** with the gather as bytes, {rest + med['objects']:.2f} s "
        f"as objects ({(rest + med['bytes']) / (rest + med['objects']):.2f} of it)",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = os.path.join(ROOT, "benchmarks", "results", f"train-reshard-gather-{datetime.date.today()}.md")
    with open(out, "w") as f:
        f.write(text)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
