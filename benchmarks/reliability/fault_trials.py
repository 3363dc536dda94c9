"""Fault trials on the emulator: kill, stall or cut during flat, ring and hierarchical all-reduces.

Runs tests/emulate/faultcheck.py (all_reduce in a loop, group timeout 6 s) on the `two-islands` preset
(nodes a0 = ranks 0-1 and b0 = ranks 2-3, shared memory inside a node) once per trial, and after rank 0's
10th good all_reduce applies one fault through ``Cluster.faults()``:

- kill: SIGKILL rank 3;  stop: SIGSTOP rank 3 (killed after the survivors have raised);
- cut: node b0's uplink dropped (restored after the ranks have raised, so torchrun's agents can finish);

over five paths: gloo's own all_reduce (`native`), hcomm's `ring`, `hier`, `hier` with bf16 on the
inter-island tier, and `hier` with the intra tier on gloo instead of shared memory.  Per trial it records
which ranks raised, after how long since their last good all_reduce, with what, and whether any rank
process was left.  Expected: every survivor raises within the 6 s timeout (+3 s slack on two shared
cores): ranks 0-2 for stop, all four for cut; for kill ranks 0-1, and rank 2 either raises or is stopped
by node b0's torchrun agent, which tears down a node's other workers when one dies (it wins the race when
rank 2 waits on shared memory rather than on a socket that reports the close).

    python benchmarks/reliability/fault_trials.py --trials 3 --out benchmarks/results/fault-trials-DATE.md
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from datetime import date

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(REPO, "tests/emulate/faultcheck.py")
TIMEOUT_S, SLACK_S = 6.0, 3.0
LINE = re.compile(r"FAULT (\d) raised ([\d.]+) (\w+): (.*)")
PATHS = {
    "native (gloo)": {"HCOMM_FAULT_ALGO": "native"},
    "ring": {"HCOMM_FAULT_ALGO": "ring"},
    "hier": {"HCOMM_FAULT_ALGO": "hier"},
    "hier + bf16 inter": {"HCOMM_FAULT_ALGO": "hier", "HCOMM_COMPRESS": "bf16"},
    "hier, intra on gloo": {"HCOMM_FAULT_ALGO": "hier", "HCOMM_SHM": "0"},
}
# (action, target, ranks that must raise, ranks that may instead be stopped by their node's torchrun agent,
# which tears down a node's other workers as soon as one of them dies)
FAULTS = {"kill rank 3": ("kill", "3", [0, 1], [2]), "stop rank 3": ("stop", "3", [0, 1, 2], []),
          "cut b0 uplink": ("cut", "b0", [0, 1, 2, 3], [])}


def trial(cluster, path_env, fault, tmp):
    from hcomm.emulate.launch import run_on

    action, target, survivors, optional = fault
    ready = os.path.join(tmp, f"ready-{time.monotonic_ns()}")
    saved = {k: os.environ.get(k) for k in list(path_env) + ["HCOMM_FAULT_READY"]}
    os.environ.update(path_env, HCOMM_FAULT_READY=ready)
    buf, res = io.StringIO(), {}
    try:
        th = threading.Thread(target=lambda: res.setdefault("rc", run_on(cluster, [sys.executable, JOB], out=buf)),
                              daemon=True)
        th.start()
        deadline = time.monotonic() + 120
        while not os.path.exists(ready):
            if time.monotonic() > deadline or not th.is_alive():
                return {"error": "the job never became ready: " + buf.getvalue()[-1500:]}
            time.sleep(0.1)
        f = cluster.faults()
        f.apply(action, target)
        t0 = time.monotonic()
        while len(LINE.findall(buf.getvalue())) < len(survivors) and time.monotonic() - t0 < TIMEOUT_S + SLACK_S + 10:
            time.sleep(0.1)
        if action == "stop":
            f.kill(int(target))
        elif action == "cut":
            f.restore(target)
        th.join(90)
        left = [r for r in range(4) if f.rank_pids(r)]
        for r in left:
            f.kill(r)
        got = {int(r): (float(t), kind, msg) for r, t, kind, msg in LINE.findall(buf.getvalue())}
        return {"got": got, "survivors": survivors, "optional": optional, "left": left,
                "hung_launcher": th.is_alive()}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def summarize(rows):
    lines = ["| path | fault | trials | all survivors raised in time | time to error, s (min / median / max) | "
             "errors seen | processes left |", "|---|---|---:|---:|---|---|---:|"]
    for (path, fault), outs in rows.items():
        ok, times, kinds, left = 0, [], set(), 0
        for o in outs:
            if "error" in o:
                kinds.add("trial failed to start")
                continue
            got = o["got"]
            if set(o["survivors"]) <= set(got) <= set(o["survivors"]) | set(o["optional"]) and \
                    all(t < TIMEOUT_S + SLACK_S for t, _, _ in got.values()):
                ok += 1
            times += [t for t, _, _ in got.values()]
            for _, kind, msg in got.values():
                kinds.add(f"{kind}: {classify(msg)}")
            left += len(o["left"]) + int(o["hung_launcher"])
        t = f"{min(times):.1f} / {statistics.median(times):.1f} / {max(times):.1f}" if times else "-"
        lines.append(f"| {path} | {fault} | {len(outs)} | {ok} of {len(outs)} | {t} | {'; '.join(sorted(kinds))} | {left} |")
    return lines


def classify(msg: str) -> str:
    if "timed out" in msg:
        m = re.search(r"still waiting for (a message from|rank) (\d+)", msg)
        return f"timed out, waiting for rank {m.group(2)}" if m else "timed out"
    if "Connection closed by peer" in msg or "Connection reset" in msg or "closed" in msg:
        return "connection closed by peer"
    return msg[:60]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--cluster", default="two-islands")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    from hcomm.emulate.cluster import Cluster

    tmp = f"/tmp/fault-trials-{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    rows, details = {}, []
    start = time.monotonic()
    with Cluster(a.cluster) as c:
        for path, env in PATHS.items():
            for fname, fault in FAULTS.items():
                for k in range(a.trials):
                    out = trial(c, env, fault, tmp)
                    rows.setdefault((path, fname), []).append(out)
                    summary = out.get("error") or {r: (t, kind) for r, (t, kind, _) in out["got"].items()}
                    details.append(f"- {path}, {fname}, trial {k + 1}: {summary}; left {out.get('left')}")
                    print(details[-1], flush=True)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    text = "\n".join([
        f"# Fault trials on the emulator — {date.today()}", "",
        f"Machine: {platform.node()}, {os.cpu_count()} cores; torch {torch.__version__}; hcomm {rev}; "
        f"cluster `{a.cluster}` (a0: ranks 0-1, b0: ranks 2-3); {a.trials} trials per row; "
        f"{time.monotonic() - start:.0f} s in all.", "",
        "Produced by `benchmarks/reliability/fault_trials.py` (job: `tests/emulate/faultcheck.py`, all_reduce of "
        "4,096 floats in a loop, group timeout 6 s).  'In time': every expected survivor raised within the "
        "timeout + 3 s of its last good all_reduce (ranks 0-2 for stop, all four for cut; for kill ranks 0-1, "
        "while rank 2, on the killed rank's node, may instead be torn down by that node's torchrun agent). 'Processes "
        "left': rank processes still alive after the job, plus launchers still waiting 90 s after the fault.", "",
        *summarize(rows), "", "Every trial (rank: seconds since its last good all_reduce, error type):", "", *details, ""])
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
