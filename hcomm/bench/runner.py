"""The sweep every rank runs: sizes x backends, timed, checked, reduced to records.

Per size, the backends run back to back (gloo at size s, hcomm at size s,
then size 2s, ...), so drift in a shared machine's load hits them equally
and the ratio column means something.  Per (size, backend) case:

1. allocate and fill, ``warmup`` untimed calls;
2. barrier on the control group, then ``iters`` synchronous calls between two
   ``time.perf_counter`` reads (plus ``torch.cuda.synchronize`` on GPUs);
   the per-rank average; the row shows the max over ranks (nccl-tests);
3. hcomm's ``last_op`` record of the last timed call (algorithm, tiers);
4. the data check, outside the timing: refill the inputs, one more call,
   count elements that differ from the exact answer; summed over ranks.

Control traffic (barriers, the max/sum of the results, gathering last_op)
goes over the default gloo group, never over the group being measured.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from hcomm.bench import backends as bk
from hcomm.bench import definitions
from hcomm.bench.base import DTYPES, Context, poison_like
from hcomm.bench.environment import rank_info
from hcomm.settings import declare

CORRUPT = declare(
    "HCOMM_BENCH_CORRUPT", "",
    "test hook for hcomm bench: 'RANK:INDEX' overwrites input element INDEX on rank RANK "
    "before every checked call, so a test can prove that #wrong catches bad data")


@dataclass
class BenchConfig:
    op: str
    sizes: List[int]                 # requested bytes, before rounding to granules
    dtype: str = "float"
    redop: str = "sum"
    root: int = 0
    iters: int = 20
    warmup: int = 5
    backends: List[str] = field(default_factory=lambda: ["gloo"])
    algo: Optional[str] = None
    device: str = "cpu"
    progress: bool = True
    json_path: Optional[str] = None
    plot_path: Optional[str] = None
    markdown_path: Optional[str] = None
    argv: List[str] = field(default_factory=list)


@dataclass
class SweepResult:
    records: List[Dict[str, Any]]
    ranks: List[Dict[str, Any]]
    hcomm_topology: Optional[Dict[str, Any]]
    warnings: List[str]


def parse_corrupt(text: str) -> Optional[Tuple[int, int]]:
    if not text:
        return None
    try:
        rank, index = (int(part) for part in text.split(":"))
    except ValueError:
        raise ValueError(f"HCOMM_BENCH_CORRUPT={text!r}: expected RANK:INDEX") from None
    return rank, index


def bandwidths(size_bytes: int, seconds: float, factor: float) -> Tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 B/s, as nccl-tests): algbw = size / time."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * factor


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _corrupt(target: torch.Tensor, index: int) -> None:
    if index < target.numel():
        target[index: index + 1].copy_(poison_like(target[index: index + 1]))


def merge_tiers(per_rank: List[Optional[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """One entry per tier: the busiest rank's bytes and time, the slowest rank's rate.

    A hierarchical op is as fast as its slowest rank on each tier, so the
    achieved bandwidth is the minimum over ranks of bytes/seconds there.
    """
    tiers: Dict[str, Dict[str, Any]] = {}
    for info in per_rank:
        for t in (info or {}).get("tiers") or []:
            name, nbytes, secs = str(t.get("tier")), int(t.get("bytes", 0)), float(t.get("seconds", 0.0))
            entry = tiers.setdefault(name, {"tier": name, "bytes": 0, "seconds": 0.0, "gbps": None})
            entry["bytes"] = max(entry["bytes"], nbytes)
            entry["seconds"] = max(entry["seconds"], secs)
            if secs > 0 and nbytes > 0:
                rate = nbytes / secs / 1e9
                entry["gbps"] = rate if entry["gbps"] is None else min(entry["gbps"], rate)
    return list(tiers.values())


def algorithm_of(per_rank: List[Optional[Dict[str, Any]]]) -> Optional[str]:
    names = sorted({str(i["algorithm"]) for i in per_rank if i and i.get("algorithm")})
    return "/".join(names) if names else None


class Sweep:
    """State of one rank's sweep; rank 0 also builds the records."""

    def __init__(self, cfg: BenchConfig, rank: int, nranks: int, device: torch.device,
                 emit: Callable[[Dict[str, Any]], None]):
        self.cfg, self.rank, self.nranks, self.device, self.emit = cfg, rank, nranks, device, emit
        self.op = definitions.get(cfg.op)
        self.control = dist.group.WORLD
        # every rank creates the groups in the same order (new_group is collective)
        self.groups = {b: dist.new_group(backend=b) for b in cfg.backends}
        self.corrupt = parse_corrupt(CORRUPT.get())
        self.warnings: List[str] = []

    def counts(self) -> List[int]:
        elsize = torch.empty((), dtype=DTYPES[self.cfg.dtype]).element_size()
        seen, out = set(), []
        for nbytes in self.cfg.sizes:
            count = self.op.count_for(nbytes, elsize, self.nranks)
            if count not in seen:
                seen.add(count)
                out.append(count)
        return out

    def _time(self, ctx: Context, buf) -> float:
        for _ in range(self.cfg.warmup):
            self.op.run(ctx, buf)
        _sync(self.device)
        dist.barrier(group=self.control)
        start = time.perf_counter()
        for _ in range(self.cfg.iters):
            self.op.run(ctx, buf)
        _sync(self.device)
        return (time.perf_counter() - start) / self.cfg.iters / self.op.time_divisor

    def _check(self, ctx: Context, buf) -> int:
        self.op.reset(ctx, buf)
        if self.corrupt and self.corrupt[0] == self.rank:
            _corrupt(self.op.corrupt_target(buf), self.corrupt[1])
        _sync(self.device)
        self.op.run(ctx, buf)
        _sync(self.device)
        return self.op.wrong(ctx, buf)

    def case(self, count: int, backend: str) -> Optional[Dict[str, Any]]:
        cfg = self.cfg
        ctx = Context(self.rank, self.nranks, cfg.dtype, cfg.redop, cfg.root, self.device,
                      backend, self.groups[backend])
        buf = self.op.prepare(ctx, count)
        per_call = self._time(ctx, buf)
        info = bk.last_op(backend, ctx.group)
        wrong = self._check(ctx, buf)
        del buf

        stats = torch.tensor([per_call], dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=self.control)
        wrong_t = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(wrong_t, op=dist.ReduceOp.SUM, group=self.control)
        infos: List[Optional[Dict[str, Any]]] = [None] * self.nranks
        if backend == "hcomm":
            dist.all_gather_object(infos, info, group=self.control)
        if self.rank != 0:
            return None
        return self._record(ctx, count, float(stats.item()), int(wrong_t.item()), infos)

    def _record(self, ctx: Context, count: int, seconds: float, wrong: int,
                infos: List[Optional[Dict[str, Any]]]) -> Dict[str, Any]:
        cfg, op = self.cfg, self.op
        size = count * ctx.elsize
        factor = op.busbw_factor(self.nranks)
        algbw, busbw = bandwidths(size, seconds, factor)
        algorithm = op.label(ctx.backend) or algorithm_of(infos)
        rank0 = infos[0] or {}
        requested = cfg.algo if ctx.backend == "hcomm" else None
        matched = None
        if requested:
            matched = algorithm is not None and all(
                i is not None and i.get("algorithm") == requested for i in infos)
            if not matched:
                self.warnings.append(
                    f"--algo {requested} was requested but hcomm ran {algorithm or 'an unreported algorithm'}"
                    f" at {size} B")
        return {
            "op": op.name, "backend": ctx.backend, "nranks": self.nranks,
            "size_bytes": size, "count": count, "dtype": cfg.dtype,
            "redop": cfg.redop if op.reduces else "none",
            "root": cfg.root if op.has_root else -1,
            "iters": cfg.iters, "warmup": cfg.warmup, "device": self.device.type,
            "time_us": seconds * 1e6, "algbw_gbps": algbw, "busbw_factor": factor,
            "busbw_gbps": busbw, "wrong": wrong, "ratio": None,
            "algorithm": algorithm, "chunk_bytes": rank0.get("chunk_bytes"),
            "algo_requested": requested, "algo_matched": matched,
            "tiers": merge_tiers(infos),
        }

    def run(self) -> List[Dict[str, Any]]:
        records: List[Dict[str, Any]] = []
        counts = self.counts()
        total = len(counts) * len(self.cfg.backends)
        bar = self._progress(total)
        done = 0
        for count in counts:
            first = None
            for backend in self.cfg.backends:
                self._announce(bar, done, total, backend, count)
                done += 1
                record = self.case(count, backend)
                if bar is not None:
                    bar.update(1)
                if record is None:
                    continue
                first = first or record
                if first["busbw_gbps"] > 0:
                    record["ratio"] = record["busbw_gbps"] / first["busbw_gbps"]
                records.append(record)
                self.emit(record)
        if bar is not None:
            bar.close()
        return records

    def _announce(self, bar, done: int, total: int, backend: str, count: int) -> None:
        # piped output (hcomm emulate run, CI logs) gets no bar: a flushed line per
        # case instead, so a long sweep shows it is alive before each row lands
        if bar is not None or self.rank != 0 or not self.cfg.progress or sys.stderr.isatty():
            return
        print(f"# progress: case {done + 1}/{total}: {self.cfg.op} {backend} count {count}",
              file=sys.stderr, flush=True)

    def _progress(self, total: int):
        # rank 0 only, on stderr, and only for a person watching a terminal
        if self.rank != 0 or not self.cfg.progress or not sys.stderr.isatty():
            return None
        try:
            from tqdm import tqdm
        except ImportError:
            return None
        return tqdm(total=total, desc=f"hcomm bench {self.cfg.op}", unit="case", file=sys.stderr,
                    leave=False)


def run_sweep(cfg: BenchConfig, rank: int, nranks: int, device: torch.device,
              emit: Callable[[Dict[str, Any]], None],
              on_start: Optional[Callable[[List[Dict[str, Any]]], None]] = None) -> SweepResult:
    ranks: List[Any] = [None] * nranks
    dist.all_gather_object(ranks, rank_info(rank, device))
    if rank == 0 and on_start is not None:
        on_start(ranks)
    sweep = Sweep(cfg, rank, nranks, device, emit)
    topo = bk.topology_summary(sweep.groups["hcomm"]) if "hcomm" in sweep.groups else None
    records = sweep.run()
    return SweepResult(records, ranks, topo, sweep.warnings)
