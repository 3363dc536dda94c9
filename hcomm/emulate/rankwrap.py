"""What torchrun starts for each rank: cgroup, emulated-hardware env, output prefix.

torchrun spawns the workers itself, so the launcher runs torchrun with
``--no-python python -m hcomm.emulate.rankwrap -- USER COMMAND``.  For its
``RANK`` this wrapper

* checks the rank torchrun assigned matches the spec's node order,
* exports the rank's ``HCOMM_EMU_DEVICE`` / ``_SPEED`` / ``_MEMORY`` (the node's
  ``HCOMM_EMU_NODE`` / ``_ISLAND`` / ``_VENDOR`` / ``_CLUSTER`` and
  ``GLOO_SOCKET_IFNAME`` come from the launcher),
* starts the user command as a child that moves itself into the rank's
  cgroups *before* ``exec`` (so not a byte of it escapes the memory limit,
  while this wrapper's own few MB stay outside),
* keeps the job's threads but its computing one outside the CPU quota
  (``host_threads``: communication runs on the emulated host),
* prefixes each output line with ``[node rN]``,
* records how the child ended (exit code or signal, and a time stamp) in the
  run folder, so the launcher can name the *first* failing rank and tell a
  memory-limit kill from any other SIGKILL, and exits the same way.

SIGTERM/SIGINT from torchrun are forwarded to the child.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import List

from hcomm.emulate import cgroups, host_threads
from hcomm.emulate.spec import load_file
from hcomm.settings import declare

HCOMM_EMU_NODE = declare("HCOMM_EMU_NODE", "", "emulated node of this rank (set by hcomm emulate run)")
HCOMM_EMU_ISLAND = declare("HCOMM_EMU_ISLAND", "", "island of this rank (set by hcomm emulate run)")
HCOMM_EMU_VENDOR = declare("HCOMM_EMU_VENDOR", "", "vendor library label of this rank's island, e.g. nccl, hccl, gloo (set by hcomm emulate run)")
HCOMM_EMU_DEVICE = declare("HCOMM_EMU_DEVICE", "", "emulated device kind of this rank, e.g. A100, 910B (set by hcomm emulate run)")
HCOMM_EMU_SPEED = declare("HCOMM_EMU_SPEED", 1.0, "relative compute speed of this rank, 0 < s <= 1 (set by hcomm emulate run)")
HCOMM_EMU_MEMORY = declare("HCOMM_EMU_MEMORY", 0, "emulated device memory of this rank in bytes; its cgroup memory limit (set by hcomm emulate run)")
HCOMM_EMU_CLUSTER = declare("HCOMM_EMU_CLUSTER", "", "path of the resolved cluster spec (YAML: bandwidth in B/s, latency one-way per uplink) (set by hcomm emulate run)")
HCOMM_EMU_RUN = declare("HCOMM_EMU_RUN", "", "run id of the emulated cluster; empty with --unshaped (set by hcomm emulate run, internal)")
HCOMM_EMU_DEFER_QUOTA = declare(
    "HCOMM_EMU_DEFER_QUOTA", 0,
    "1: each rank starts outside its CPU quota (memory limit and core from the start) and joins it itself "
    "through hcomm.emulate.rankwrap.enter_cpu_quota; hcomm train sets it and joins before any rank computes "
    "(set by the launcher, internal)", kind=int)


def exit_record_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"rank{rank}.exit.json")


def enter_cpu_quota() -> bool:
    """Move this rank into its CPU quota, where the launcher deferred it (``HCOMM_EMU_DEFER_QUOTA``);
    False where there is nothing to do (not emulated, not deferred).

    The quota stands for the emulated *device's* speed.  A rank's start-up -- the interpreter, torch and
    the run's modules, ~2.5 s of CPU for ``hcomm train`` -- is host work, which a real node does at its
    host CPU's speed whatever its accelerator; under a quarter-core quota it took 10 s of every emulated
    launch.  A caller joins before it measures or computes anything, so nothing measured runs outside."""
    run_id = HCOMM_EMU_RUN.get()
    if not (run_id and HCOMM_EMU_DEFER_QUOTA.get()):
        return False
    rank = int(os.environ["RANK"])
    cgroups.join(run_id, rank, controllers=("cpu",))
    if not cgroups.in_cgroup(run_id, rank, "cpu"):
        raise RuntimeError(f"hcomm emulate: rank {rank} could not enter its CPU quota (cgroup of run {run_id})")
    return True


def leave_cpu_quota() -> None:
    """Out of the CPU quota again once the rank's work is done (deferred quotas only): the interpreter's
    exit with torch loaded is host work too (1.3 s at a quarter core, 3.2 s at an eighth)."""
    if HCOMM_EMU_RUN.get() and HCOMM_EMU_DEFER_QUOTA.get():
        cgroups.leave("cpu")


def _pump(src, dst, prefix: bytes) -> None:
    for line in iter(src.readline, b""):
        dst.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
        dst.flush()


def main(argv: List[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("hcomm.emulate.rankwrap: no command given", file=sys.stderr)
        return 2
    spec_path = HCOMM_EMU_CLUSTER.get()
    run_id = HCOMM_EMU_RUN.get()
    spec = load_file(spec_path)
    rank = int(os.environ["RANK"])
    node = spec.nodes[[n.name for n in spec.nodes].index(HCOMM_EMU_NODE.get())]
    me = node.ranks[int(os.environ["LOCAL_RANK"])]
    if me.rank != rank:
        print(f"hcomm emulate: torchrun gave node {node.name} local rank "
              f"{os.environ['LOCAL_RANK']} global RANK={rank}, but the spec numbers it "
              f"{me.rank}; refusing to run with a rank order that differs from the spec",
              file=sys.stderr)
        return 3
    env = dict(os.environ)
    env.update(HCOMM_EMU_DEVICE=me.device, HCOMM_EMU_SPEED=repr(me.speed),
               HCOMM_EMU_MEMORY=str(me.memory_bytes))

    # Deferred: the CPU quota waits for the rank's own call (``enter_cpu_quota``); the memory limit and
    # the core hold from the first byte either way.
    deferred = bool(HCOMM_EMU_DEFER_QUOTA.get()) and bool(run_id)
    controllers = tuple(c for c in cgroups.CONTROLLERS if not (deferred and c == "cpu"))

    def _enter_cgroup() -> None:  # runs in the child between fork and exec
        if run_id:
            cgroups.join(run_id, rank, controllers=controllers)

    prefix = f"[{node.name} r{rank}] ".encode()
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=_enter_cgroup)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: child.send_signal(s))
    if run_id and host_threads.mode() == "host":   # communication threads run on the emulated host
        host_threads.start_sweeper(run_id, rank, child.pid)
    pumps = [threading.Thread(target=_pump, args=(child.stdout, sys.stdout.buffer, prefix)),
             threading.Thread(target=_pump, args=(child.stderr, sys.stderr.buffer, prefix))]
    for t in pumps:
        t.daemon = True
        t.start()
    code = child.wait()
    ended = time.time()
    for t in pumps:
        t.join(timeout=5)
    record = {"rank": rank, "node": node.name, "returncode": code, "time": ended,
              "oom_kills": cgroups.oom_kills(run_id, rank) if run_id else 0,
              "max_usage": cgroups.max_usage(run_id, rank) if run_id else 0}
    run_dir = os.path.dirname(spec_path)
    with open(exit_record_path(run_dir, rank), "w") as f:
        json.dump(record, f)
    if code < 0:  # die the same way so torchrun reports the real signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
