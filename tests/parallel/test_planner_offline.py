"""The offline view: published figures -> profiles, a cluster spec -> ClusterView, no job running.

Expected values are worked out by hand here from the formulas the modules document."""
import dataclasses
import os
import time

import pytest
import torch
import yaml

from hcomm.emulate.spec import ClusterSpec, NodeSpec, RankSpec, parse_spec
from hcomm.models.configs import build_model, get_config, param_count
from hcomm.models.llama import Block
from hcomm.parallel.devices import DEVICE_KINDS
from hcomm.parallel.planner.figures import (FIGURES, KERNEL_S, DeviceFigures, analytic_profile, block_act_bytes,
                                            block_flops, figures_for)
from hcomm.parallel.planner.offline import view_from_spec
from hcomm.parallel.profile import measure

GiB = 2**30
B = 2**30   # the all-reduce size checked
SPEC_4096 = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "specs", "cluster-4096.yaml")

TWO_ISLANDS = """
name: two
nodes:
  - name: a0
    island: a
    vendor: nccl
    uplink: {bandwidth: 100gbit, latency: 5us}
    ranks:
      - {device: A100, speed: 1.0, memory: 80GiB}
      - {device: A100, speed: 1.0, memory: 80GiB}
  - name: b0
    island: b
    vendor: hccl
    uplink: {bandwidth: 50gbit, latency: 10us}
    ranks:
      - {device: 910B, speed: 0.5, memory: 64GiB}
      - {device: 910B, speed: 0.5, memory: 64GiB}
"""


def spec_of(text: str) -> ClusterSpec:
    return parse_spec(yaml.safe_load(text))


def ring(n, alpha, beta, nbytes):
    return (n - 1) * alpha + (n - 1) / n * nbytes / beta


# ---------------------------------------------------------------- figures and analytic profiles

def test_figures_cover_every_device_kind_and_its_dtypes():
    for name, kind in DEVICE_KINDS.items():
        assert set(FIGURES[kind.name].peak_flops) - {"tf32"} == set(kind.dtypes), name
    assert FIGURES["H800"].peak_flops == FIGURES["H100"].peak_flops
    assert FIGURES["H800"].link_bytes_per_s < FIGURES["H100"].link_bytes_per_s
    assert figures_for("a100") is FIGURES["A100"]


def test_block_flops_by_hand_and_by_torch():
    cfg = get_config("tiny")   # dim 128, 4 heads (kv 128), ffn 352
    weights = 4 * 128 * 128 + 3 * 128 * 352
    assert weights == 200704
    tokens, seq = 2 * 64, 64
    assert block_flops(cfg, tokens, seq) == 2 * weights * tokens + 4 * seq * 128 * tokens == 55574528
    # torch's counter sees the matmuls (it does not count the CPU attention kernel): the weight part
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        Block(cfg)(torch.randn(2, seq, 128))
    assert counter.get_total_flops() == 2 * weights * tokens


def test_analytic_profile_times_and_bytes():
    cfg = get_config("tiny")
    p = analytic_profile(cfg, "A100", micro_batch=2, seq_len=64)   # bf16, mfu 0.45
    assert [c.name for c in p.layers] == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "head"]
    block = p.layers[1]
    assert block.fwd_fixed_s == pytest.approx(40 * KERNEL_S)
    assert block.fwd_s - block.fwd_fixed_s == pytest.approx(55574528 / (312e12 * 0.45))
    assert block.bwd_s == pytest.approx(2 * block.fwd_s) and block.bwd_fixed_s == pytest.approx(2 * block.fwd_fixed_s)
    # bf16 activations per token: 2 * (7*128 + 2*128 + 4*352) + 4 B * 4 heads of log-sum-exp
    assert block.act_bytes_per_sample == (2 * (7 * 128 + 2 * 128 + 4 * 352) + 16) * 64 == 328704
    assert p.layers[0].act_bytes_per_sample == 8 * 64                      # int64 token ids
    assert p.layers[-1].act_bytes_per_sample == (2 * 128 + 4 * 1024 + 8) * 64
    n = param_count(cfg)
    assert p.param_bytes == p.grad_bytes == 4 * n and p.optim_bytes == 8 * n
    assert (p.memory_budget_bytes, p.budget_source, p.source, p.seconds_spent) == (int(0.9 * 80 * GiB), "figures",
                                                                                    "figures", 0.0)
    assert analytic_profile(cfg, "910B", micro_batch=1, seq_len=8, memory_bytes=8 * GiB).memory_budget_bytes \
        == int(0.9 * 8 * GiB)
    tied = dataclasses.replace(cfg, tie_embeddings=True)
    assert analytic_profile(tied, "H100", micro_batch=1, seq_len=8).param_bytes == 4 * param_count(tied)
    assert analytic_profile("llama-70b", "H800", micro_batch=1, seq_len=4096).param_bytes == 4 * 68_976_648_192


