"""Capacity: the largest model of the ``small`` family (grown in depth) that trains under hcomm ZeRO-3
with memory-sized shards vs under FSDP2 with even shards, on the same emulated ranks.

The cluster is ``mixed-speed`` (one rank with 2 GiB, one with 1 GiB: memories 2:1).  For each
method, depths are tried up a ladder until one fails, then bisected to a resolution of 4 layers.
Each try is one ``hcomm train`` of 2 steps; a failure is reported as it ended: hcomm's memory
check (before the first step, naming the rank and the bytes by category), the emulator's
memory-limit report (the kernel OOM-killed a rank), or any other error.

Writes ``benchmarks/results/train-zero-capacity-<date>.md``.  Needs root for the emulator.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "benchmarks", "results")
CLUSTER = "mixed-speed"
COMMON = ["--cluster", CLUSTER, "--steps", "2", "--warmup-steps", "1", "--global-batch", "2", "--seq-len", "32",
          "--profile-budget", "2", "--eval-batches", "1", "--dp-shares", "0.5,0.5", "--resplit-after", "0"]
METHODS = {"hcomm ZeRO-3, memory-sized shards": "auto@zero=3",
           "FSDP2, even shards": "uniform@zero=3"}
LADDER = [16, 32, 48, 64, 80, 96, 112, 128, 160]


def params_of(layers: int) -> int:
    sys.path.insert(0, REPO)
    from hcomm.models import get_config, param_count

    config = get_config("small")
    config.n_layers = layers
    return param_count(config, vocab_size=2048)


def try_depth(plan: str, layers: int, tmp: str) -> Tuple[bool, str]:
    model = os.path.join(tmp, f"small-{layers}.yaml")
    with open(model, "w") as f:
        f.write(f"base: small\nn_layers: {layers}\n")
    out = subprocess.run([sys.executable, "-m", "hcomm", "train", "--model", model, "--plan", plan, *COMMON],
                         cwd=REPO, text=True, capture_output=True)
    text = out.stdout + out.stderr
    if out.returncode == 0:
        steps = [line.split("] ", 1)[-1].strip() for line in text.splitlines() if "step    2/2" in line]
        return True, steps[-1] if steps else "trained"
    for key in ("exceeded its", "would need", "does not fit", "error:"):
        lines = [line.split("] ", 1)[-1].strip() for line in text.splitlines() if key in line]
        if lines:
            return False, lines[0][:400]
    return False, f"exit code {out.returncode}: " + text.strip().splitlines()[-1][:300]


def search(plan: str, tmp: str) -> Tuple[int, List[dict]]:
    tried: Dict[int, dict] = {}

    def attempt(layers: int) -> bool:
        ok, how = try_depth(plan, layers, tmp)
        tried[layers] = dict(layers=layers, params=params_of(layers), ok=ok, how=how)
        print(f"  {plan} n_layers={layers} ({tried[layers]['params'] / 1e6:.1f}M): {'ok' if ok else 'FAILED'}: {how}",
              flush=True)
        return ok

    best, failed = 0, None
    for layers in LADDER:
        if attempt(layers):
            best = layers
        else:
            failed = layers
            break
    if failed is not None and best:
        low, high = best, failed
        while high - low > 4:
            mid = (low + high) // 2
            if attempt(mid):
                low = mid
            else:
                high = mid
        best = low
    return best, [tried[k] for k in sorted(tried)]


def main() -> int:
    date = datetime.date.today().isoformat()
    os.makedirs(RESULTS, exist_ok=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, plan in METHODS.items():
            print(f"== {label} ({plan})", flush=True)
            results[label] = search(plan, tmp)
    (hcomm_best, _), (fsdp_best, _) = results.values()
    ratio = params_of(hcomm_best) / params_of(fsdp_best) if fsdp_best and hcomm_best else float("nan")
    lines = [f"# ZeRO-3 capacity on `{CLUSTER}` (memories 2 GiB : 1 GiB), {date}", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}. Produced "
             f"by `benchmarks/train/bench_zero_capacity.py`: `hcomm train {' '.join(COMMON)}` per try, the `small` "
             f"config (dim 384, BPE vocab 2048) grown in depth.", "",
             f"- largest that trains: hcomm ZeRO-3 memory-sized **n_layers {hcomm_best} "
             f"({params_of(hcomm_best) / 1e6:.1f}M)**, FSDP2 even **n_layers {fsdp_best} "
             f"({params_of(fsdp_best) / 1e6:.1f}M)**: **{ratio:.2f}x the parameters** (bar >= 1.4x)", ""]
    for label, (best, tried) in results.items():
        lines += [f"## {label}", "", "| n_layers | parameters | result |", "| --- | --- | --- |"]
        lines += [f"| {t['layers']} | {t['params'] / 1e6:.1f}M | {'ok' if t['ok'] else 'failed'}: "
                  f"{t['how'].replace('|', '/')} |" for t in tried]
        lines.append("")
    path = os.path.join(RESULTS, f"train-zero-capacity-{date}.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(path.replace(".md", ".json"), "w") as f:
        json.dump({k: dict(best=v[0], tried=v[1]) for k, v in results.items()}, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
