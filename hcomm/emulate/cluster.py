"""``Cluster``: bring an emulated cluster up and guarantee it comes down.

``up`` order: reap dead runs, write the state file (so a crash after this
point is always cleanable), start the wire, build namespaces and shaping,
create the rank cgroups.  Any failure on the way tears down what exists.

Teardown is guaranteed on normal exit and exceptions (``with``/``down``), on
Ctrl-C (``KeyboardInterrupt`` unwinds through ``down``), on SIGTERM/SIGHUP
(turned into ``SystemExit`` while a cluster is up, in the main thread), and
at interpreter exit (``atexit``).  SIGKILL of the launcher cannot run code:
the wire dies with it (``PR_SET_PDEATHSIG``) and the next ``up`` or
``hcomm emulate down`` removes the rest, found through the state file.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import threading
from typing import Callable, Dict, Optional, Union

from hcomm.emulate.bootstrap import module_command
from hcomm.emulate import cgroups, host_threads, netns, preflight, state
from hcomm.emulate.retune import retune
from hcomm.emulate.spec import ClusterSpec, load_spec


class EmulatorUnavailable(RuntimeError):
    """This machine lacks what emulation needs; the message names each missing piece."""


class Cluster:
    """An emulated cluster for one spec: ``with Cluster("uneven") as c: ...``."""

    def __init__(self, spec: Union[str, ClusterSpec, None] = None, unshaped: bool = False):
        self.spec = spec if isinstance(spec, ClusterSpec) else load_spec(spec)
        self.unshaped = unshaped
        self.run_id: Optional[str] = None
        self.cpu_plan: Optional[cgroups.CpuPlan] = None
        self._wire: Optional[subprocess.Popen] = None
        self._old_handlers: Dict[int, object] = {}

    # ---- names the launcher and check need -------------------------------
    @property
    def spec_path(self) -> str:
        return os.path.join(state.run_dir(self.run_id), "cluster.yaml")

    def netns(self, node_index: int) -> str:
        return "" if self.unshaped else state.netns_name(self.run_id, node_index)

    def ifname(self, node_index: int) -> str:
        return "lo" if self.unshaped else state.tun_name(self.run_id, node_index)

    def ip(self, node_index: int) -> str:
        return "127.0.0.1" if self.unshaped else netns.node_ip(node_index)

    def local_addr(self, node_index: int) -> str:
        """The address torchrun's c10d rendezvous orders nodes by (see netns.node_ip)."""
        return f"127.0.0.{100 + node_index}" if self.unshaped else netns.node_ip(node_index)

    def preexec(self, node_index: int, pdeathsig: int = 0) -> Callable[[], None]:
        """A ``preexec_fn`` that puts a child into the node's namespace.

        With ``pdeathsig`` the child also gets that signal if the launcher
        dies (SIGKILL included), so nothing outlives a crashed launcher long.
        """
        ns = self.netns(node_index)
        hosts = netns.hosts_path(self.run_id) if ns else ""
        hosts = hosts if hosts and os.path.exists(hosts) else ""

        def _fn() -> None:
            if pdeathsig:
                import ctypes

                ctypes.CDLL(None).prctl(1, pdeathsig, 0, 0, 0)  # PR_SET_PDEATHSIG
            if ns:
                netns.enter(ns, hosts)

        return _fn

    # ---- lifecycle ---------------------------------------------------------
    def faults(self):
        """Cut/restore/slow nodes and kill/stop/cont ranks of this live run."""
        from hcomm.emulate.faults import Faults

        return Faults(self.run_id)

    def up(self) -> "Cluster":
        if self.run_id is not None:
            return self  # idempotent: already up
        if not self.unshaped:
            missing = preflight.missing()
            if missing:
                raise EmulatorUnavailable(preflight.message(missing))
            state.reap_dead()
        self.run_id = state.new_run_id()
        state.write_state(self.run_id, spec=self.spec.name, unshaped=self.unshaped)
        self._install_handlers()
        atexit.register(self.down)
        try:
            os.makedirs(state.run_dir(self.run_id), exist_ok=True)
            with open(self.spec_path, "w") as f:
                f.write(self.spec.to_yaml())
            if not self.unshaped:
                self._start_wire()
                netns.create_all(self.run_id, self.spec)
                self._create_cgroups()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        if self.run_id is None:
            return
        run_id, self.run_id = self.run_id, None
        if self._wire is not None and self._wire.poll() is None:
            self._wire.kill()
            self._wire.wait()
        self._wire = None
        state.teardown(run_id)
        self._restore_handlers()
        atexit.unregister(self.down)

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # ---- pieces ------------------------------------------------------------
    def _start_wire(self) -> None:
        ports = [{"tun": state.tun_name(self.run_id, n.index), "ip": netns.node_ip(n.index),
                  "latency_s": n.latency_s, "loss": n.loss} for n in self.spec.nodes]
        cfg = os.path.join(state.run_dir(self.run_id), "wire.json")
        with open(cfg, "w") as f:
            json.dump({"ports": ports, "parent_pid": os.getpid()}, f)
        self._wire = subprocess.Popen(
            module_command("hcomm.emulate.wire") + [cfg],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=_env_with_hcomm(os.environ), start_new_session=True)
        line = self._wire.stdout.readline().strip()
        if line != "ready":
            err = self._wire.stderr.read() if self._wire.poll() is not None else ""
            raise netns.EmulatorSetupError(f"the emulated wire did not start: {line} {err}")
        st = state.read_state(self.run_id)
        st.update(wire_pid=self._wire.pid, wire_start=state._start_time(self._wire.pid))
        state.write_state(self.run_id, **{k: v for k, v in st.items()
                                          if k not in ("id", "pid", "pid_start", "created")})

    def _create_cgroups(self) -> None:
        for r in self.spec.ranks:  # unlimited first: calibration borrows rank 0's group
            cgroups.create_rank(self.run_id, r.rank, -1, cgroups.available_cores()[0],
                                r.memory_bytes)
        first = self.spec.ranks[0].rank
        self.calibration = cgroups.calibrate(self.run_id, first, state.state_dir())
        self.cpu_plan = cgroups.plan_cpu({r.rank: r.speed for r in self.spec.ranks},
                                         self.calibration.cores, self.calibration.clock)
        for r in self.spec.ranks:
            cgroups.create_rank(self.run_id, r.rank, self.cpu_plan.quota_us[r.rank],
                                self.cpu_plan.cpu_of[r.rank], r.memory_bytes,
                                self.cpu_plan.period_us, r.speed)
        if host_threads.mode() == "host":
            host_threads.create_host_group(self.run_id)
        # Measured correction: quotas do not buy work proportionally on a VM.
        self.cpu_plan = retune(self.run_id, self.cpu_plan, {r.rank: r.speed for r in self.spec.ranks},
                               state.state_dir())

    def set_speed(self, rank: int, speed: float) -> None:
        """Change a running rank's compute speed (a straggler appearing: throttling, a noisy neighbour):
        its CPU quota is scaled from the one its spec speed got, so the calibration and the retune
        carry over.  An unshaped cluster has no quota to change."""
        if self.unshaped or self.cpu_plan is None:
            raise EmulatorUnavailable("set_speed needs the emulated cluster's cgroups (this one is unshaped)")
        if not speed > 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        base = next(r.speed for r in self.spec.ranks if r.rank == rank)
        quota = max(1000, int(self.cpu_plan.quota_us[rank] * speed / base))
        cgroups._write(os.path.join(cgroups.rank_path("cpu", self.run_id, rank), "cpu.cfs_quota_us"), quota)

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def _exit(signum, frame):
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, _exit)

    def _restore_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()


def _env_with_hcomm(env) -> Dict[str, str]:
    """``env`` plus hcomm's own folder on PYTHONPATH, so children import this copy."""
    import hcomm

    root = os.path.dirname(os.path.dirname(os.path.abspath(hcomm.__file__)))
    out = dict(env)
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        out["PYTHONPATH"] = os.pathsep.join([root] + parts)
    return out
