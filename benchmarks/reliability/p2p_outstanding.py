"""Point-to-point progress under many outstanding operations (issue 18, item 6).

Two ranks on one host over an hcomm group.  Rank 1 posts N receives from
rank 0 (one tag, as a pipeline stage does with its neighbour) and N sends to
rank 0 on a second tag, then rank 0 sends and receives its N; we count
rank 1's threads while everything is outstanding and time the whole burst.
Then 2,000 small ping-pongs give the per-message round trip.

    torchrun --standalone --nproc-per-node 2 benchmarks/reliability/p2p_outstanding.py [N] [gloo]

With "gloo" the same runs on torch's gloo group: the reference.

Prints one JSON line from rank 1.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import hcomm  # noqa: F401  (registers the backend)


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = dist.new_group(backend="gloo" if "gloo" in sys.argv[2:] else "hcomm")
    peer = 1 - rank
    bufs = [torch.zeros(16) for _ in range(n)]
    dist.barrier()
    base = threads()
    t0 = time.perf_counter()
    if rank == 1:
        recvs = [dist.irecv(b, src=peer, group=g, tag=0) for b in bufs]
        sends = [dist.isend(torch.full((16,), float(i)), dst=peer, group=g, tag=1) for i in range(n)]
        time.sleep(0.5)  # let every post reach its waiter
        peak = threads()
        dist.barrier()   # rank 0 starts its side only now: all 2N ops were outstanding
    else:
        dist.barrier()
        recvs = [dist.irecv(b, src=peer, group=g, tag=1) for b in bufs]
        sends = [dist.isend(torch.full((16,), float(i)), dst=peer, group=g, tag=0) for i in range(n)]
    for w in recvs + sends:
        w.wait()
    burst = time.perf_counter() - t0 - (0.5 if rank == 1 else 0.0)
    ok = all(torch.equal(b, torch.full((16,), float(i))) for i, b in enumerate(bufs))
    time.sleep(0.2)
    after = threads()
    # Ping-pong: one message each way at a time.
    x = torch.zeros(16)
    rounds = 2000
    dist.barrier()
    t1 = time.perf_counter()
    for _ in range(rounds):
        if rank == 0:
            dist.send(x, dst=peer, group=g)
            dist.recv(x, src=peer, group=g)
        else:
            dist.recv(x, src=peer, group=g)
            dist.send(x, dst=peer, group=g)
    rtt = (time.perf_counter() - t1) / rounds
    if rank == 1:
        print(json.dumps({"backend": "gloo" if "gloo" in sys.argv[2:] else "hcomm", "outstanding": 2 * n, "threads_before": base, "threads_peak": peak,
                          "threads_after": after, "burst_s": round(burst, 4), "correct": ok,
                          "pingpong_rtt_us": round(rtt * 1e6, 1)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
