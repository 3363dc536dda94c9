"""The emulated wire: a user-space IP switch that adds each link's latency.

Why not netem: the kernel this project's CI runs on (and many cloud/VM
kernels) is built without ``sch_netem`` and has no module loader, so
``tc qdisc add ... netem delay`` fails with "Specified qdisc kind is unknown".
Rate limiting stays in the kernel (``tc tbf`` on each node's uplink, both
directions, see :mod:`hcomm.emulate.netns`); only the propagation delay and the
optional loss live here.

How it works: this process creates one TUN device per emulated node (layer 3,
no ARP), the launcher moves each into its node's namespace and gives it the
node's address.  Every IP packet a node sends to another node's address comes
out of the sender's TUN here, is held for ``latency(src) + latency(dst)`` (a
path crosses two uplinks; ``latency`` in the spec is one-way per uplink),
dropped with the links' loss probability, and written into the destination's
TUN.  Packets of one (src, dst) pair share one delay, so the heap keeps them in
order (TCP suffers badly from reordering).  The TUN MTU is large (64 KiB) so a
stream at hundreds of MB/s is a few thousand packets per second, well within
what one Python loop forwards.

The TUN devices are not persistent: when this process exits (or is killed,
including by ``PR_SET_PDEATHSIG`` when the launcher dies) the kernel removes
them, so no wire is ever left behind.

Run as ``python -m hcomm.emulate.wire CONFIG.json``; it prints ``ready`` on
stdout once every TUN exists.

Faults (:mod:`hcomm.emulate.faults`): on SIGUSR1 the wire re-reads
``CONFIG.json.faults`` (``{tun: {"latency_s": .., "loss": ..}}``) and
overrides those ports' latency and loss; ``loss: 1.0`` cuts a node off (every
packet to or from it is dropped, including any already in flight).  A signal,
not a socket: the wire stays one select loop with nothing to authenticate.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import heapq
import json
import os
import random
import select
import signal
import struct
import sys
import time
from typing import Dict, List, Tuple

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MTU = 65000
_PR_SET_PDEATHSIG = 1
_PR_SET_TIMERSLACK = 29


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(option, value, 0, 0, 0)


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    ifr = struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI)
    fcntl.ioctl(fd, TUNSETIFF, ifr)
    return fd


class Switch:
    """Forwards IPv4 packets between TUN ports after each path's delay."""

    def __init__(self, ports: List[dict], seed: int = 0):
        self.fds: Dict[int, dict] = {}
        self.by_ip: Dict[bytes, int] = {}
        for port in ports:
            fd = open_tun(port["tun"])
            self.fds[fd] = port
            self.by_ip[bytes(int(x) for x in port["ip"].split("."))] = fd
        self.heap: List[Tuple[float, int, int, bytes]] = []
        self.seq = 0
        self.rng = random.Random(seed)
        self.forwarded = 0
        self.base = {fd: dict(port) for fd, port in self.fds.items()}

    def apply_faults(self, overrides: Dict[str, dict]) -> None:
        """Reset every port to its spec, then apply ``overrides`` by TUN name."""
        for fd, port in self.fds.items():
            port.update(self.base[fd])
            port.update(overrides.get(port["tun"], {}))
        cut = {fd for fd, port in self.fds.items() if port["loss"] >= 1.0}
        if cut:  # packets already queued for a cut node must not arrive after the cut
            self.heap = [e for e in self.heap if e[2] not in cut]
            heapq.heapify(self.heap)

    def _receive(self, fd: int) -> None:
        src = self.fds[fd]
        for _ in range(64):  # bounded so one busy port cannot starve delivery
            try:
                packet = os.read(fd, MTU + 64)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EIO):
                    return  # EIO: the interface is still down
                raise
            if len(packet) < 20 or packet[0] >> 4 != 4:
                continue  # IPv6 / junk: the cluster speaks IPv4 only
            dst_fd = self.by_ip.get(packet[16:20])
            if dst_fd is None or dst_fd == fd:
                continue
            dst = self.fds[dst_fd]
            loss = 1.0 - (1.0 - src["loss"]) * (1.0 - dst["loss"])
            if loss > 0.0 and self.rng.random() < loss:
                continue
            due = time.monotonic() + src["latency_s"] + dst["latency_s"]
            self.seq += 1
            heapq.heappush(self.heap, (due, self.seq, dst_fd, packet))

    def _deliver(self) -> float:
        """Write every packet that is due; return seconds until the next one."""
        now = time.monotonic()
        while self.heap and self.heap[0][0] <= now:
            _, _, dst_fd, packet = heapq.heappop(self.heap)
            try:
                os.write(dst_fd, packet)
                self.forwarded += 1
            except OSError:
                pass  # destination down or its queue full: a lost packet, like a real wire
        if not self.heap:
            return 1.0
        return max(0.0, self.heap[0][0] - time.monotonic())

    def serve(self) -> None:
        # select, not epoll/poll: those take whole milliseconds (rounded up),
        # which turned a 1.3 ms path into 2 ms.  select sleeps in microseconds.
        fds = list(self.fds)
        while True:
            timeout = self._deliver()
            readable, _, _ = select.select(fds, [], [], timeout)
            for fd in readable:
                self._receive(fd)


def main(argv: List[str]) -> int:
    with open(argv[0]) as f:
        config = json.load(f)
    # Die with the launcher: SIGKILL of the launcher must not leave a wire.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != config.get("parent_pid", os.getppid()):
        return 1  # the launcher died before prctl took effect
    # Default timer slack is 50 us, a visible fraction of a 200 us link.
    _prctl(_PR_SET_TIMERSLACK, 1000)
    try:
        os.nice(-10)  # the wire must keep time while ranks burn their quotas
    except OSError:
        pass
    switch = Switch(config["ports"], seed=config.get("seed", 0))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    def _reload(*_):
        try:
            with open(argv[0] + ".faults") as f:
                switch.apply_faults(json.load(f))
        except (OSError, ValueError):
            switch.apply_faults({})
    signal.signal(signal.SIGUSR1, _reload)  # before "ready": an early fault must not kill us
    print("ready", flush=True)
    switch.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
