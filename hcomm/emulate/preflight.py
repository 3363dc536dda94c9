"""What an emulated cluster needs from the machine, and a clear list of what is missing.

Checked before anything is created so a user without root, without iproute2
or without cgroup v1 controllers gets one message naming every missing piece
(and the ``--unshaped`` way out), not a traceback from the middle of ``up``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import List

from hcomm.emulate import cgroups


def missing() -> List[str]:
    """Human-readable names of everything ``up`` needs but cannot find."""
    out: List[str] = []
    if os.geteuid() != 0:
        out.append("root privileges (network namespaces, tc and cgroups need them; "
                   "run as root or with sudo)")
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            out.append(f"the `{tool}` command (apt-get install {package})")
    if not os.path.exists("/dev/net/tun"):
        out.append("/dev/net/tun (kernel TUN support, CONFIG_TUN)")
    for controller in cgroups.missing_controllers():
        out.append(f"cgroup v1 controller `{controller}` mounted at "
                   f"{os.path.join(cgroups.ROOT, controller)}")
    if not out and shutil.which("tc"):
        out += _missing_qdiscs()
    return out


def _missing_qdiscs() -> List[str]:
    """tbf, ingress and ifb, probed on a throw-away namespace."""
    ns = f"hce-probe-{os.getpid()}"
    probes = [
        (["ip", "link", "add", "hcprobe0", "type", "ifb"], "kernel ifb device (CONFIG_IFB)"),
        (["tc", "qdisc", "add", "dev", "hcprobe0", "root", "tbf", "rate", "1mbit",
          "burst", "32kb", "latency", "10ms"], "tc qdisc tbf (CONFIG_NET_SCH_TBF)"),
        (["tc", "qdisc", "add", "dev", "hcprobe0", "handle", "ffff:", "ingress"],
         "tc ingress qdisc (CONFIG_NET_SCH_INGRESS)"),
    ]
    out: List[str] = []
    if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode != 0:
        return ["network namespaces (`ip netns add` failed; CONFIG_NET_NS)"]
    try:
        for argv, what in probes:
            if subprocess.run(["ip", "netns", "exec", ns] + argv,
                              capture_output=True).returncode != 0:
                out.append(what)
                break
    finally:
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
    return out


def message(items: List[str]) -> str:
    lines = ["hcomm emulate: cannot build an emulated cluster on this machine; missing:"]
    lines += [f"  - {item}" for item in items]
    lines.append("Use --unshaped to run every node on localhost instead "
                 "(links, speeds and memory are then NOT emulated).")
    return "\n".join(lines)
