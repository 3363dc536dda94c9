"""Multi-process: HCOMM_FORCE_STAGING runs the hcomm backend's cross-island tier through the host-staged
bridge (copy engine, staging blocks, chunks on gloo), and gives bitwise the results of the direct path.

Two islands of two ranks on this host (HCOMM_ISLAND).  Each case runs once with the setting off and once
on, with a bridge chunk (4,099 bytes) that cuts messages mid-element: all_reduce at sizes from 1 to 2 M
elements (the large one chunk-pipelined), the same with bf16 weak-tier compression and error feedback
over two steps (the residuals must follow the same keys staged or not), reduce_scatter_tensor,
all_gather_into_tensor, broadcast from each island, and the uneven all_gather_v / reduce_scatter_v.
The per-op records must say what was staged: nothing when off, every shard when on.
"""
import datetime
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.helpers.mp import Pool

WORLD = 4
SIZES = (1, 1001, 300_000, 2_000_003)


@pytest.fixture(scope="module")
def bare():
    p = Pool(WORLD, setup="bare", timeout_s=180)
    yield p
    p.close()


def case_collectives(ctx, staged: bool, compress: str):
    import hcomm

    os.environ.update(HCOMM_ISLAND="a" if ctx.rank < 2 else "b", HCOMM_PROFILE="off",
                      HCOMM_FORCE_STAGING="1" if staged else "0", HCOMM_BRIDGE_CHUNK="4099",
                      HCOMM_COMPRESS=compress)
    dist.init_process_group("hcomm", init_method=f"file://{ctx.tmp}/staging-{int(staged)}-{compress}",
                            rank=ctx.rank, world_size=ctx.world, timeout=datetime.timedelta(seconds=60))
    try:
        hcomm.set_algorithm("hier")
        g = torch.Generator().manual_seed(77 + ctx.rank)
        out = {}
        for n in SIZES:
            for step in range(2 if compress != "none" else 1):
                x = torch.randn(n, generator=g)
                dist.all_reduce(x)
                out[f"ar{n}.{step}"] = x
            rec = hcomm.last_op()
            out[f"rec{n}"] = {k: rec[k] for k in ("algorithm", "staged_bytes", "chunk_bytes")}
        if compress != "none":
            return out
        ints = torch.arange(12 * 4, dtype=torch.int64) + 100 * ctx.rank
        rs = torch.zeros(12, dtype=torch.int64)
        dist.reduce_scatter_tensor(rs, ints)
        out["rs"], out["rs.staged"] = rs, hcomm.last_op()["staged_bytes"]
        ag = torch.zeros(4 * 3001, dtype=torch.float64)
        dist.all_gather_into_tensor(ag, torch.full((3001,), float(ctx.rank), dtype=torch.float64))
        out["ag"], out["ag.staged"] = ag, hcomm.last_op()["staged_bytes"]
        for root in (0, 3):
            b = torch.full((10_007,), float(ctx.rank), dtype=torch.float32)
            dist.broadcast(b, src=root)
            out[f"bc{root}"], out[f"bc{root}.staged"] = b, hcomm.last_op()["staged_bytes"]
        counts = [5, 0, 7001, 12]
        agv = torch.zeros(sum(counts), dtype=torch.float32)
        hcomm.all_gather_v(agv, torch.full((counts[ctx.rank],), ctx.rank + 0.5), counts)
        out["agv"] = agv
        rsv = torch.zeros(counts[ctx.rank], dtype=torch.int32)
        hcomm.reduce_scatter_v(rsv, torch.arange(sum(counts), dtype=torch.int32) * (ctx.rank + 1), counts)
        out["rsv"] = rsv
        return out
    finally:
        dist.destroy_process_group()


def test_staged_collectives_equal_the_direct_path_bitwise(bare):
    direct = bare.run(case_collectives, False, "none")
    staged = bare.run(case_collectives, True, "none")
    counts = [5, 0, 7001, 12]
    off = np.cumsum([0] + counts)
    for r in range(WORLD):
        for n in SIZES:
            assert staged[r][f"rec{n}"]["algorithm"] == "hier"
            np.testing.assert_array_equal(staged[r][f"ar{n}.0"], direct[r][f"ar{n}.0"])
            np.testing.assert_array_equal(staged[r][f"ar{n}.0"], staged[0][f"ar{n}.0"])
            assert direct[r][f"rec{n}"]["staged_bytes"] == 0
        # Large: every rank holds a shard, copied up and back down once (4 bytes each way per element).
        assert staged[r][f"rec{SIZES[-1]}"]["staged_bytes"] > 0
        for key in ("rs", "ag", "bc0", "bc3", "agv", "rsv"):
            np.testing.assert_array_equal(staged[r][key], direct[r][key])
        ref = sum(np.arange(48) + 100 * q for q in range(WORLD))
        np.testing.assert_array_equal(staged[r]["rs"], ref[12 * r:12 * (r + 1)])
        np.testing.assert_array_equal(staged[r]["ag"], np.repeat(np.arange(4.0), 3001))
        np.testing.assert_array_equal(staged[r]["bc0"], np.zeros(10_007))
        np.testing.assert_array_equal(staged[r]["bc3"], np.full(10_007, 3.0))
        np.testing.assert_array_equal(staged[r]["agv"], np.repeat(np.arange(4) + 0.5, counts))
        full = np.arange(sum(counts)) * sum(q + 1 for q in range(WORLD))
        np.testing.assert_array_equal(staged[r]["rsv"], full[off[r]:off[r + 1]])
        assert staged[r]["ag.staged"] > 0 and direct[r]["ag.staged"] == 0
    # Each island's ranks together stage the whole large buffer up and down.
    for members in ((0, 1), (2, 3)):
        assert sum(staged[r][f"rec{SIZES[-1]}"]["staged_bytes"] for r in members) == 2 * 4 * SIZES[-1]
    # The all-reduce sums themselves, against float64.
    g = [torch.Generator().manual_seed(77 + q) for q in range(WORLD)]
    for n in SIZES:
        ref = sum(torch.randn(n, generator=g[q]).double() for q in range(WORLD))
        assert np.allclose(staged[0][f"ar{n}.0"], ref.numpy(), rtol=1e-5, atol=1e-5)


def test_staged_compressed_all_reduce_equals_direct_with_error_feedback(bare):
    """bf16 on the wire with error feedback, two steps: the host copy is encoded with the residual of the
    same piece key as the direct path, so step 2 (which adds step 1's residual) is bitwise equal too."""
    direct = bare.run(case_collectives, False, "bf16:ef")
    staged = bare.run(case_collectives, True, "bf16:ef")
    for r in range(WORLD):
        for n in SIZES:
            for step in (0, 1):
                np.testing.assert_array_equal(staged[r][f"ar{n}.{step}"], direct[r][f"ar{n}.{step}"])
    # Compression acted: the results are bf16-close to the float64 sums, not exact.
    g = [torch.Generator().manual_seed(77 + q) for q in range(WORLD)]
    for n in SIZES:
        for step in (0, 1):
            ref = sum(torch.randn(n, generator=g[q]).double() for q in range(WORLD)).numpy()
            if n >= 1001:
                err = np.abs(staged[0][f"ar{n}.{step}"] - ref)
                assert 1e-4 < err.max() < 0.1, (n, step, err.max())
