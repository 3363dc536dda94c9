"""The helper pool: results independent of thread count, correct under
concurrent callers (communicator worker threads), and after fork()."""
import os
import threading

import pytest
import torch

from hcomm import kernels

N = 1_000_003  # above the 1 MiB parallel threshold for every kernel


def _run(x, y):
    a = x.clone()
    kernels.reduce_into(a, y, "sum")
    q, s = kernels.quantize_fp8(x, "e4m3", 1024)
    return a, kernels.cast(x, torch.float16), q, s


def test_same_bits_with_one_thread_and_many(monkeypatch):
    x, y = torch.randn(N).bfloat16(), torch.randn(N).bfloat16()
    monkeypatch.setenv("HCOMM_KERNEL_THREADS", "1")
    one = _run(x, y)
    monkeypatch.setenv("HCOMM_KERNEL_THREADS", "8")  # more than cores: capped by the pool
    many = _run(x, y)
    for a, b in zip(one, many):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_concurrent_callers():
    x, y = torch.randn(N).bfloat16(), torch.randn(N).bfloat16()
    expected = (x.float() + y.float()).bfloat16()
    errors = []

    def worker():
        try:
            for _ in range(3):
                a = x.clone()
                kernels.reduce_into(a, y, "sum")
                assert torch.equal(a.view(torch.int16), expected.view(torch.int16))
        except Exception as exc:  # collected: assertion errors in threads are not raised
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_works_after_fork():
    # The child runs only hcomm kernels and numpy: torch's own OpenMP pool is
    # not fork-safe once used in the parent (a libgomp limitation).
    x, y, a = torch.ones(N), torch.ones(N), torch.ones(N)
    kernels.reduce_into(x, y, "sum")  # start the pool in the parent
    pid = os.fork()
    if pid == 0:
        kernels.reduce_into(a, y, "sum")
        os._exit(0 if bool((a.numpy() == 2).all()) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
