"""``hcomm emulate check``: measure that the emulated cluster is what the spec says.

For every ordered pair of nodes: TCP stream bandwidth (within 15% of the
slower uplink) and latency (median ping-pong RTT / 2, within 20% of the sum
of both uplinks' one-way latency).  For all ranks at once, each in its own
cgroup: a fixed single-thread loop for a few seconds; the measured ratio
``iterations / fastest rank's iterations`` must be within 20% of
``speed / fastest speed`` (ranks compete for the cores exactly as in a job, so
this is the ratio a job sees).  Then, all ranks at once again, 40 ms of
each rank's sustained work right after a 50 ms sleep must take at least
``1 - PAUSE_TOL`` of its back-to-back time: a device is no faster after a
wait, a CPU quota is (see ``cgroups``).  For every rank: allocating 125% of its
memory must get it OOM-killed and reported as "rank N exceeded its X GiB
emulated memory".  Exit status 1 when any row is outside tolerance.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

from hcomm.emulate import cgroups, launch
from hcomm.emulate.bootstrap import probe_command
from hcomm.emulate.cluster import Cluster, _env_with_hcomm
from hcomm.emulate.units import fmt_bandwidth, fmt_latency, fmt_memory

BW_TOL, LAT_TOL, SPEED_TOL = 0.15, 0.20, 0.20
PAUSE_TOL, PAUSE_PIECE_S = 0.45, 0.04   # old periods: 0.29-0.54x; 4-7 ms: 0.66-0.89x
_PORT = 47811


@dataclass
class Row:
    what: str
    configured: str
    measured: str
    ok: bool
    error: float = 0.0  # relative error, for the table

    def cells(self) -> List[str]:
        return [self.what, self.configured, self.measured,
                f"{self.error * 100:+.1f}%" if self.error else "", "ok" if self.ok else "FAIL"]


def _probe(cluster: Cluster, node: int, args: List[str], rank: Optional[int] = None,
           wait: bool = True):
    def _pre():
        cluster.preexec(node)()
        if rank is not None:
            cgroups.join(cluster.run_id, rank)

    proc = subprocess.Popen(probe_command() + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_pre, env=_env_with_hcomm(os.environ))
    if args[0] in ("sink", "echo"):
        proc.stdout.readline()  # {"listening": ...}: the server is up
    return _result(proc) if wait else proc


def _result(proc) -> Tuple[int, dict]:
    out, err = proc.communicate(timeout=120)
    lines = [l for l in out.splitlines() if l.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else {"stderr": err[-500:]})


def _rel(measured: float, configured: float) -> float:
    return measured / configured - 1.0


def check_links(cluster: Cluster) -> List[Row]:
    spec, rows = cluster.spec, []
    for a in spec.nodes:
        for b in spec.nodes:
            if a.index == b.index:
                continue
            bw = spec.path_bandwidth_bps(a, b)
            nbytes = int(min(32e6, max(4e6, bw * 0.2)))  # ~0.2 s of traffic, a few MB
            sink = _probe(cluster, b.index, ["sink", str(_PORT)], wait=False)
            code, sent = _probe(cluster, a.index, ["send", cluster.ip(b.index), str(_PORT), str(nbytes)])
            _, got = _result(sink)
            rate = got.get("rate", 0.0)
            err = _rel(rate, bw)
            rows.append(Row(f"bandwidth {a.name}->{b.name}", fmt_bandwidth(bw),
                            fmt_bandwidth(rate) + f" ({nbytes / 1e6:.0f} MB)",
                            abs(err) <= BW_TOL, err))
            if a.index > b.index:
                continue  # latency is symmetric: once per pair
            lat = spec.path_latency_s(a, b)
            echo = _probe(cluster, b.index, ["echo", str(_PORT + 1)], wait=False)
            _, res = _probe(cluster, a.index, ["ping", cluster.ip(b.index), str(_PORT + 1), "30"])
            _result(echo)
            one_way = res.get("rtt_median", 0.0) / 2
            err = _rel(one_way, lat) if lat > 0 else 0.0
            ok = abs(err) <= LAT_TOL if lat > 0 else one_way < 1e-3
            rows.append(Row(f"latency {a.name}<->{b.name} (one-way)", fmt_latency(lat),
                            fmt_latency(one_way), ok, err))
    return rows


def _node_index(spec, rank) -> int:
    """Index of the node ``rank`` (a RankSpec) lives on: the namespace its probes run in."""
    return next(n.index for n in spec.nodes if n.name == rank.node)


def check_compute(cluster: Cluster, seconds: float = 3.0) -> Tuple[List[Row], str]:
    spec = cluster.spec
    start = time.time() + 1.5  # every probe started and waiting before the clock runs
    procs = [(r, _probe(cluster, _node_index(spec, r),
                        ["compute", repr(start), repr(seconds)], rank=r.rank, wait=False))
             for r in spec.ranks]
    results = {r.rank: _result(p)[1] for r, p in procs}
    rate = {rank: res.get("rate", 0.0) for rank, res in results.items()}
    fastest = max(rate.values()) or 1.0
    top_speed = max(r.speed for r in spec.ranks)
    rows = []
    for r in spec.ranks:
        want = r.speed / top_speed
        got = rate[r.rank] / fastest
        err = _rel(got, want)
        # A rate over less than a third of the window is too short to trust.
        ran = results[r.rank].get("seconds", 0.0)
        ok = abs(err) <= SPEED_TOL and ran >= seconds / 3
        rows.append(Row(f"speed rank {r.rank} ({r.device})", f"{want:.2f}",
                        f"{got:.2f} ({rate[r.rank] / 1e6:.2f} M it/s"
                        + ("" if ran >= seconds / 3 else f", ran only {ran:.1f} s") + ")",
                        ok, err))
    return rows, cluster.cpu_plan.describe()


def check_pause(cluster: Cluster, seconds: float = 1.0, tol: float = PAUSE_TOL) -> List[Row]:
    spec = cluster.spec
    start = time.time() + 1.5
    procs = [(r, _probe(cluster, _node_index(spec, r),
                        ["pause", repr(start), repr(seconds), repr(PAUSE_PIECE_S)], rank=r.rank, wait=False))
             for r in spec.ranks]
    rows = []
    for r, proc in procs:
        ratio = _result(proc)[1].get("ratio", 0.0)
        rows.append(Row(f"after a pause rank {r.rank}", "1.00x the time",
                        f"{ratio:.2f}x ({PAUSE_PIECE_S * 1e3:.0f} ms of work after 50 ms idle)",
                        ratio >= 1 - tol, ratio - 1))
    return rows


def check_memory(cluster: Cluster) -> List[Row]:
    rows = []
    for r in cluster.spec.ranks:
        node = _node_index(cluster.spec, r)
        before = cgroups.oom_kills(cluster.run_id, r.rank)
        code, _ = _probe(cluster, node, ["alloc", str(int(r.memory_bytes * 1.25))], rank=r.rank)
        record = {"rank": r.rank, "node": r.node, "returncode": code,
                  "oom_kills": cgroups.oom_kills(cluster.run_id, r.rank) - before,
                  "max_usage": cgroups.max_usage(cluster.run_id, r.rank)}
        _, why = launch.describe_failure(cluster.spec, record)
        ok = code == -9 and record["oom_kills"] > 0
        rows.append(Row(f"memory rank {r.rank}", f"{fmt_memory(r.memory_bytes)} limit",
                        why if code != 0 else "allocation of 125% survived", ok))
    return rows


def run_check(spec, out=sys.stdout) -> Tuple[List[Row], str]:
    with Cluster(spec) as cluster:
        rows = check_links(cluster)
        speed_rows, scale = check_compute(cluster)
        rows += speed_rows + check_pause(cluster) + check_memory(cluster)
    return rows, scale


def table(rows: List[Row]) -> str:
    head = ["check", "configured", "measured", "error", "result"]
    body = [r.cells() for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
                     + [line(c) for c in body])


def machine() -> str:
    import torch

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return "\n".join([f"- machine: `{' '.join(platform.uname())}`",
                      f"- cores: {os.cpu_count()} (usable: {len(cgroups.available_cores())}), "
                      f"memory: {fmt_memory(mem)}",
                      f"- python {platform.python_version()}, torch {torch.__version__}"])


def markdown(spec, rows: List[Row], scale: str) -> str:
    ok = all(r.ok for r in rows)
    return "\n".join([
        f"# hcomm emulate check: `{spec.name}` ({time.strftime('%Y-%m-%d')})", "",
        f"{spec.description}", "", machine(), f"- CPU scale: {scale}",
        f"- tolerances: bandwidth ±{BW_TOL:.0%}, latency ±{LAT_TOL:.0%}, "
        f"speed ratio ±{SPEED_TOL:.0%}, work after a pause at least {1 - PAUSE_TOL:.2f}x its time", "",
        f"Result: **{'all within tolerance' if ok else 'OUTSIDE TOLERANCE'}**", "",
        table(rows), ""])
