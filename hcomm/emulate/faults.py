"""Fault injection into a live emulated run: cut, restore, slow, kill, stall.

Links: the wire (:mod:`hcomm.emulate.wire`) owns latency and loss, so a cut is
``loss 1.0`` on the node's port there (everything to or from that uplink is
dropped, as a pulled cable would) and ``slow --latency`` overrides its
latency; both are written to ``wire.json.faults`` in the run folder and the
wire is told with SIGUSR1.  ``slow --bandwidth`` replaces the node's two
``tbf`` qdiscs (egress on the TUN, ingress on the ifb) inside its namespace.

Ranks: every process in the run's namespaces whose environment has
``RANK=<r>`` (set by torchrun/rankwrap) gets the signal, so a rank is
addressed by its global rank whatever launched it.

Schedules (``hcomm emulate run --fault 5s:cut:n1``): ``WHEN:ACTION:TARGET[:ARG]``
with ACTION in cut/restore/slow/kill/stop/cont; TARGET a node name or index for
cut/restore/slow and a global rank for kill/stop/cont; ARG for slow is
``latency=5ms`` or ``bandwidth=1Gbit`` (or both, joined by ``,``).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from hcomm.emulate import netns, state, units
from hcomm.emulate.spec import load_spec

ACTIONS = ("cut", "restore", "slow", "kill", "stop", "cont")
_SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}


class FaultError(RuntimeError):
    """A fault that cannot be applied (no such run, node or rank)."""


class Faults:
    """Faults on one run, by run id (``Cluster.faults()`` or ``Faults(run_id)``)."""

    def __init__(self, run_id: str):
        st = state.read_state(run_id)
        if st is None:
            raise FaultError(f"no emulated run {run_id!r} (see hcomm emulate down)")
        if st.get("unshaped"):
            raise FaultError(f"run {run_id} is --unshaped: it has no wire or namespaces to fault")
        self.run_id = run_id
        self.spec = load_spec(os.path.join(state.run_dir(run_id), "cluster.yaml"))
        self._cfg = os.path.join(state.run_dir(run_id), "wire.json")

    # ---- links -------------------------------------------------------------
    def node_index(self, node) -> int:
        for n in self.spec.nodes:
            if str(node) in (n.name, str(n.index)):
                return n.index
        raise FaultError(f"run {self.run_id} has no node {node!r} "
                         f"(nodes: {', '.join(n.name for n in self.spec.nodes)})")

    def _overrides(self) -> Dict[str, dict]:
        try:
            with open(self._cfg + ".faults") as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def _push(self, overrides: Dict[str, dict]) -> None:
        tmp = self._cfg + ".faults.tmp"
        with open(tmp, "w") as f:
            json.dump(overrides, f)
        os.replace(tmp, self._cfg + ".faults")
        st = state.read_state(self.run_id) or {}
        pid = st.get("wire_pid")
        if not pid or state._start_time(pid) != st.get("wire_start"):
            raise FaultError(f"run {self.run_id} has no live wire")
        os.kill(pid, signal.SIGUSR1)

    def cut(self, node) -> None:
        tun = state.tun_name(self.run_id, self.node_index(node))
        ov = self._overrides()
        ov.setdefault(tun, {})["loss"] = 1.0
        self._push(ov)

    def restore(self, node) -> None:
        """Undo cut and slow on one node: back to its spec."""
        i = self.node_index(node)
        ov = self._overrides()
        ov.pop(state.tun_name(self.run_id, i), None)
        self._push(ov)
        self._shape(i, self.spec.nodes[i].uplink_bandwidth_bps)

    def slow(self, node, latency: Optional[str] = None, bandwidth: Optional[str] = None) -> None:
        i = self.node_index(node)
        if latency is None and bandwidth is None:
            raise FaultError("slow needs latency=... or bandwidth=...")
        if latency is not None:
            ov = self._overrides()
            ov.setdefault(state.tun_name(self.run_id, i), {})["latency_s"] = \
                units.parse_latency(latency)
            self._push(ov)
        if bandwidth is not None:
            self._shape(i, units.parse_bandwidth(bandwidth))

    def _shape(self, i: int, bps: float) -> None:
        rate = units.tc_rate(bps)
        burst = str(netns._burst_bytes(bps))
        ns = state.netns_name(self.run_id, i)
        for dev in (state.tun_name(self.run_id, i), state.ifb_name(self.run_id, i)):
            netns.sh(["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                      "burst", burst, "latency", "50ms"], netns=ns)

    # ---- ranks -------------------------------------------------------------
    def rank_pids(self, rank: int) -> List[int]:
        pids = []
        for n in self.spec.nodes:
            out = subprocess.run(["ip", "netns", "pids", state.netns_name(self.run_id, n.index)],
                                 capture_output=True, text=True).stdout
            for pid in out.split():
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env = f.read().split(b"\0")
                except OSError:
                    continue  # exited meanwhile
                if f"RANK={rank}".encode() in env:
                    pids.append(int(pid))
        return pids

    def signal_rank(self, rank: int, sig: int) -> List[int]:
        pids = self.rank_pids(int(rank))
        if not pids:
            raise FaultError(f"run {self.run_id} has no live process of rank {rank}")
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def kill(self, rank: int) -> List[int]:
        return self.signal_rank(rank, signal.SIGKILL)

    def stop(self, rank: int) -> List[int]:
        return self.signal_rank(rank, signal.SIGSTOP)

    def cont(self, rank: int) -> List[int]:
        return self.signal_rank(rank, signal.SIGCONT)

    def apply(self, action: str, target: str, arg: str = "") -> None:
        if action in _SIGNALS:
            self.signal_rank(int(target), _SIGNALS[action])
        elif action == "slow":
            kw = dict(kv.split("=", 1) for kv in arg.split(",") if kv)
            self.slow(target, **kw)
        else:
            getattr(self, action)(target)


@dataclass
class Step:
    at_s: float
    action: str
    target: str
    arg: str = ""


def parse_step(text: str) -> Step:
    parts = text.split(":", 3)
    if len(parts) < 3 or parts[1] not in ACTIONS:
        raise FaultError(f"fault {text!r}: expected WHEN:ACTION:TARGET[:ARG] with ACTION "
                         f"one of {', '.join(ACTIONS)} (e.g. 5s:cut:n1)")
    try:
        at = units.parse_latency(parts[0])
    except Exception as exc:
        raise FaultError(f"fault {text!r}: bad time {parts[0]!r}: {exc}") from None
    return Step(at, parts[1], parts[2], parts[3] if len(parts) > 3 else "")


def run_schedule(run_id: str, steps: List[Step]) -> threading.Thread:
    """Apply ``steps`` at their times from now, on a daemon thread."""
    def _go():
        t0 = time.monotonic()
        faults = Faults(run_id)
        for step in sorted(steps, key=lambda s: s.at_s):
            time.sleep(max(0.0, t0 + step.at_s - time.monotonic()))
            try:
                faults.apply(step.action, step.target, step.arg)
                print(f"hcomm emulate: fault {step.action} {step.target} at "
                      f"{time.monotonic() - t0:.1f}s", flush=True)
            except (FaultError, OSError) as exc:
                print(f"hcomm emulate: fault {step.action} {step.target} failed: {exc}",
                      flush=True)
    th = threading.Thread(target=_go, daemon=True, name="hcomm-faults")
    th.start()
    return th
