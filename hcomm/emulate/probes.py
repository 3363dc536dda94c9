"""Small measurement programs that ``check`` runs inside nodes and rank cgroups.

``python -m hcomm.emulate.probes MODE ARGS``; each prints one JSON line.
Plain sockets and a pure-Python loop, so checking needs no extra tools
(no iperf3) and measures what a Python rank would see.

  sink PORT                 receive one TCP stream; rate over its last 75%
                            (slow start and the first burst left out)
  send HOST PORT NBYTES     send NBYTES as fast as TCP allows
  echo PORT                 echo 1-byte messages (latency partner)
  ping HOST PORT COUNT      TCP_NODELAY ping-pong round trips
  compute START SECONDS     fixed single-thread integer loop from wall time
                            START for SECONDS; iterations per second

Stdlib only, and run as a file (``bootstrap.probe_command``), not through
the ``hcomm.emulate`` package: importing that costs 0.2 s of CPU, which is
seconds of wall time inside a small CPU quota.
  alloc NBYTES              touch NBYTES of memory in 32 MiB steps
  pause START SECONDS PIECE_S  the loop's sustained rate for SECONDS, then
                            pieces of PIECE_S of sustained work, each after
                            a 50 ms sleep: their median time / PIECE_S
"""
from __future__ import annotations

import json
import socket
import sys
import time
from typing import List


def _listen(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    print(json.dumps({"listening": port}), flush=True)
    return s


def sink(port: int) -> dict:
    conn, _ = _listen(port).accept()
    marks = []  # (time, bytes so far)
    total = 0
    while True:
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        total += len(chunk)
        marks.append((time.perf_counter(), total))
    start = next(m for m in marks if m[1] >= total * 0.25)
    rate = (total - start[1]) / max(1e-9, marks[-1][0] - start[0])
    return {"bytes": total, "rate": rate}


def send(host: str, port: int, nbytes: int) -> dict:
    conn = _connect(host, port)
    block = b"\x5a" * (1 << 20)
    sent = 0
    while sent < nbytes:
        n = min(len(block), nbytes - sent)
        conn.sendall(block[:n])
        sent += n
    conn.close()
    return {"sent": sent}


def _connect(host: str, port: int) -> socket.socket:
    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection((host, port), timeout=10)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def echo(port: int) -> dict:
    conn, _ = _listen(port).accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    n = 0
    while True:
        b = conn.recv(64)
        if not b:
            return {"echoed": n}
        conn.sendall(b)
        n += 1


def ping(host: str, port: int, count: int) -> dict:
    conn = _connect(host, port)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts: List[float] = []
    for i in range(count + 3):
        t = time.perf_counter()
        conn.sendall(b"p")
        conn.recv(64)
        if i >= 3:  # the first exchanges still warm caches and the wire's heap
            rtts.append(time.perf_counter() - t)
    rtts.sort()
    return {"rtt_median": rtts[len(rtts) // 2], "rtt_min": rtts[0]}


def _spin(iters: int) -> None:
    """A fixed integer loop: the same work per iteration on every rank."""
    x = 1
    for _ in range(iters):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def compute(start: float, seconds: float) -> dict:
    """Iterations done from ``start`` for ``seconds``, and the rate.

    A rank under a small quota may still be starting its interpreter when
    the window opens (0.2 s of CPU at 0.075 core is nearly 3 s of wall
    time), so the rate is taken over the part of the window this process
    really ran; counting only iterations would call a late starter slow.
    """
    while time.time() < start:
        time.sleep(0.001)
    begin = time.time()
    end = start + seconds
    iters = 0
    while True:
        _spin(2000)  # fixed work between clock reads
        iters += 2000
        now = time.time()
        if now >= end:
            break
    measured = now - begin
    return {"iters": iters, "seconds": measured, "late": begin - start,
            "rate": iters / measured}


def pause(start: float, seconds: float, piece_s: float) -> dict:
    """How much faster a rank runs right after it waited than back to back.

    A GPU computes at one speed whether or not it idled before; a CPU quota
    is spent at a whole core's speed, so the first work after a wait runs
    fast until the period's quota (and the kernel's accounting lag) is used
    up.  Back-to-back work gives the sustained rate; then pieces sized to
    ``piece_s`` at that rate, each after a sleep: 1.0 is a device without
    bursts, 0.25 one that runs 4x its speed after every wait.
    """
    rate = compute(start, seconds)["rate"]
    iters = max(2000, int(rate * piece_s))
    ratios = []
    for _ in range(15):
        time.sleep(0.05)
        t = time.perf_counter()
        _spin(iters)
        ratios.append((time.perf_counter() - t) / piece_s)
    ratios.sort()
    return {"rate": rate, "ratio": ratios[len(ratios) // 2]}


def alloc(nbytes: int) -> dict:
    held = []
    step = 32 << 20
    done = 0
    while done < nbytes:
        held.append(b"\x01" * min(step, nbytes - done))  # bytes(...) of 1s: pages touched
        done += len(held[-1])
    return {"allocated": done}


def main(argv: List[str]) -> int:
    mode, args = argv[0], argv[1:]
    if mode == "sink":
        result = sink(int(args[0]))
    elif mode == "send":
        result = send(args[0], int(args[1]), int(args[2]))
    elif mode == "echo":
        result = echo(int(args[0]))
    elif mode == "ping":
        result = ping(args[0], int(args[1]), int(args[2]))
    elif mode == "compute":
        result = compute(float(args[0]), float(args[1]))
    elif mode == "pause":
        result = pause(float(args[0]), float(args[1]), float(args[2]))
    elif mode == "alloc":
        result = alloc(int(args[0]))
    else:
        print(f"unknown probe {mode!r}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
