"""The CPU kernel benchmark still runs and measures what it says (a tiny
size, one round): every op appears for both sizes with finite, positive
speeds, so the benchmark cannot rot between the sessions that run it."""
import importlib.util
import math
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels" / "bench_cpu_kernels.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_cpu_kernels", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_rows_cover_every_op_at_both_sizes(monkeypatch):
    bench = load_bench()
    # run() sets torch's threads and HCOMM_KERNEL_THREADS; give both back after.
    monkeypatch.setenv("HCOMM_KERNEL_THREADS", "1")
    threads = torch.get_num_threads()
    try:
        rows = bench.run(mib=1, reps=1, threads=1)
    finally:
        torch.set_num_threads(threads)
    names = {name for _, name, *_ in rows}
    assert {"add bf16", "add fp32", "cast fp32->bf16", "quantize fp32->e4m3/1024",
            "dequant-accumulate e4m3->fp32"} <= names
    assert {size for size, *_ in rows} == {1, 0.25}
    assert len(rows) == 2 * len(names)
    for row in rows:
        for value in row[2:]:
            assert math.isfinite(value) and value > 0, row


def test_round_robin_batches_small_calls():
    bench = load_bench()
    calls = [0, 0]

    def fast():
        calls[0] += 1

    def slow():
        calls[1] += 1
        sum(range(2000))

    best = bench.timeit_rounds([fast, slow], reps=3, min_sample_s=1e-3)
    # Both fns get the same batch, sized so a sample of the slower lasts >= 1 ms.
    assert calls[0] == calls[1] > 3 + 3
    assert best[0] < best[1]
