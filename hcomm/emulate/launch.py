"""``run(spec, argv)``: one torchrun per emulated node, inside its namespace.

Rendezvous is torchrun's c10d backend at node 0's uplink address.  Each
torchrun gets ``--local-addr`` = its node's address; c10d orders nodes by that
string and the addresses are chosen so string order is spec order (see
:func:`hcomm.emulate.netns.node_ip`), so global ranks follow the spec; the
rank wrapper refuses to run if they do not.

Output: rank lines arrive prefixed ``[node rN]`` by the wrapper; the agents'
own lines are prefixed ``[node torchrun]`` here.  When any node fails, the
others get a grace period to fail on their own (a dead peer breaks their
collectives) and are then terminated.  The exit code is the first failing
rank's (by the time its process ended; 128+signal for a signal), and the
launcher says which rank failed and why.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple, Union

from hcomm.emulate.bootstrap import module_command
from hcomm.emulate.cluster import Cluster, _env_with_hcomm
from hcomm.emulate.spec import ClusterSpec
from hcomm.emulate.units import fmt_memory
from hcomm.settings import declare

HCOMM_EMU_PORT = declare("HCOMM_EMU_PORT", 29400,
                         "TCP port of the c10d rendezvous on node 0 of an emulated cluster")
HCOMM_EMU_GRACE = declare("HCOMM_EMU_GRACE", 10.0,
                          "seconds the other nodes get to stop after one emulated node failed")

_UNSHAPED_BANNER = """\
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!! hcomm emulate --unshaped: every node runs on localhost.                 !!
!! Links, latencies, compute speeds and memory limits are NOT emulated;   !!
!! only the rank layout and the HCOMM_EMU_* variables are.                 !!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"""


def node_command(cluster: Cluster, node_index: int, argv: List[str], port: int, max_restarts: int = 0) -> List[str]:
    spec = cluster.spec
    node = spec.nodes[node_index]
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={len(spec.nodes)}", f"--nproc-per-node={len(node.ranks)}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={cluster.ip(0)}:{port}", f"--rdzv-id=hce-{cluster.run_id}",
        # Say who hosts the store: torchrun's guess compares the endpoint with
        # the host name, which knows nothing of the namespaces' addresses.
        f"--rdzv-conf=is_host={1 if node_index == 0 else 0}",
        f"--local-addr={cluster.local_addr(node_index)}",
        # Elastic restarts (hcomm train --max-restarts with --checkpoint-every):
        # a failed rank restarts every rank, which resume from a checkpoint.
        f"--max-restarts={max_restarts}", "--no-python",
        *module_command("hcomm.emulate.rankwrap"), "--"] + list(argv)


def node_env(cluster: Cluster, node_index: int, defer_quota: bool = False) -> Dict[str, str]:
    node = cluster.spec.nodes[node_index]
    env = _env_with_hcomm(os.environ)
    # a command that enters its CPU quota itself once started (rankwrap.enter_cpu_quota)
    env["HCOMM_EMU_DEFER_QUOTA"] = "1" if defer_quota else "0"
    env.update(HCOMM_EMU_NODE=node.name, HCOMM_EMU_ISLAND=node.island,
               HCOMM_EMU_VENDOR=node.vendor, HCOMM_EMU_CLUSTER=cluster.spec_path,
               HCOMM_EMU_RUN="" if cluster.unshaped else cluster.run_id,
               GLOO_SOCKET_IFNAME=cluster.ifname(node_index))
    # One thread per rank unless the user says otherwise: the speed quotas
    # assume a rank does not spread over cores it does not own.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _ranks_ended(run_dir: str, ranks: List[int]) -> bool:
    """Whether every one of ``ranks`` has left an exit record, whatever its code."""
    return all(os.path.exists(os.path.join(run_dir, f"rank{rank}.exit.json")) for rank in ranks)


def _ranks_succeeded(run_dir: str, ranks: List[int]) -> bool:
    """Whether every one of ``ranks`` has left an exit record of 0 (rankwrap writes it as a rank ends)."""
    for rank in ranks:
        try:
            with open(os.path.join(run_dir, f"rank{rank}.exit.json")) as f:
                if json.load(f)["returncode"] != 0:
                    return False
        except (OSError, ValueError, KeyError):
            return False
    return True


def _pump(stream, node_name: str, out, proc: Optional[subprocess.Popen] = None,
          succeeded: Optional[Callable[[], bool]] = None, stopped: Optional[set] = None,
          node_index: int = -1) -> None:
    """Copies a node's output, the agent's own lines prefixed ``[node torchrun]``.  What the agent says
    after every rank of its node succeeded is held back and dropped if the agent then exits 0: it is its
    rendezvous shutdown racing node 0's agent, which hosts the store and may have gone already (a C++
    ``recvVector failed`` trace and "failed to shutdown the rendezvous"); the job is over and fine.  So is
    what an agent says after the launcher stopped it (its node in ``stopped``: its ranks had all ended)."""
    marker = f"[{node_name} r"
    late: List[str] = []
    for line in iter(stream.readline, ""):
        if line.startswith(marker):
            out.write(line)
        elif succeeded is not None and (late or succeeded()):
            late.append(f"[{node_name} torchrun] {line}")
        else:
            out.write(f"[{node_name} torchrun] {line}")
        out.flush()
    if late and (proc is None or proc.wait() != 0) and not (stopped and node_index in stopped):
        out.write("".join(late))
        out.flush()


def describe_failure(spec: ClusterSpec, record: dict) -> Tuple[int, str]:
    """(exit code, sentence) for one rank's exit record."""
    rank = record["rank"]
    code = record["returncode"]
    memory = spec.ranks[rank].memory_bytes
    if code < 0 and -code == signal.SIGKILL and record.get("oom_kills", 0) > 0:
        return 128 + 9, (f"rank {rank} ({spec.ranks[rank].device}) exceeded its {fmt_memory(memory)} emulated memory "
                         f"(killed by the OOM killer; peak {fmt_memory(record.get('max_usage', 0))})")
    if code < 0:
        name = signal.Signals(-code).name
        return 128 - code, f"rank {rank} (node {record['node']}) was killed by signal {name}"
    return code, f"rank {rank} (node {record['node']}) exited with code {code}"


