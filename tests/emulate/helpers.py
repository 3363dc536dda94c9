"""Helpers for the emulator tests (imported by name: pytest puts this folder on sys.path)."""
import os
import subprocess
import sys

from hcomm.emulate import state

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def leftovers(run_id):
    """Every kind of resource a run may create, as a list of what still exists."""
    out = [ns for ns in state.list_netns() if run_id in ns]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    out += [l for l in links.splitlines() if run_id in l]
    for ctl in ("cpu", "memory", "cpuset"):
        if os.path.exists(f"/sys/fs/cgroup/{ctl}/hcomm/{run_id}"):
            out.append(f"cgroup {ctl}")
    if os.path.exists(state.state_path(run_id)):
        out.append("state file")
    return out


def hcomm_cli(*args, timeout=150):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "hcomm", "emulate", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
