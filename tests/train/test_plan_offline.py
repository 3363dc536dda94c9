"""``hcomm plan --offline``: a cluster that is not here, planned from its spec and published figures."""
import yaml
import pytest

from hcomm.emulate.spec import SpecError, load_spec
from hcomm.parallel import Plan
from hcomm.parallel.plan_check import check_plan
from hcomm.train.plan_cli import main


def _spec(path, nodes_per_island=(2, 2), per_node=8):
    """Two islands (A100, H800) of 8-device nodes: 32 devices by default."""
    nodes = []
    for (island, device, bw), count in zip((("a100", "A100", "1600gbit"), ("h800", "H800", "3200gbit")),
                                           nodes_per_island):
        for i in range(count):
            nodes.append({"name": f"{island}-{i}", "island": island, "vendor": "nccl",
                          "uplink": {"bandwidth": bw, "latency": "5us"},
                          "ranks": [{"device": device, "speed": 1.0, "memory": "80GiB"}] * per_node})
    path.write_text(yaml.safe_dump({"name": "two-kinds", "nodes": nodes}))
    return str(path)


def test_offline_plan_prints_the_table_and_saves_a_valid_plan(tmp_path, capsys):
    spec = _spec(tmp_path / "c.yaml")
    saved = tmp_path / "plan.yaml"
    assert main(["--offline", "--cluster", spec, "--model", "llama-7b", "--seq-len", "2048",
                 "--prices", "A100=1.5,H800=2.5", "--save-plan", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "32 devices (16 x A100, 16 x H800)" in out
    assert "global batch 32 x 2048 tokens" in out
    assert "->" in out and "cost/Mtok" in out and "chose" in out
    plan = Plan.load(str(saved))
    check_plan(plan, 32)   # what hcomm train --plan PATH checks before it launches
    chosen = next(line for line in out.splitlines() if line.lstrip().startswith("->"))
    assert plan.name.replace("search ", "") in chosen


def test_offline_plan_names_bad_input(tmp_path, capsys):
    spec = _spec(tmp_path / "c.yaml", nodes_per_island=(1, 1))
    assert main(["--offline", "--cluster", spec, "--model", "llama-7b", "--prices", "A100=1.5"]) == 2
    assert "prices name no price for device kind(s) ['H800']" in capsys.readouterr().err
    assert main(["--offline", "--cluster", spec, "--prices", "A100:1.5"]) == 2
    assert "--prices 'A100:1.5': expected KIND=PRICE" in capsys.readouterr().err
    # llama-70b's weights, gradients and Adam state (~1.1 TB) cannot fit two 80 GiB devices
    one = _spec(tmp_path / "one.yaml", nodes_per_island=(1, 0), per_node=2)
    assert main(["--offline", "--cluster", one, "--model", "llama-70b"]) == 2
    assert "no plan fits the model on this cluster" in capsys.readouterr().err


def test_emulated_specs_stay_within_one_subnet_but_planned_ones_may_be_larger(tmp_path):
    big = _spec(tmp_path / "big.yaml", nodes_per_island=(100, 60), per_node=1)
    with pytest.raises(SpecError, match="at most 150 nodes fit one emulated subnet, got 160"):
        load_spec(big)
    assert len(load_spec(big, max_nodes=None).nodes) == 160


def test_offline_dtype_search_takes_each_kinds_faster_dtype_from_its_figures(tmp_path, capsys):
    """``--dtype search``: the figures give bf16 16x fp32's peak on an A100 (312 vs 19.5 TFLOP/s) and 15x
    on an H800, so every kind computes in bf16 and the saved plan says so (ZeRO plans run fp32 only:
    under bf16 they are set aside)."""
    spec = _spec(tmp_path / "c.yaml", nodes_per_island=(1, 1), per_node=2)
    saved = tmp_path / "plan.yaml"
    assert main(["--offline", "--cluster", spec, "--model", "llama-7b", "--seq-len", "2048", "--dtype", "search",
                 "--save-plan", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "dtypes searched: fp32 (A100 fp32, H800 fp32): " in out and out.count("; chose faster per kind") == 1
    assert [r.compute_dtype for r in Plan.load(str(saved)).ranks] == ["bf16"] * 4