def test_analytic_bytes_mean_what_measure_counts():
    cfg = get_config("tiny")
    measured = measure(build_model(cfg), micro_batch=2, seq_len=32, vocab_size=cfg.vocab_size, budget_s=0.5)
    figured = analytic_profile(cfg, "CPU", micro_batch=2, seq_len=32, dtype="fp32")
    for m, f in zip(measured.layers, figured.layers, strict=True):
        assert (m.name, m.param_bytes, m.grad_bytes, m.optim_bytes) == (f.name, f.param_bytes, f.grad_bytes,
                                                                        f.optim_bytes)
    for k in (0, 1, len(figured.layers) - 1):   # embed, a block, the head: the estimate within 20%
        assert figured.layers[k].act_bytes_per_sample == pytest.approx(measured.layers[k].act_bytes_per_sample,
                                                                       rel=0.2)
    assert block_act_bytes(cfg, 32, 4) == figured.layers[1].act_bytes_per_sample


def test_bad_inputs_are_named():
    cfg = get_config("tiny")
    with pytest.raises(ValueError, match=r"'MI300'.*measured profile.*HCOMM_MODEL_PROFILE"):
        analytic_profile(cfg, "MI300", micro_batch=1, seq_len=8)
    with pytest.raises(ValueError, match="V100 cannot compute in 'bf16'"):
        analytic_profile(cfg, "V100", micro_batch=1, seq_len=8)
    with pytest.raises(ValueError, match="max_seq_len"):
        analytic_profile(cfg, "A100", micro_batch=1, seq_len=cfg.max_seq_len + 1)
    with pytest.raises(ValueError, match="mfu"):
        analytic_profile(cfg, "A100", micro_batch=1, seq_len=8, mfu=1.5)


# ---------------------------------------------------------------- views from specs

def test_two_island_view_by_hand():
    cfg = get_config("small")
    view = view_from_spec(spec_of(TWO_ISLANDS), cfg, micro_batch=2, seq_len=64)
    a, h = FIGURES["A100"], FIGURES["910B"]
    assert view.devices == ["A100", "A100", "910B", "910B"]
    assert view.islands == [[0, 1], [2, 3]] and view.island_names == ["a", "b"]
    p = view.profiles
    assert p[0].layers is p[1].layers and p[2].layers is p[3].layers and p[0].layers is not p[2].layers
    assert [x.memory_budget_bytes for x in p] == [int(0.9 * 80 * GiB)] * 2 + [int(0.9 * 64 * GiB)] * 2
    # speed 0.5: every time doubled, fixed parts too
    full = analytic_profile(cfg, "910B", micro_batch=2, seq_len=64)
    assert p[2].layers[3].fwd_s == pytest.approx(2 * full.layers[3].fwd_s)
    assert p[2].layers[3].bwd_fixed_s == pytest.approx(2 * full.layers[3].bwd_fixed_s)
    assert p[2].layers[3].param_bytes == full.layers[3].param_bytes
    params = param_count(cfg)
    assert view.optimizer_s == pytest.approx([28 * params / 2039e9] * 2 + [28 * params / 1600e9 / 0.5] * 2)

    node = max(ring(2, a.link_latency_s, a.link_bytes_per_s, B), ring(2, h.link_latency_s, h.link_bytes_per_s, B))
    # two islands: one step of 5 + 10 us; each uplink carries its 2 ranks' half shards: B/2 over the 50gbit one
    across = 15e-6 + 0.5 * B / 6.25e9
    assert view.allreduce_s(B) == pytest.approx(2 * (node + across))
    assert view.gather_s(B) == view.reduce_scatter_s(B) == pytest.approx(node + across)
    assert view.allreduce("fp8e4m3")(B) == pytest.approx(2 * (node + 15e-6 + 0.25 * 0.5 * B / 6.25e9))
    assert view.allreduce("bf16:ef")(B) == pytest.approx(2 * (node + 15e-6 + 0.5 * 0.5 * B / 6.25e9))
    assert view.island_allreduce_s[0](B) == pytest.approx(2 * ring(2, a.link_latency_s, a.link_bytes_per_s, B))
    assert view.island_gather_s[1](B) == pytest.approx(ring(2, h.link_latency_s, h.link_bytes_per_s, B))
    assert view.links["intra"] == (10e-6, 196e9) and view.links["inter"] == pytest.approx((15e-6, 6.25e9))
    assert view.p2p_s(0, 2, 10**6) == pytest.approx(15e-6 + 1e6 / 6.25e9)


