"""Per-node network namespaces, their uplink interface and its tc shaping.

Each node gets namespace ``hce-<id>-n<i>`` with loopback up (ranks of one node
talk over it: the fast tier) and one uplink, the TUN device ``hcv<id>n<i>``
that the wire (:mod:`hcomm.emulate.wire`) created and that is moved in here,
addressed ``10.77.0.<100+i>/24``.  Addresses need not be unique across runs:
they exist only inside the run's own namespaces, never in the host's.

Shaping, both directions at the uplink's bandwidth:
  egress   ``tbf`` as the root qdisc of the TUN (what the node sends);
  ingress  an ``ifb`` device ``hci<id>n<i>`` in the same namespace, fed by an
           ingress ``u32`` + ``mirred`` redirect, with its own ``tbf`` (what
           the node receives), so a node with a slow uplink is slow for its
           peers' sends too, not only its own.
Delay and loss are added by the wire (the CI kernel has no ``sch_netem``).
"""
from __future__ import annotations

import os
import subprocess
from typing import List, Sequence

from hcomm.emulate import state
from hcomm.emulate.spec import ClusterSpec, NodeSpec
from hcomm.emulate.units import tc_rate

SUBNET = "10.77.0"
MTU = 65000  # large packets: a few thousand per second for the user-space wire
_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_SLAVE = 0x1000, 0x4000, 0x80000


class EmulatorSetupError(RuntimeError):
    """A command that builds the emulated cluster failed."""


def node_ip(node_index: int) -> str:
    # Three-digit last octets (100..249): torchrun's c10d rendezvous orders
    # nodes by their address *string*, and this makes string order equal to
    # spec order, so global ranks follow the spec (rankwrap verifies it).
    return f"{SUBNET}.{100 + node_index}"


def sh(argv: Sequence[str], netns: str = "") -> str:
    full = (["ip", "netns", "exec", netns] if netns else []) + list(argv)
    proc = subprocess.run(full, capture_output=True, text=True)
    if proc.returncode != 0:
        raise EmulatorSetupError(f"`{' '.join(full)}` failed (exit {proc.returncode}): "
                                 f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _burst_bytes(bytes_per_s: float) -> int:
    # tbf needs a bucket of at least one packet; ~1 ms of traffic above that
    # keeps the rate smooth without letting short transfers beat the limit.
    return int(max(2 * MTU + 4096, bytes_per_s * 1e-3))


def shape_commands(node: NodeSpec, tun: str, ifb: str) -> List[List[str]]:
    rate = tc_rate(node.uplink_bandwidth_bps)
    burst = str(_burst_bytes(node.uplink_bandwidth_bps))
    # 'latency' here is tbf's queue bound (how long a packet may wait for
    # tokens), not link delay: 50 ms holds a full TCP window at these rates.
    tbf = ["tbf", "rate", rate, "burst", burst, "latency", "50ms"]
    return [
        ["tc", "qdisc", "replace", "dev", tun, "root"] + tbf,
        ["ip", "link", "add", ifb, "type", "ifb"],
        ["ip", "link", "set", ifb, "up"],
        ["tc", "qdisc", "replace", "dev", ifb, "root"] + tbf,
        ["tc", "qdisc", "add", "dev", tun, "handle", "ffff:", "ingress"],
        ["tc", "filter", "add", "dev", tun, "parent", "ffff:", "protocol", "all",
         "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect",
         "dev", ifb],
    ]


def hosts_path(run_id: str) -> str:
    return os.path.join(state.run_dir(run_id), "hosts")


def write_hosts(run_id: str, spec: ClusterSpec) -> str:
    """The run's hosts file: the host's own entries plus one name per node address.

    torch's TCPStore looks up the name of every client that connects
    (getnameinfo); inside a namespace no DNS server is reachable, so without
    an entry each lookup fails (``[c10d] The hostname of the client socket
    cannot be retrieved. err=-3``) after a resolver timeout.  Lives in the
    run directory, so teardown removes it with the rest of the run.
    """
    try:
        with open("/etc/hosts") as f:
            base = f.read()
    except OSError:
        base = "127.0.0.1 localhost\n"
    # Also the IPv4-mapped form: the store listens dual-stack, so it sees
    # its clients as ::ffff:10.77.0.x, which glibc looks up as IPv6.
    lines = [f"{ip} {n.name}" for n in spec.nodes for ip in (node_ip(n.index), "::ffff:" + node_ip(n.index))]
    path = hosts_path(run_id)
    with open(path, "w") as f:
        f.write(base.rstrip("\n") + "\n# hcomm emulate: the emulated nodes\n" + "\n".join(lines) + "\n")
    return path


def enter(ns: str, hosts: str = "") -> None:
    """Move the calling process into namespace ``ns`` (network only).

    Not ``ip netns exec``: that also remounts /sys for the namespace, which
    hides /sys/fs/cgroup, and a rank must still reach its cgroups.  With
    ``hosts``, the process also gets a private mount namespace in which that
    file is bind-mounted over /etc/hosts (what ``ip netns exec`` does with
    /etc/netns/<ns>/hosts, without touching the host's /etc); the mount
    vanishes with the last process of the node.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join("/run/netns", ns), os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns} failed")
    finally:
        os.close(fd)
    if hosts:
        if libc.unshare(_CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
        # Slave, so the bind below does not propagate back to the host's /etc.
        if libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
            raise OSError(ctypes.get_errno(), "making / a slave mount failed")
        if libc.mount(hosts.encode(), b"/etc/hosts", None, _MS_BIND, None) != 0:
            raise OSError(ctypes.get_errno(), f"bind-mounting {hosts} over /etc/hosts failed")


def create_node(run_id: str, node: NodeSpec) -> str:
    """Namespace with loopback, the (already created) TUN moved in, shaped."""
    ns = state.netns_name(run_id, node.index)
    tun = state.tun_name(run_id, node.index)
    sh(["ip", "netns", "add", ns])
    sh(["ip", "link", "set", "lo", "up"], ns)
    sh(["ip", "link", "set", tun, "netns", ns])
    sh(["ip", "addr", "add", f"{node_ip(node.index)}/24", "dev", tun], ns)
    sh(["ip", "link", "set", tun, "mtu", str(MTU), "up"], ns)
    for cmd in shape_commands(node, tun, state.ifb_name(run_id, node.index)):
        sh(cmd, ns)
    return ns


def create_all(run_id: str, spec: ClusterSpec) -> List[str]:
    write_hosts(run_id, spec)
    return [create_node(run_id, node) for node in spec.nodes]


def qdiscs(ns: str) -> str:
    return sh(["tc", "-s", "qdisc", "show"], ns)
