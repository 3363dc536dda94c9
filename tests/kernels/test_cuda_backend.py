"""The hcomm torch.distributed backend on CUDA tensors, one rank over NCCL.
Skipped without a GPU, or while the backend is not registered (it lives in
csrc/torch, built by the lead's branch)."""
import os

import pytest
import torch
import torch.distributed as dist

import hcomm  # registers the backend when built

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif("hcomm" not in getattr(dist.Backend, "backend_list", []), reason="hcomm backend not registered"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_single_rank_all_reduce_and_all_gather(tmp_path, dtype):
    store = dist.FileStore(os.fspath(tmp_path / "store"), 1)
    dist.init_process_group("hcomm", store=store, rank=0, world_size=1)
    try:
        x = torch.arange(1000, device="cuda", dtype=torch.float32).to(dtype)
        y = x.clone()
        dist.all_reduce(y)
        assert torch.equal(y, x)  # world size 1: the sum is the input
        out = torch.empty(1000, device="cuda", dtype=dtype)
        dist.all_gather_into_tensor(out, x)
        assert torch.equal(out, x)
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_single_rank_uneven_collectives_take_the_padded_device_path(tmp_path, dtype):
    """all_gather_v / reduce_scatter_v of CUDA tensors run padded on NCCL (csrc/torch/device_uneven.cpp)
    instead of refusing; with one rank the result is the input, on the device, ordered on the stream."""
    store = dist.FileStore(os.fspath(tmp_path / "store"), 1)
    dist.init_process_group("hcomm", store=store, rank=0, world_size=1)
    try:
        x = torch.arange(1001, device="cuda", dtype=torch.float32).to(dtype)
        out = torch.empty_like(x)
        hcomm.all_gather_v(out, x, [1001])
        assert out.is_cuda and torch.equal(out, x)
        rs = torch.empty_like(x)
        hcomm.reduce_scatter_v(rs, x, [1001])
        assert rs.is_cuda and torch.equal(rs, x)
        with pytest.raises(ValueError, match="output_split_sizes"):
            hcomm.all_gather_v(out, x, [1000])
    finally:
        dist.destroy_process_group()
