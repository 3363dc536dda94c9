"""Heterogeneous ZeRO on the emulator: the issue's prefetch and torch-comparison claims, side by side.

Each scenario is one ``hcomm train`` run (plans one after another in the
same processes, same data):

- ``prefetch``  two-islands, ZeRO-3 even flat shards: prefetch 2 vs on demand (bar: <= 0.8x step time)
- ``prefetch-island``  the same with the island layout and twice the batch (compute to hide gathers behind)
- ``vs-fsdp2``  two-islands, hcomm ZeRO-3 on an even split vs FSDP2 over gloo on the same ranks
                (bar: <= 1.0x step time)
- ``island``    mixed, island layout: ZeRO-3 with prefetch vs ZeRO-1 (bar: within 15% of ZeRO-1)
- ``aggregation``  mixed, ZeRO-3: the V100s aggregation-only (batch share 0: they hold shards, reduce
                and serve parameters, never compute) vs the V100s computing their speed share

Writes ``benchmarks/results/train-zero-<date>.md`` (+ JSON and plot per
scenario).  Needs root for the emulator.  The capacity search is
``bench_zero_capacity.py``.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dp import SMALL, _runs, run_scenarios  # noqa: E402

SCENARIOS: Dict[str, dict] = {
    "prefetch": dict(cluster="two-islands", plan="equal@zero=3@prefetch=2,equal@zero=3@prefetch=0",
                     args=SMALL + ["--global-batch", "48", "--steps", "8", "--profile-budget", "4",
                                   "--zero-layout", "flat"]),
    "prefetch-island": dict(cluster="two-islands", plan="equal@zero=3@prefetch=2,equal@zero=3@prefetch=0",
                            args=SMALL + ["--global-batch", "32", "--steps", "8", "--profile-budget", "4",
                                          "--zero-layout", "island"]),
    "vs-fsdp2": dict(cluster="two-islands", plan="equal@zero=3@prefetch=2,uniform@zero=3",
                     args=SMALL + ["--global-batch", "16", "--steps", "8", "--profile-budget", "4",
                                   "--zero-layout", "flat"]),
    "aggregation": dict(cluster="mixed", plan="auto@zero=3@shares=0.5:0.5:0:0,auto@zero=3",
                        args=SMALL + ["--global-batch", "24", "--steps", "8", "--profile-budget", "4",
                                      "--zero-layout", "flat"]),
    "island": dict(cluster="mixed", plan="auto@zero=3@prefetch=2,auto@zero=1",
                   args=SMALL + ["--global-batch", "24", "--steps", "8", "--zero-layout", "island",
                                 "--profile-budget", "4"]),
}


def verdicts(name: str, doc: dict) -> List[str]:
    runs = _runs(doc)
    step = {k: v["measured_step_s"] for k, v in runs.items()}
    names = list(runs)
    out = []
    if name == "aggregation":
        for k, v in runs.items():
            fr = [r.get("shard_fraction") for r in v["plan"]["ranks"]]
            out.append(f"{k}: samples per rank {v['counts']}, shard fractions {fr}")
        out.append(f"V100s aggregation-only / V100s computing step time: "
                   f"**{step[names[0]] / step[names[1]]:.2f}x**")
    if name.startswith("prefetch"):
        out.append(f"ZeRO-3 prefetch 2 / on demand step time: **{step[names[0]] / step[names[1]]:.2f}x** (bar <= 0.8x)")
    elif name == "vs-fsdp2":
        out.append(f"hcomm ZeRO-3 / FSDP2-gloo step time: **{step[names[0]] / step[names[1]]:.2f}x** (bar <= 1.0x)")
    elif name == "island":
        out.append(f"ZeRO-3 (island layout, prefetch 2) / ZeRO-1 step time: **{step[names[0]] / step[names[1]]:.2f}x** "
                   f"(bar <= 1.15x)")
    for k, v in runs.items():
        loss = v["steps"][-1]["loss"]
        zero = [s["ranks"][0].get("zero", {}) for s in v["steps"][2:]]
        extra = ""
        if zero and zero[0]:
            extra = (f"; rank 0 per step: exposed {sum(z['exposed_s'] for z in zero) / len(zero) * 1e3:.0f} ms, "
                     f"overlapped {sum(z['overlapped_s'] for z in zero) / len(zero) * 1e3:.0f} ms, gathered "
                     f"{zero[0]['gather_bytes'] / 2**20:.1f} MiB")
        pred = v["predicted_step_s"]
        pred_text = f"predicted {pred * 1e3:.0f} ms ({(pred - step[k]) / step[k]:+.0%}), " if pred == pred else ""
        out.append(f"{k}: {pred_text}measured {step[k] * 1e3:.0f} ms, last loss {loss:.4f}{extra}")
    return out


def main() -> int:
    return run_scenarios("Heterogeneous ZeRO on the emulator", "bench_zero.py", "train-zero", SCENARIOS, verdicts)


if __name__ == "__main__":
    sys.exit(main())
