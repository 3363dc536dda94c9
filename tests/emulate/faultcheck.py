"""Job for the emulator fault tests: all_reduce until a fault, then report how it ended.

Each rank prints ``FAULT <rank> raised <seconds> <first line>`` when an
all_reduce raises HCommError (seconds since its last success), or ``FAULT
<rank> done`` if the loop ran out; ``HCOMM_FAULT_ALGO`` forces an algorithm.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import hcomm
from hcomm.errors import HCommError

TIMEOUT_S = 6  # the group timeout under test; the test allows it plus slack
dist.init_process_group("hcomm", timeout=datetime.timedelta(seconds=TIMEOUT_S))
rank = dist.get_rank()
if os.environ.get("HCOMM_FAULT_ALGO"):
    hcomm.set_algorithm(os.environ["HCOMM_FAULT_ALGO"])
t = torch.ones(4096)
ready = os.environ.get("HCOMM_FAULT_READY")  # rank 0 touches it after 10 good all_reduces
last = time.monotonic()
deadline = last + 40
try:
    for i in range(1 << 30):
        if time.monotonic() > deadline:
            break
        if i == 10 and rank == 0 and ready:
            open(ready, "w").close()
        dist.all_reduce(t)
        t.fill_(1)
        last = time.monotonic()
        time.sleep(0.05)
    print(f"FAULT {rank} done", flush=True)
except (HCommError, RuntimeError) as exc:  # a dead peer: gloo's DistBackendError
    line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    print(f"FAULT {rank} raised {time.monotonic() - last:.1f} {type(exc).__name__}: {line}",
          flush=True)
    os._exit(0)  # the peer is gone: destroy_process_group would wait on it
sys.stdout.flush()
