"""Per-device precision on the emulator: every rank in its device kind's best dtype vs all fp32.

Each scenario is one ``hcomm train`` run (both plans in the same processes,
same data; ``pipeline`` does the same with 2 pipeline stages): ``mixed`` (A100 x2 in bf16, V100 x2 in fp16 with dynamic loss scaling)
against the same auto plan in fp32.  The issue's bars: loss after N steps
within 2% of the fp32 run; no fp16 rank ever produces a non-finite update
(skipped steps are counted: a skip is the overflow guard working, an
applied non-finite update would show as a non-finite loss); time per step
reported (on CPUs low precision is emulated by slow kernels, so it is a
cost here, not the speed-up it is on tensor cores).

Writes ``benchmarks/results/train-precision-<date>.md`` (+ JSON and plot).
Needs root for the emulator.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dp import SMALL, _runs, _tail_loss, run_scenarios  # noqa: E402

SCENARIOS: Dict[str, dict] = {
    "mixed": dict(cluster="mixed", plan="auto,auto@precision=per-device",
                  args=SMALL + ["--global-batch", "24", "--steps", "30"]),
    # the same across pipeline stages: each replica an A100 stage (bf16) and a V100 stage (fp16)
    "pipeline": dict(cluster="mixed", plan="auto,auto@precision=per-device",
                     args=SMALL + ["--pp", "2", "--global-batch", "24", "--steps", "20"]),
}


def verdicts(name: str, doc: dict) -> List[str]:
    runs = _runs(doc)
    fp32, mixed = runs["auto"], runs["auto@precision=per-device"]
    dtypes = [r.get("compute_dtype", "fp32") for r in mixed["plan"]["ranks"]]
    tail32, tailmx = _tail_loss(fp32), _tail_loss(mixed)
    skipped = [s["step"] for s in mixed["steps"] if s.get("skipped")]
    finite = all(math.isfinite(s["loss"]) for s in mixed["steps"])
    scales = sorted({x for s in mixed["steps"] for x in s.get("loss_scales", [])})
    return [f"compute dtypes per rank: {dtypes}",
            f"loss (mean of the last quarter of {len(mixed['steps'])} steps): per-device {tailmx:.4f} vs fp32 "
            f"{tail32:.4f}: **{(tailmx - tail32) / tail32:+.2%}** (bar within 2%); eval {mixed['eval_loss']:.4f} vs "
            f"{fp32['eval_loss']:.4f}",
            f"non-finite losses: {'none' if finite else 'SOME'}; skipped steps (overflow guard): {skipped or 'none'}; "
            f"loss scales seen: {scales}",
            f"step time: per-device {mixed['measured_step_s'] * 1e3:.0f} ms vs fp32 {fp32['measured_step_s'] * 1e3:.0f} ms "
            f"(**{mixed['measured_step_s'] / fp32['measured_step_s']:.2f}x**; CPU kernels, not tensor cores)"]


def main() -> int:
    return run_scenarios("Per-device precision on the emulator", "bench_precision.py", "train-precision", SCENARIOS,
                         verdicts)


if __name__ == "__main__":
    sys.exit(main())
