"""A straggler appears mid-run on the emulator: re-splitting on drift vs keeping the plan.

On ``mixed`` (A100 x2 @1.0, V100 x2 @0.5) the auto plan trains twice in one run, with the straggler
watch (``auto``: margin 0.3, 3 steps) and without it (``auto@straggler=0``); both re-split once after 3
steps by measured compute, as the main job does.  When rank 0 prints step ``SLOW_AT`` of a plan, the
launcher cuts rank 0's CPU quota to ``SLOW_SPEED`` of an A100 (``Cluster.set_speed``: a throttled or
shared device); when a plan starts, rank 0 gets its speed back.  Measured per plan: step time before
the slowdown, after it (from ``SLOW_AT + 5`` on: detection plus the re-split), the re-splits, and
the losses (a re-split moves rows, not the global batch, so both runs' losses agree).

``--pp N``: the same with the auto pipeline of N stages per replica, watched (``@straggler=0.3``: a
pipeline re-cuts its layers and moves their state, ``pipeline.restage``) and not; writes
``train-straggler-pp<N>-<date>.md``.

``--zero N`` / ``--tp T``: the same with auto ZeRO-N or auto TP groups of T (watched by default, like
data parallelism: a ZeRO rank runs fewer rounds, only rows move; TP groups move rows as one or, where
the planner predicts it pays for the move, give the slow member a smaller shard, ``tensor.reshard``);
writes ``train-straggler-zero<N>-<date>.md`` / ``train-straggler-tp<T>-<date>.md``.  ``--pp N --tp T``:
a pipeline of TP groups, re-cut as the pipeline of its groups.

``--search``: the same with the joint search's plan (the main job's), without the trial so that both
entries train the search's one best predicted plan: watched as the auto plan of that kind
(``@straggler=0.3``: a pipeline re-cuts or re-splits its replicas' rows, data parallelism re-splits) and
not; writes ``train-straggler-search-<date>.md``.

Writes ``benchmarks/results/train-straggler-<date>.md`` (+ JSON and plot).  Needs root (emulator).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import threading

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
RESULTS = os.path.join(REPO, "benchmarks", "results")
STEPS = 40
SLOW_AT = 12          # progress lines come every STEPS // 10 steps: 1, 4, 8, 12, ...
SLOW_RANK, SLOW_SPEED = 0, 0.25
PLANS = "auto,auto@straggler=0"
PIPELINE_PLANS = "auto@straggler=0.3,auto@straggler=0"
SEARCH_PLANS = "search@trial=0@straggler=0.3,search@trial=0@straggler=0"


class Trigger:
    """The launcher's output stream: echoes rank 0's lines and changes rank 0's speed on its progress."""

    def __init__(self, cluster, log):
        self.cluster, self.log, self.lock = cluster, log, threading.Lock()
        self.events = []

    def write(self, line: str) -> None:
        with self.lock:
            self.log.append(line.rstrip("\n"))
            if " r0] " in line:
                sys.stdout.write(line)
            m = re.search(r"step\s+(\d+)/" + str(STEPS), line)
            if m and " r0] " in line:
                step = int(m.group(1))
                speed = SLOW_SPEED if step >= SLOW_AT else self.cluster.spec.ranks[SLOW_RANK].speed
                self.cluster.set_speed(SLOW_RANK, speed)
                if step in (1, SLOW_AT):
                    self.events.append((step, speed))

    def flush(self) -> None:
        sys.stdout.flush()


