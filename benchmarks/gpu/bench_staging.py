"""The bridge's copy engine: a chunked device -> host staging block -> device trip vs its copy bound.

A staged cross-island message costs one copy up and one copy down; pipelined in chunks the two
directions overlap, so the ideal trip takes bytes / min(up, down) seconds, not the sum.  This measures,
side by side in one run:

- up and down alone (torch's own copies between the device and a pinned host buffer; on CPU a memcpy);
- the engine's chunked trip (``_C.stage_copy``) at several chunk sizes;

and reports each trip's throughput as a fraction of the overlapped bound and of the serial one.  On a
machine without a GPU it measures the emulated engine (the staging mode's) against memcpy.

    python3 benchmarks/gpu/bench_staging.py [--mib 256] [--reps 10] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time

import torch

import hcomm  # noqa: F401
from hcomm import _C


def median_seconds(fn, reps, sync):
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--chunks-kib", default="256,1024,4096,16384")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    cuda = torch.cuda.is_available() and _C.has_cuda
    dev, kind = ("cuda", 1) if cuda else ("cpu", 0)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    nbytes = a.mib << 20
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=dev)
    dst = torch.zeros_like(src)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    up = median_seconds(lambda: host.copy_(src, non_blocking=cuda), a.reps, sync)
    down = median_seconds(lambda: dst.copy_(host, non_blocking=cuda), a.reps, sync)
    overlapped, serial = nbytes / max(up, down), nbytes / (up + down)
    rows = []
    for kib in (int(k) for k in a.chunks_kib.split(",")):
        stream = torch.cuda.current_stream().cuda_stream if cuda else 0
        secs = median_seconds(lambda: _C.stage_copy(kind, src.data_ptr(), dst.data_ptr(), nbytes, kib << 10, stream),
                              a.reps, sync)
        assert torch.equal(dst, src), "the staged trip changed the bytes"
        rows.append((kib, nbytes / secs))
    engine = "cuda" if cuda else "emulated"
    machine = torch.cuda.get_device_name(0) if cuda else f"{platform.machine()} CPU, {os.cpu_count()} cores"
    lines = [
        f"# Staging copy engine ({engine}) vs its copy bound, {datetime.date.today()}",
        "",
        f"Machine: {machine}; torch {torch.__version__}; {a.mib} MiB per trip, median of {a.reps}.",
        "",
        f"- up alone (device -> {'pinned ' if cuda else ''}host, torch copy): {nbytes / up / 1e9:.2f} GB/s",
        f"- down alone (host -> device): {nbytes / down / 1e9:.2f} GB/s",
        f"- bound with the directions overlapped, bytes / max(up, down): {overlapped / 1e9:.2f} GB/s; "
        f"serial, bytes / (up + down): {serial / 1e9:.2f} GB/s",
        "",
        "| chunk | trip GB/s | of overlapped bound | of serial bound |",
        "|---:|---:|---:|---:|",
    ]
    for kib, bw in rows:
        lines.append(f"| {kib} KiB | {bw / 1e9:.2f} | {bw / overlapped:.0%} | {bw / serial:.0%} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
