"""CPU kernels vs torch vs a plain copy of the same bytes, side by side.

For each op: GB/s = (bytes read + bytes written) / best time per call over the
rounds (a round times a batch of calls lasting >= 2 ms, for small buffers); "vs torch"
is hcomm's speed over torch's equivalent op; "% copy" is hcomm's GB/s over
that of ``dst.copy_(src)`` moving the same number of bytes (a copy of half
as many bytes: read + write).  The three are timed round-robin, one call
each per round, so that load from other users of a shared machine hits all
three alike.  HCOMM_KERNEL_THREADS is set to torch's thread count.  torch's casts are timed as
``dst.copy_(src)`` into a preallocated tensor of the target dtype (what
``.to(dtype)`` runs, minus the allocation).

    python benchmarks/kernels/bench_cpu_kernels.py [--mib 64] [--reps 15] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import time

import torch

import hcomm
from hcomm import kernels

CHUNK = 1024


def timeit_rounds(fns, reps, min_sample_s=2e-3, settle_s=0.0):
    """Best seconds per call of each fn, timed round-robin (interference only
    adds time).  A sample is a batch of calls lasting at least min_sample_s,
    so that the timer's own cost and resolution do not swamp small buffers;
    every fn gets the same batch size (from the slowest fn's first calls).
    settle_s of idle before each sample lets threads still spinning from the
    previous fn (libgomp's workers spin for milliseconds after a torch op)
    go to sleep, so that no fn starts on a core another fn is still holding."""
    for fn in fns:
        fn()
        fn()
    first = []
    for fn in fns:
        t0 = time.perf_counter()
        fn()
        first.append(time.perf_counter() - t0)
    batch = max(1, int(min_sample_s / max(max(first), 1e-7)))
    times = [[] for _ in fns]
    for _ in range(reps):
        for k, fn in enumerate(fns):
            if settle_s:
                time.sleep(settle_s)
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            times[k].append((time.perf_counter() - t0) / batch)
    return [min(t) for t in times]


def cases(n):
    g = torch.Generator().manual_seed(0)
    f32 = torch.randn(n, generator=g)
    bf = f32.bfloat16()
    f16 = f32.half()
    out = {}

    def add(dtype, src):
        a, b = src.clone(), src.clone()
        return (3 * a.nbytes, lambda: a.add_(b), lambda: kernels.reduce_into(a, b, "sum"))
    out["add bf16"] = add(torch.bfloat16, bf)
    out["add fp32"] = add(torch.float32, f32)

    def cast(src, dtype):
        dst = torch.empty(n, dtype=dtype)
        return (src.nbytes + dst.nbytes, lambda: dst.copy_(src), lambda: kernels.cast(src, dtype, out=dst))
    out["cast fp32->bf16"] = cast(f32, torch.bfloat16)
    out["cast bf16->fp32"] = cast(bf, torch.float32)
    out["cast fp32->fp16"] = cast(f32, torch.float16)
    out["cast fp16->fp32"] = cast(f16, torch.float32)
    out["cast bf16->fp16"] = cast(bf, torch.float16)
    out["cast fp32->e4m3 (no scale)"] = cast(f32.clamp(-448, 448), torch.float8_e4m3fn)

    q, s = kernels.quantize_fp8(f32, "e4m3", CHUNK)

    def torch_quant():
        v = f32.view(-1, CHUNK)
        sc = (v.abs().amax(dim=1, keepdim=True) / 448.0).clamp_(min=2.0 ** -126)
        return (v / sc).to(torch.float8_e4m3fn), sc
    out["quantize fp32->e4m3/1024"] = (f32.nbytes + n + 4 * (n // CHUNK), torch_quant,
                                      lambda: kernels.quantize_fp8(f32, "e4m3", CHUNK))
    acc = f32.clone()
    qv = q.view(torch.float8_e4m3fn).view(-1, CHUNK)
    out["dequant-accumulate e4m3->fp32"] = (
        n + 2 * f32.nbytes,
        lambda: acc.view(-1, CHUNK).add_(qv.float() * s[:, None]),
        lambda: kernels.dequantize_accumulate(acc, q, s, "e4m3", CHUNK, "sum"))
    accb = bf.clone()
    out["dequant-accumulate e4m3->bf16"] = (
        n + 2 * bf.nbytes,
        lambda: accb.view(-1, CHUNK).add_((qv.float() * s[:, None]).bfloat16()),
        lambda: kernels.dequantize_accumulate(accb, q, s, "e4m3", CHUNK, "sum"))
    return out, f32


def copy_fn(nbytes):
    """A copy that moves `nbytes` (reads nbytes/2, writes nbytes/2)."""
    src = torch.empty(max(nbytes // 8, 1)).normal_()
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def machine():
    model = platform.processor()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    isa = sorted({f for f in flags.split() if f.startswith(("avx2", "avx512f", "avx512bw", "avx512_bf16", "f16c"))})
    return model, os.cpu_count(), " ".join(isa)


def run(mib, reps, threads):
    torch.set_num_threads(threads)
    os.environ["HCOMM_KERNEL_THREADS"] = str(threads)
    rows = []
    for size_mib in (mib, 0.25):
        n = int(size_mib * (1 << 20)) // 4 // CHUNK * CHUNK  # fp32 elements of `size_mib`
        table, _ = cases(n)
        for name, (nbytes, torch_fn, hcomm_fn) in table.items():
            tc, tt, th = timeit_rounds([copy_fn(nbytes), torch_fn, hcomm_fn], reps,
                                       settle_s=0.02 if threads > 1 else 0.0)
            rows.append((size_mib, name, nbytes / tt / 1e9, nbytes / th / 1e9, tt / th, tc / th, nbytes / tc / 1e9))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=64)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = run(args.mib, args.reps, args.threads)
    model, cores, isa = machine()
    lines = [
        f"# CPU kernels vs torch, {datetime.date.today().isoformat()}",
        "",
        f"- machine: {model}, {cores} logical cores, ISA flags: {isa}",
        f"- hcomm kernel ISA: {kernels.active_isa()} (best {kernels.best_isa()}), kernel threads "
        f"{hcomm._C.kernels.kernel_threads()}; torch.set_num_threads({args.threads})",
        f"- torch {torch.__version__}, hcomm {hcomm.__version__}; best of {args.reps} round-robin rounds, each a batch of calls lasting >= 2 ms; "
        "GB/s counts bytes read + written",
        "- copy = `dst.copy_(src)` moving the same bytes as the op, timed round-robin with it",
        "- multi-threaded runs idle 20 ms before each sample, so that torch's OpenMP workers (which spin for "
        "milliseconds after an op) do not hold the second core while the next op runs" if args.threads > 1 else
        "- single-threaded: torch and hcomm each use one core",
        "- size = the fp32 input's size (other dtypes: the same element count)",
        "",
        "| size | op | torch GB/s | hcomm GB/s | hcomm vs torch | hcomm % of copy | copy GB/s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size, name, gt, gh, ratio, frac, copy in rows:
        size_s = f"{size:g} MiB"
        lines.append(f"| {size_s} | {name} | {gt:.1f} | {gh:.1f} | {ratio:.2f}x | {100 * frac:.0f}% | {copy:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
