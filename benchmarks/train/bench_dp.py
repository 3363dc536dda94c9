"""Heterogeneous data parallelism on the emulator: every claim of the DP issue, side by side.

Each scenario is one ``hcomm train`` run on one emulated cluster: the plans
it compares run in the same processes on the same data, one after another,
so ratios are measured side by side.  Scenarios (``--only NAME`` runs one):

- ``shares``   mixed-speed (1.0 + 0.5): shares by measured speed vs equal shares
               (bar: step time >= 1.35x faster; ideal 1.5x)
- ``buckets-two-islands``, ``buckets-mixed``: the cost model's bucket vs a measured
               sweep of 1, 4, 16, 64, 256 MiB (bar: within 10% of the best)
- ``vs-ddp``   two-islands: hcomm DP vs torch DDP over gloo at its defaults, and
               with bf16 on the inter-island tier (bars: <= 0.75x and <= 0.6x step time)
- ``outer``    two-islands: cross-island sync every 8 steps (plain and overlapped) vs fully synchronous
               (bars: tokens/s >= 3x, loss at equal tokens within 3%)
- ``main``     the main job: auto vs uniform on mixed

Writes ``benchmarks/results/train-dp-<date>.md`` (and one JSON + PNG per
scenario) with machine and versions.  Needs root for the emulator.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "benchmarks", "results")
SMALL = ["--model", "small", "--seq-len", "64"]

SCENARIOS: Dict[str, dict] = {
    "shares": dict(cluster="mixed-speed", plan="auto,equal", args=SMALL + ["--global-batch", "12", "--steps", "10"]),
    "buckets-two-islands": dict(
        cluster="two-islands", args=SMALL + ["--global-batch", "16", "--steps", "8"],
        plan="auto,equal@bucket_mb=1,equal@bucket_mb=4,equal@bucket_mb=16,equal@bucket_mb=64,equal@bucket_mb=256"),
    "buckets-mixed": dict(
        cluster="mixed", args=SMALL + ["--global-batch", "24", "--steps", "8"],
        plan="auto,auto@bucket_mb=1,auto@bucket_mb=4,auto@bucket_mb=16,auto@bucket_mb=64,auto@bucket_mb=256"),
    "vs-ddp": dict(cluster="two-islands", plan="equal,equal@compress=bf16,uniform",
                   args=SMALL + ["--global-batch", "16", "--steps", "10"]),
    "outer": dict(cluster="two-islands", plan="equal@sync_every=8@overlap=1,equal@sync_every=8,equal",
                  args=SMALL + ["--global-batch", "8", "--steps", "40"]),
    "main": dict(cluster="mixed", plan="auto,uniform", args=[]),
}


def run(name: str, spec: dict, date: str, prefix: str = "train-dp") -> dict:
    stem = os.path.join(RESULTS, f"{prefix}-{name}-{date}")
    cmd = [sys.executable, "-m", "hcomm", "train", "--cluster", spec["cluster"], "--plan", spec["plan"],
           *spec["args"], "--json", stem + ".json", "--plot", stem + ".png"]
    print(f"== {name}: {' '.join(cmd[3:])}", flush=True)
    out = subprocess.run(cmd, cwd=REPO, text=True, capture_output=True)
    table = [line.split("] ", 1)[-1] for line in out.stdout.splitlines() if "[" in line and " r0] " in line]
    print("\n".join(table[-14:]), flush=True)
    if out.returncode != 0:
        print(out.stdout[-3000:], out.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{name} failed with exit code {out.returncode}")
    with open(stem + ".json") as f:
        doc = json.load(f)
    doc["log_tail"] = table[-14:]
    return doc


def _runs(doc) -> Dict[str, dict]:
    return {r["plan"]["name"]: r for r in doc["runs"]}


def _tail_loss(run) -> float:
    losses = [s["loss"] for s in run["steps"]]
    tail = losses[-max(1, len(losses) // 4):]
    return sum(tail) / len(tail)


def verdicts(name: str, doc: dict) -> List[str]:
    runs = _runs(doc)
    step = {k: v["measured_step_s"] for k, v in runs.items()}
    out = []
    if name == "shares":
        ratio = step["equal"] / step["auto"]
        counts = [s["batch_share"] for s in runs["auto"]["plan"]["ranks"]]
        # The ideal from what the ranks really computed in the equal run: per-sample seconds t_r,
        # balanced compute N / sum(1/t_r) against the equal split's slowest rank.
        eq = runs["equal"]
        n = eq["plan"]["global_batch"] // len(eq["plan"]["ranks"])
        per_rank = [sum(s["ranks"][r]["compute_s"] for s in eq["steps"][2:]) / len(eq["steps"][2:])
                    for r in range(len(eq["plan"]["ranks"]))]
        per_sample = [c / n for c in per_rank]
        ideal = max(per_rank) / (eq["plan"]["global_batch"] / sum(1 / t for t in per_sample))
        out.append(f"equal / speed shares step time: **{ratio:.2f}x** (bar >= 1.35x; shares "
                   f"{[round(c, 3) for c in counts]}); measured per-sample compute "
                   f"{[round(t * 1e3) for t in per_sample]} ms, i.e. a speed ratio of "
                   f"{max(per_sample) / min(per_sample):.1f} (the spec says 2), so the compute-only ideal is "
                   f"{ideal:.2f}x")
    elif name.startswith("buckets"):
        sweep = {k: v for k, v in step.items() if "bucket_mb" in k}
        best = min(sweep, key=sweep.get)
        auto = runs["auto"]
        chosen = auto["plan"]["groups"][0].get("bucket_bytes", 25 << 20) / 2**20
        out.append(f"auto ({chosen:g} MiB buckets, predicted {auto['predicted_step_s'] * 1e3:.0f} ms) measured "
                   f"{step['auto'] * 1e3:.0f} ms; best of the sweep {best} {sweep[best] * 1e3:.0f} ms: "
                   f"**{step['auto'] / sweep[best]:.2f}x** the best (bar <= 1.10x)")
        out.append("sweep: " + ", ".join(f"{k.split('=')[1]} MiB {v * 1e3:.0f} ms" for k, v in sweep.items()))
    elif name == "vs-ddp":
        out.append(f"hcomm / DDP-gloo step time: **{step['equal'] / step['uniform']:.2f}x** (bar <= 0.75x); "
                   f"with bf16 inter tier **{step['equal@compress=bf16'] / step['uniform']:.2f}x** (bar <= 0.6x)")
    elif name == "outer":
        sync = runs["equal"]
        for label in ("equal@sync_every=8", "equal@sync_every=8@overlap=1"):
            outer = runs[label]
            gap = (_tail_loss(outer) - _tail_loss(sync)) / _tail_loss(sync)
            out.append(f"{label} vs every step: tokens/s **{outer['tokens_per_s'] / sync['tokens_per_s']:.2f}x** "
                       f"(bar >= 3x); loss at equal tokens {_tail_loss(outer):.4f} vs {_tail_loss(sync):.4f} "
                       f"(**{gap:+.2%}**, bar within 3%); eval {outer['eval_loss']:.4f} vs {sync['eval_loss']:.4f}")
    elif name == "main":
        auto, uni = runs["auto"], runs["uniform"]
        out.append(f"auto / uniform tokens/s: **{auto['tokens_per_s'] / uni['tokens_per_s']:.2f}x**; loss at equal "
                   f"tokens {_tail_loss(auto):.4f} vs {_tail_loss(uni):.4f}; eval {auto['eval_loss']:.4f} vs "
                   f"{uni['eval_loss']:.4f}")
    for k, v in runs.items():
        pred = v["predicted_step_s"]
        if pred == pred:  # not NaN
            out.append(f"{k}: predicted {pred * 1e3:.0f} ms, measured {v['measured_step_s'] * 1e3:.0f} ms "
                       f"({(pred - v['measured_step_s']) / v['measured_step_s']:+.0%})")
    return out


def run_scenarios(title: str, script: str, prefix: str, scenarios: Dict[str, dict], verdicts_of) -> int:
    """The command line of a scenario benchmark: run ``--only`` these (or all), one dated markdown."""
    p = argparse.ArgumentParser(description=title)
    p.add_argument("--only", action="append", choices=sorted(scenarios), help="run only these scenarios")
    args = p.parse_args()
    date = datetime.date.today().isoformat()
    os.makedirs(RESULTS, exist_ok=True)
    names = args.only or list(scenarios)
    lines = [f"# {title}, {date}", "",
             f"Machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores; "
             f"Python {platform.python_version()}.  Produced by `benchmarks/train/{script}`; "
             "every scenario is one `hcomm train` run (plans side by side in the same processes, same data).", ""]
    path = os.path.join(RESULTS, f"{prefix}-{date}.md" if not args.only else f"{prefix}-{'-'.join(names)}-{date}.md")
    for name in names:
        doc = run(name, scenarios[name], date, prefix=prefix)
        env = doc["environment"]
        lines += [f"## {name}: `{scenarios[name]['cluster']}`, plans `{scenarios[name]['plan']}`", "",
                  f"torch {env['torch']}, hcomm {env['hcomm']}, model {doc['model']['name']} "
                  f"({doc['model']['parameters'] / 1e6:.1f}M parameters), data {doc['data']['source']}; "
                  f"JSON and plot: `{prefix}-{name}-{date}.json/.png`", ""]
        lines += [f"- {v}" for v in verdicts_of(name, doc)]
        lines += ["", "```", *doc["log_tail"], "```", ""]
        with open(path, "w") as f:   # after every scenario: a later failure keeps what was measured
            f.write("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


def main() -> int:
    return run_scenarios("Heterogeneous data parallelism on the emulator", "bench_dp.py", "train-dp", SCENARIOS,
                         verdicts)


if __name__ == "__main__":
    sys.exit(main())
