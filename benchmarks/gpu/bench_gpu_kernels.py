"""CUDA kernels vs a device-to-device copy of the same bytes, and vs torch.

Each op's bandwidth = (bytes read + written) / median time of CUDA-event
timed launches; "% copy" divides it by the bandwidth of ``dst.copy_(src)``
moving the same number of bytes (a copy of half as many), timed in the same
run.  The issue's bar is 80% of copy bandwidth on the H200.

    python3 benchmarks/gpu/bench_gpu_kernels.py [--mib 1024] [--reps 50] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics

import torch

import hcomm
from hcomm import kernels

CHUNK = 1024


def cuda_time(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def copy_of(nbytes):
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def cases(n):
    f32 = torch.randn(n, device="cuda")
    bf, f16 = f32.bfloat16(), f32.half()
    a_bf, a_f32 = bf.clone(), f32.clone()
    d_bf = torch.empty_like(bf)
    d_f32 = torch.empty_like(f32)
    d_f16 = torch.empty_like(f16)
    q, s = kernels.quantize_fp8(f32, "e4m3", CHUNK)
    qv = q.view(torch.float8_e4m3fn).view(-1, CHUNK)
    return {
        "add bf16": (3 * bf.nbytes, lambda: a_bf.add_(bf), lambda: kernels.reduce_into(a_bf, bf, "sum")),
        "add fp32": (3 * f32.nbytes, lambda: a_f32.add_(f32), lambda: kernels.reduce_into(a_f32, f32, "sum")),
        "cast fp32->bf16": (f32.nbytes + bf.nbytes, lambda: d_bf.copy_(f32),
                            lambda: kernels.cast(f32, torch.bfloat16, out=d_bf)),
        "cast bf16->fp32": (f32.nbytes + bf.nbytes, lambda: d_f32.copy_(bf),
                            lambda: kernels.cast(bf, torch.float32, out=d_f32)),
        "cast fp32->fp16": (f32.nbytes + f16.nbytes, lambda: d_f16.copy_(f32),
                            lambda: kernels.cast(f32, torch.float16, out=d_f16)),
        "quantize fp32->e4m3/1024": (f32.nbytes + n + 4 * (n // CHUNK), lambda: (
            f32.view(-1, CHUNK) / (f32.view(-1, CHUNK).abs().amax(1, keepdim=True) / 448.0)).to(torch.float8_e4m3fn),
            lambda: kernels.quantize_fp8(f32, "e4m3", CHUNK)),
        "dequantize e4m3->bf16": (n + bf.nbytes, lambda: d_bf.view(-1, CHUNK).copy_(qv.float() * s[:, None]),
                                  lambda: kernels.dequantize_fp8(q, s, "e4m3", CHUNK, torch.bfloat16)),
        "dequant-accumulate e4m3->fp32": (n + 2 * f32.nbytes, lambda: a_f32.view(-1, CHUNK).add_(qv.float() * s[:, None]),
                                          lambda: kernels.dequantize_accumulate(a_f32, q, s, "e4m3", CHUNK, "sum")),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=1024, help="size of the fp32 input")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    n = int(args.mib * (1 << 20)) // 4 // CHUNK * CHUNK
    rows = []
    for name, (nbytes, torch_fn, hcomm_fn) in cases(n).items():
        tc = cuda_time(copy_of(nbytes), args.reps)
        tt = cuda_time(torch_fn, args.reps)
        th = cuda_time(hcomm_fn, args.reps)
        rows.append((name, nbytes / tc / 1e9, nbytes / tt / 1e9, nbytes / th / 1e9, tc / th, tt / th))
    prop = torch.cuda.get_device_properties(0)
    lines = [
        f"# GPU kernels, {datetime.date.today().isoformat()}",
        "",
        f"- device: {prop.name}, {prop.multi_processor_count} SMs, {prop.total_memory / 2**30:.0f} GiB; "
        f"torch {torch.__version__} (CUDA {torch.version.cuda}); hcomm {hcomm.__version__}",
        f"- fp32 input {args.mib:g} MiB; median of {args.reps} CUDA-event timed launches; GB/s counts read + write",
        "- copy = `dst.copy_(src)` moving the same bytes, same run; bar: hcomm >= 80% of copy",
        "",
        "| op | copy GB/s | torch GB/s | hcomm GB/s | hcomm % of copy | hcomm vs torch |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, gc, gt, gh, frac, ratio in rows:
        lines.append(f"| {name} | {gc:.0f} | {gt:.0f} | {gh:.0f} | {100 * frac:.0f}% | {ratio:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