def first_failure(spec: ClusterSpec, run_dir: str) -> Optional[Tuple[int, str]]:
    records = []
    for path in glob.glob(os.path.join(run_dir, "rank*.exit.json")):
        with open(path) as f:
            rec = json.load(f)
        if rec["returncode"] != 0:
            records.append(rec)
    if not records:
        return None
    return describe_failure(spec, min(records, key=lambda r: r["time"]))


def _wait_all(procs: List[subprocess.Popen], grace: float, ranks_ended: Callable[[int], bool], stopped: set) -> None:
    """Until every node's torchrun has exited.  Once one failed, the others get ``grace`` seconds to end
    on their own; a node whose ranks have all ended (``ranks_ended``) is killed at once instead: its
    agent only waits in torchrun's exit barrier for the failed node's, which never comes, and inside
    that wait it does not act on SIGTERM (the grace and 15 s more: 25 s of a 1-second job whose rank
    exits 7); nothing of the job is left under it.  Nodes stopped so go in ``stopped``."""
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
        if failed_at is not None:
            for i, p in enumerate(procs):
                if codes[i] is None and ranks_ended(i) and i not in stopped:
                    stopped.add(i)
                    p.kill()
        if failed_at is not None and time.monotonic() - failed_at > grace:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 15
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
            return
        time.sleep(0.05)


def run_on(cluster: Cluster, argv: List[str], out=None, max_restarts: int = 0, defer_quota: bool = False,
           show_cpu_plan: bool = False) -> int:
    """Run ``argv`` on every rank of a cluster that is already up.  ``defer_quota``: ``argv`` calls
    ``rankwrap.enter_cpu_quota`` itself once its start-up is done (``hcomm train`` does).
    ``show_cpu_plan``: first print what the ranks' quotas buy (``CpuPlan.describe``); a plain emulated
    run prints only what its job prints."""
    out = out or sys.stdout
    if cluster.unshaped:
        print(_UNSHAPED_BANNER, file=sys.stderr, flush=True)
    elif show_cpu_plan and cluster.cpu_plan is not None:   # the first thing to read when speeds look off
        print(f"hcomm emulate: {cluster.cpu_plan.describe()}", file=out, flush=True)
    port = HCOMM_EMU_PORT.get()
    run_dir = os.path.dirname(cluster.spec_path)
    for stale in glob.glob(os.path.join(run_dir, "rank*.exit.json")):   # exit records of an earlier run
        os.remove(stale)
    procs, pumps, stopped = [], [], set()
    try:
        for i, node in enumerate(cluster.spec.nodes):
            p = subprocess.Popen(node_command(cluster, i, argv, port, max_restarts),
                                 env=node_env(cluster, i, defer_quota),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 # Launcher SIGKILLed: torchrun gets SIGTERM and
                                 # stops its workers; `down` removes the rest.
                                 preexec_fn=cluster.preexec(i, signal.SIGTERM))
            procs.append(p)
            ranks = [r.rank for r in node.ranks]
            t = threading.Thread(target=_pump, args=(p.stdout, node.name, out, p,
                                                     lambda ranks=ranks: _ranks_succeeded(run_dir, ranks),
                                                     stopped, i),
                                 daemon=True)
            t.start()
            pumps.append(t)
        node_ranks = [[r.rank for r in node.ranks] for node in cluster.spec.nodes]
        # with restarts a record may be an earlier attempt's while the rank runs again: no early stop
        ended = ((lambda i: _ranks_ended(run_dir, node_ranks[i])) if max_restarts == 0 else (lambda i: False))
        _wait_all(procs, HCOMM_EMU_GRACE.get(), ended, stopped)
    finally:
        for p in procs:  # Ctrl-C or an error here: stop the nodes before teardown
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for t in pumps:
            t.join(timeout=5)
    failure = first_failure(cluster.spec, run_dir)
    if failure is not None:
        code, why = failure
        print(f"hcomm emulate: {why}", file=sys.stderr, flush=True)
        return code
    bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    if bad:  # torchrun itself failed (rendezvous, bad arguments) before any rank ran
        i, code = bad[0]
        print(f"hcomm emulate: torchrun on node {cluster.spec.nodes[i].name} failed with "
              f"exit code {code} before its ranks finished", file=sys.stderr, flush=True)
        return code if code > 0 else 128 - code
    return 0


def run(spec: Union[str, ClusterSpec, None], argv: List[str], unshaped: bool = False,
        out=None, max_restarts: int = 0, defer_quota: bool = False, show_cpu_plan: bool = False) -> int:
    """Bring ``spec`` up, run ``argv`` on every rank, tear down; the exit code."""
    with Cluster(spec, unshaped=unshaped) as cluster:
        return run_on(cluster, argv, out=out, max_restarts=max_restarts, defer_quota=defer_quota,
                      show_cpu_plan=show_cpu_plan)