def test_one_node_is_a_ring_and_nodes_of_an_island_use_their_uplinks():
    one = spec_of("""
nodes:
  - {name: n0, island: x, uplink: {bandwidth: 1gbit}, ranks: [{device: H100, memory: 80GiB},
     {device: H100, memory: 80GiB}, {device: H100, memory: 80GiB}, {device: H100, memory: 80GiB}]}
""")
    view = view_from_spec(one, "tiny", micro_batch=1, seq_len=16)
    assert view.allreduce_s(B) == pytest.approx(2 * (3 * 5e-6 + 3 / 4 * B / 450e9))
    assert view.island_allreduce_s[0](B) == pytest.approx(view.allreduce_s(B))

    # island a: two nodes of 2 A100; island b: one node of 2 H100; uplinks 100gbit, 5 us each
    rank = "{device: %s, memory: 80GiB}"
    uneven = spec_of("\n".join(["nodes:"] + [
        f"  - {{name: {name}, island: {island}, uplink: {{bandwidth: 100gbit, latency: 5us}}, "
        f"ranks: [{rank % kind}, {rank % kind}]}}" for name, island, kind in
        [("a0", "a", "A100"), ("a1", "a", "A100"), ("b0", "b", "H100")]]))
    view = view_from_spec(uneven, "tiny", micro_batch=1, seq_len=16)
    node = ring(2, 5e-6, 300e9, B)                 # the slower NVLink: A100's
    island = 10e-6 + 0.5 * B / 12.5e9              # a's two nodes: the node's 2 half shards through its uplink
    across = 10e-6 + 0.5 * B * max(2 / (4 * 12.5e9), 2 / (2 * 12.5e9))   # b's 2 ranks hold half shards
    assert view.allreduce_s(B) == pytest.approx(2 * (node + island + across))
    assert view.island_allreduce_s[0](B) == pytest.approx(2 * (node + island))
    assert view.island_allreduce_s[1](B) == pytest.approx(2 * ring(2, 5e-6, 450e9, B))
    assert view.islands == [[0, 1, 2, 3], [4, 5]]


def test_emulator_preset_plans_with_its_speeds_and_memories():
    with pytest.raises(ValueError, match=r"rank 2: .*V100 cannot compute in 'bf16'.*per-device"):
        view_from_spec("mixed", "small", micro_batch=2, seq_len=64)
    view = view_from_spec("mixed", "small", micro_batch=2, seq_len=64, dtype="per-device")
    v100 = analytic_profile("small", "V100", micro_batch=2, seq_len=64, dtype="fp16")
    assert view.profiles[2].fwd_s == pytest.approx(2 * v100.fwd_s)        # speed 0.5
    assert view.profiles[2].memory_budget_bytes == int(0.9 * 1536 * 2**20)
    assert view.profiles[0].memory_budget_bytes == int(0.9 * 3 * GiB)
    # the planner takes it as it takes a discovered view
    from hcomm.parallel.planner.data import plan_data_parallel

    plan, _ = plan_data_parallel(view, 16, 64)
    assert sum(plan.batch_counts()) == 16 and plan.predicted_step_s > 0


