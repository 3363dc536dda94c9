"""Uneven tensor parallelism on the emulator: shards by measured speed vs Megatron's even shards.

One scenario, one ``hcomm train`` run (both plans in the same processes, same
data): ``mixed-speed`` (1.0 / 0.5), one TP group of 2, the ``small`` model:
``auto`` (heads, MLP features and vocabulary split by measured speed) vs
``uniform`` (equal shards), both on hcomm's TP runtime; DDP over gloo without
TP (``uniform@tp=1``) for reference; ``auto@sp=1`` adds sequence parallelism
(uneven sequence slices in the norm/residual regions: same bytes moved as
reduce-scatter + all-gather instead of all-reduce, less activation memory).  The issue's bar: >= 1.3x faster (the
compute-only ideal is 1.5x here less the communication, which both splits
pay equally).  Writes ``benchmarks/results/train-tp-<date>.md`` (+ JSON and
plot).  Needs root for the emulator.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dp import SMALL, _runs, run_scenarios  # noqa: E402

SCENARIOS: Dict[str, dict] = {
    "mixed-speed": dict(cluster="mixed-speed", plan="auto,uniform,uniform@tp=1,auto@sp=1",
                        args=SMALL + ["--tp", "2", "--global-batch", "24", "--steps", "10"]),
    # A pipeline of TP groups on the default cluster: each island's pair is one TP group (TP on the fast
    # links), the two groups are the stages; auto splits the layers by the groups' speeds (the A100 pair
    # is twice as fast), uniform is Megatron's (equal layers, equal shards).  DDP without either for reference.
    "mixed-pp-tp": dict(cluster="mixed", plan="auto,uniform,uniform@pp=1@tp=1",
                        args=SMALL + ["--pp", "2", "--tp", "2", "--global-batch", "24", "--steps", "10"]),
}


def verdicts(name: str, doc: dict) -> List[str]:
    runs = _runs(doc)
    step = {k: v["measured_step_s"] for k, v in runs.items()}
    if name == "mixed-pp-tp":
        out = [f"pipeline of TP groups, planned (auto) vs Megatron's split (uniform): "
               f"**{step['uniform'] / step['auto']:.2f}x** faster; vs DDP without TP or pipeline: "
               f"{step['uniform@pp=1@tp=1'] / step['auto']:.2f}x"]
    else:
        out = [f"uneven (auto) vs even (uniform) shards: **{step['uniform'] / step['auto']:.2f}x** faster "
               f"(bar >= 1.3x)"]
    for k, v in runs.items():
        fr = [r.get("tp_fraction", 1.0) for r in v["plan"]["ranks"]]
        pred = v["predicted_step_s"]
        pred_text = f"predicted {pred * 1e3:.0f} ms ({(pred - step[k]) / step[k]:+.0%}), " if pred == pred else ""
        per_rank = [round(sum(s["ranks"][r]["compute_s"] for s in v["steps"][2:]) / max(1, len(v["steps"]) - 2) * 1e3)
                    for r in range(len(fr))]
        out.append(f"`{k}`: TP fractions {fr}, {pred_text}measured {step[k] * 1e3:.0f} ms, compute per rank "
                   f"{per_rank} ms, last loss {v['steps'][-1]['loss']:.4f}")
    return out


def main() -> int:
    return run_scenarios("Uneven tensor parallelism on the emulator", "bench_tp.py", "train-tp", SCENARIOS, verdicts)


if __name__ == "__main__":
    sys.exit(main())
