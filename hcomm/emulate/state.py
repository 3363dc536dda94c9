"""Run ids, per-run state files, and removal of what dead runs left behind.

Every ``up`` picks a fresh 6-hex run id and names everything after it
(netns ``hce-<id>-n0``, TUN ``hcv<id>n0``, ifb ``hci<id>n0``, cgroups
``<controller>/hcomm/<id>/rank<N>``), so two runs never collide.  Before it
creates anything it writes ``/run/hcomm-emulate/<id>.json`` with the
launcher's PID and that PID's start time (PIDs are reused; the pair is not).

A launcher killed with SIGKILL cannot clean up, so ``reap_dead()`` -- called
by every ``up`` and by ``hcomm emulate down`` -- removes the resources of
every run whose launcher is gone, including resources whose state file was
lost (found by their ``hce-``/``hcomm/<id>`` names).  A live run's resources
are never touched unless asked for by id.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import time
from typing import Dict, List, Optional

from hcomm.emulate import cgroups
from hcomm.settings import declare

HCOMM_EMU_STATE_DIR = declare(
    "HCOMM_EMU_STATE_DIR", "/run/hcomm-emulate",
    "where hcomm emulate keeps one state file (and run folder) per emulated cluster run")

_NETNS_RE = re.compile(r"hce-([0-9a-f]{6})-n\d+")
_RUN_FILE_RE = re.compile(r"[0-9a-f]{6}\.json")


def state_dir() -> str:
    path = HCOMM_EMU_STATE_DIR.get()
    if os.geteuid() != 0 and HCOMM_EMU_STATE_DIR.raw() is None:
        # --unshaped needs no root; it still wants a run folder of its own.
        import tempfile

        path = os.path.join(tempfile.gettempdir(), f"hcomm-emulate-{os.getuid()}")
    return path


def new_run_id() -> str:
    while True:
        run_id = secrets.token_hex(3)
        if not os.path.exists(state_path(run_id)):
            return run_id


def state_path(run_id: str) -> str:
    return os.path.join(state_dir(), f"{run_id}.json")


def run_dir(run_id: str) -> str:
    return os.path.join(state_dir(), run_id)


def netns_name(run_id: str, node_index: int) -> str:
    return f"hce-{run_id}-n{node_index}"


def tun_name(run_id: str, node_index: int) -> str:
    return f"hcv{run_id}n{node_index}"   # <= 15 chars up to node 999


def ifb_name(run_id: str, node_index: int) -> str:
    return f"hci{run_id}n{node_index}"


def _start_time(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def write_state(run_id: str, **fields) -> Dict:
    os.makedirs(state_dir(), exist_ok=True)
    data = {"id": run_id, "pid": os.getpid(), "pid_start": _start_time(os.getpid()),
            "created": time.time()}
    data.update(fields)
    tmp = state_path(run_id) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, state_path(run_id))  # atomic: a reader never sees half a file
    return data


def read_state(run_id: str) -> Optional[Dict]:
    try:
        with open(state_path(run_id)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def is_live(state: Dict) -> bool:
    pid = state.get("pid")
    return bool(pid) and _start_time(pid) == state.get("pid_start")


def list_netns() -> List[str]:
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def known_run_ids() -> List[str]:
    """Run ids with a state file, a namespace or a cgroup on this machine."""
    ids = set()
    if os.path.isdir(state_dir()):
        ids.update(f[:-5] for f in os.listdir(state_dir()) if _RUN_FILE_RE.fullmatch(f))
    for ns in list_netns():
        m = _NETNS_RE.fullmatch(ns)
        if m:
            ids.add(m.group(1))
    ids.update(cgroups.run_ids())
    return sorted(ids)


def _kill_netns_pids(ns: str) -> None:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    for pid in out.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def teardown(run_id: str) -> List[str]:
    """Remove every resource of one run; returns what was removed."""
    removed = []
    state = read_state(run_id) or {}
    wire = state.get("wire_pid")
    if wire and _start_time(wire) == state.get("wire_start"):
        try:
            os.kill(wire, signal.SIGKILL)  # its TUN devices vanish with it
            removed.append(f"wire pid {wire}")
        except ProcessLookupError:
            pass
    for ns in list_netns():
        if ns.startswith(f"hce-{run_id}-"):
            _kill_netns_pids(ns)
            # Deleting the namespace deletes the TUN, the ifb and their qdiscs.
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
            removed.append(f"netns {ns}")
    removed += cgroups.remove_run(run_id)
    rdir = run_dir(run_id)
    if os.path.isdir(rdir):
        for name in os.listdir(rdir):
            os.unlink(os.path.join(rdir, name))
        os.rmdir(rdir)
    if os.path.exists(state_path(run_id)):
        os.unlink(state_path(run_id))
        removed.append(f"state {state_path(run_id)}")
    return removed


def reap_dead() -> List[str]:
    """Tear down every run whose launcher is dead; never a live one."""
    removed = []
    for run_id in known_run_ids():
        state = read_state(run_id)
        if state is not None and is_live(state):
            continue
        if state is None and _recent(run_id):
            continue  # a launcher between creating its cgroup and its state file
        removed += teardown(run_id)
    return removed


def _recent(run_id: str) -> bool:
    """Resources without a state file younger than 10 s may be a run starting up."""
    path = cgroups.run_path("cpu", run_id)
    try:
        return time.time() - os.stat(path).st_mtime < 10
    except OSError:
        return False