def test_measured_profiles_and_extra_figures_override():
    cfg = get_config("tiny")
    mine = analytic_profile(cfg, "A100", micro_batch=4, seq_len=32)
    mine = dataclasses.replace(mine, source="file", layers=[dataclasses.replace(c, fwd_s=3 * c.fwd_s)
                                                            for c in mine.layers])
    view = view_from_spec(spec_of(TWO_ISLANDS), cfg, micro_batch=2, seq_len=64, profiles={"a100": mine})
    assert view.profiles[0].source == "file" and view.profiles[0].fwd_s == pytest.approx(mine.fwd_s)
    assert view.profiles[0].memory_budget_bytes == int(0.9 * 80 * GiB)     # the spec's memory, not the file's
    assert view.profiles[2].source == "figures"
    with pytest.raises(ValueError, match="has 3 pieces"):
        view_from_spec(spec_of(TWO_ISLANDS), cfg, micro_batch=2, seq_len=64,
                       profiles={"A100": dataclasses.replace(mine, layers=mine.layers[:3])})

    odd = TWO_ISLANDS.replace("910B", "MI300")
    with pytest.raises(ValueError, match=r"no published figures for device kind 'MI300'"):
        view_from_spec(spec_of(odd), cfg, micro_batch=2, seq_len=64)
    with pytest.raises(ValueError, match=r"'MI300': profiles= gives its compute.*figures="):
        view_from_spec(spec_of(odd), cfg, micro_batch=2, seq_len=64, profiles={"MI300": mine})
    mi300 = DeviceFigures("MI300", {"bf16": 1307e12, "fp32": 163e12}, 192 * GiB, 5300e9, 448e9, 5e-6)
    view = view_from_spec(spec_of(odd), cfg, micro_batch=2, seq_len=64, figures={"MI300": mi300})
    assert view.devices[2] == "MI300" and view.profiles[2].memory_budget_bytes == int(0.9 * 64 * GiB)
    view = view_from_spec(spec_of(odd), cfg, micro_batch=2, seq_len=64, figures={"MI300": mi300}, dtype="per-device")
    assert view.profiles[2].fwd_s == pytest.approx(2 * analytic_profile(cfg, mi300, micro_batch=2, seq_len=64).fwd_s)


# ---------------------------------------------------------------- scale

KINDS_4096 = [("a100", "A100", "nccl", 192, "80GiB", "1600gbit"), ("h800", "H800", "nccl", 192, "80GiB", "3200gbit"),
              ("910b", "910B", "hccl", 128, "64GiB", "1600gbit")]


def cluster_4096() -> dict:
    nodes = []
    for island, device, vendor, count, memory, bandwidth in KINDS_4096:
        for i in range(count):
            nodes.append({"name": f"{island}-{i:03d}", "island": island, "vendor": vendor,
                          "uplink": {"bandwidth": bandwidth, "latency": "5us"},
                          "ranks": [{"device": device, "speed": 1.0, "memory": memory}] * 8})
    return {"name": "cluster-4096", "nodes": nodes}


def parse_large(data: dict) -> ClusterSpec:
    """parse_spec refuses more than 150 nodes (the emulator's subnet): validate every node in chunks of
    150, then number the ranks globally."""
    nodes, first = [], 0
    for start in range(0, len(data["nodes"]), 150):
        for node in parse_spec({"nodes": data["nodes"][start:start + 150]}).nodes:
            ranks = tuple(dataclasses.replace(r, rank=first + r.local_rank) for r in node.ranks)
            nodes.append(dataclasses.replace(node, index=len(nodes), ranks=ranks))
            first += len(ranks)
    return ClusterSpec(data.get("name", "cluster"), tuple(nodes))


def test_4096_devices_plan_view_in_well_under_a_second():
    spec = parse_large(cluster_4096())
    assert spec.world_size == 4096
    start = time.perf_counter()
    view = view_from_spec(spec, "llama-70b", micro_batch=1, seq_len=4096)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"view of 4096 ranks took {elapsed:.2f} s"
    assert len({id(p.layers) for p in view.profiles}) == 3          # one set of piece costs per class
    assert [p.rank for p in view.profiles] == list(range(4096))    # each rank its own identity
    assert [len(m) for m in view.islands] == [1536, 1536, 1024] and view.island_names == ["a100", "h800", "910b"]
    assert len(view.optimizer_s) == len(view.devices) == 4096
    grads = view.profiles[0].grad_bytes
    assert 0 < view.island_allreduce_s[1](grads) < view.allreduce_s(grads) < float("inf")


def test_the_4096_spec_file_is_that_cluster():
    with open(SPEC_4096) as f:
        data = yaml.safe_load(f)
    assert data["nodes"] == cluster_4096()["nodes"]
    spec = parse_large(data)     # every node valid in the spec format
    assert sorted({r.device for r in spec.ranks}) == ["910B", "A100", "H800"]
    assert isinstance(spec.nodes[0], NodeSpec) and isinstance(spec.ranks[-1], RankSpec)
    assert spec.ranks[-1].rank == 4095 and spec.ranks[-1].memory_bytes == 64 * GiB