def main() -> int:
    from hcomm.emulate.cluster import Cluster
    from hcomm.emulate.launch import run_on

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages per replica (1: data parallelism)")
    parser.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage of the auto plan")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel group size of the auto plan")
    parser.add_argument("--search", action="store_true", help="the joint search's plan instead of auto's")
    args = parser.parse_args()
    pp = args.pp
    if args.search and (pp > 1 or args.zero or args.tp > 1):
        parser.error("--search chooses every dimension: no --pp, --zero or --tp with it")
    plans = SEARCH_PLANS if args.search else PLANS if pp == 1 else PIPELINE_PLANS
    kind = "-search" if args.search else (f"-pp{pp}" if pp > 1 else "") + (f"-zero{args.zero}" if args.zero else "") \
        + (f"-tp{args.tp}" if args.tp > 1 else "")

    date = datetime.date.today().isoformat()
    stem = os.path.join(RESULTS, f"train-straggler{kind}-{date}")
    argv = [sys.executable, "-m", "hcomm.train.worker", "--cluster", "mixed", "--model", "small", "--seq-len", "64",
            "--global-batch", "24", "--steps", str(STEPS), "--plan", plans, "--json", stem + ".json",
            "--plot", stem + ".png", "--pp", str(pp), "--zero", str(args.zero), "--tp", str(args.tp)]
    log: list = []
    with Cluster("mixed") as cluster:
        trigger = Trigger(cluster, log)
        code = run_on(cluster, argv, out=trigger)
    if code != 0:
        print("\n".join(log[-60:]), file=sys.stderr)
        return code
    with open(stem + ".json") as f:
        doc = json.load(f)
    write(doc, trigger.events, stem, date, log, plans)
    return 0


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def write(doc, events, stem: str, date: str, log, plans: str) -> None:
    runs = {r["plan"]["name"]: r for r in doc["runs"]}
    lines = [f"# A straggler appears mid-run: re-split on drift vs keep the plan, {date}", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, torch "
             f"{doc['environment']['torch']}.  Produced by `benchmarks/train/bench_straggler.py` on the emulated "
             f"`mixed` cluster (A100 x2 @1.0, V100 x2 @0.5), model small ({doc['model']['parameters'] / 1e6:.1f}M), "
             f"{STEPS} steps x 24 x 64 tokens; plans `{plans}` (`--pp {doc['args'].get('pp', 1)} --zero "
             f"{doc['args'].get('zero', 0)} --tp {doc['args'].get('tp', 1)}`) in one run.  At step {SLOW_AT} of each "
             f"plan rank {SLOW_RANK}'s CPU quota drops to {SLOW_SPEED} of an A100's.  JSON and plot: "
             f"`{os.path.basename(stem)}.json/.png`.", "",
             "| plan | ms/step before (steps 4-11) | ms/step after (steps 17-40) | slowdown | re-splits (after step: counts) "
             "| loss, last quarter |", "|---|---|---|---|---|---|"]
    after = {}
    for name, run in runs.items():
        secs = [s["seconds"] for s in run["steps"]]
        before, late = _median(secs[3:SLOW_AT - 1]), _median(secs[SLOW_AT + 4:])
        after[name] = late
        splits = [f"{run['resplit'].get('after_steps')}: {run['resplit'].get('to')}"] if run.get("resplit") else []
        splits += [f"{r['after_steps']}: {r['to']} (rank {r['drifted']} {', '.join(f'{d:+.0%}' for d in r['drift'])})"
                   for r in run.get("replans", [])]
        losses = [s["loss"] for s in run["steps"]]
        tail = losses[-len(losses) // 4:]
        lines.append(f"| {name} | {before * 1e3:.0f} | {late * 1e3:.0f} | {late / before:.2f}x | "
                     f"{'; '.join(splits) or '-'} | {sum(tail) / len(tail):.4f} |")
    watched, kept = plans.split(",")
    if watched in after and kept in after:
        lines += ["", f"- after the slowdown, re-planning on drift runs **{after[kept] / after[watched]:.2f}x** "
                      f"the tokens/s of keeping the plan"]
    for name, run in runs.items():
        for r in run.get("replans", []):
            if "moved_s" in r:   # a pipeline re-cut: the state move is outside every step's seconds
                lines.append(f"- {name}: after step {r['after_steps']} {r.get('what', 're-cut')}: the state moved "
                             f"in {r['moved_s']:.2f} s, once (in the tokens/s, not in the ms/step above); "
                             f"predicted step on the plan chosen {r['predicted_ms']:.0f} ms")
            if r.get("phases_s"):   # a TP re-shard: where the move's seconds went on rank 0
                lines.append("  - the move on rank 0: " + ", ".join(f"{k} {v:.2f} s" for k, v in r["phases_s"].items()))
            for o in r.get("options", []):
                lines.append(f"  - option {o['what']}: predicted {o['step_ms']:.0f} ms per step"
                             + (f" + {o['move_s']:.2f} s to move" if o["move_s"] else ""))
    lines += [f"- speed changes applied (progress step, speed of rank {SLOW_RANK}): {events}", "", "```",
              *[line.split("] ", 1)[-1] for line in log if " r0] " in line][-16:], "```"]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {stem}.md")


if __name__ == "__main__":
    sys.exit(main())
