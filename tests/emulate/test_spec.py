"""Spec parsing and validation: pure Python, no root needed."""
import pytest
import yaml

from hcomm.emulate import DEFAULT_PRESET, load_spec, presets
from hcomm.emulate.spec import SpecError, parse_spec
from hcomm.emulate.units import parse_bandwidth, parse_latency, parse_memory


def _spec(**node_overrides):
    node = {"name": "a0", "island": "a", "vendor": "nccl",
            "uplink": {"bandwidth": "1gbit", "latency": "500us"},
            "ranks": [{"device": "A100", "speed": 1.0, "memory": "1GiB"}]}
    node.update(node_overrides)
    return {"name": "t", "nodes": [node]}


def test_presets_load_with_expected_shapes():
    assert set(presets()) >= {"mixed", "two-islands", "uneven", "mixed-speed"}
    assert DEFAULT_PRESET == "mixed"
    assert load_spec(None).name == "mixed"
    shapes = {p: [len(n.ranks) for n in load_spec(p).nodes] for p in presets()}
    assert shapes["two-islands"] == [2, 2]
    assert shapes["uneven"] == [3, 2, 1]
    assert sorted(r.speed for r in load_spec("mixed-speed").ranks) == [0.5, 1.0]


def test_ranks_numbered_in_node_order_and_api_units():
    spec = load_spec("uneven")
    assert [r.rank for r in spec.ranks] == list(range(6))
    assert [r.node for r in spec.ranks] == ["a0"] * 3 + ["b0"] * 2 + ["c0"]
    a0 = spec.nodes[0]
    assert a0.uplink_bandwidth_bps == 150e6          # 1200mbit in bytes/s
    assert a0.latency_s == pytest.approx(300e-6)
    assert spec.ranks[5].memory_bytes == 1536 * 2**20
    assert spec.ranks[5].island == "c" and spec.ranks[5].vendor == "hccl"


def test_resolved_yaml_round_trips(tmp_path):
    spec = load_spec("uneven")
    path = tmp_path / "c.yaml"
    path.write_text(spec.to_yaml())
    assert load_spec(str(path)) == spec


def test_units():
    assert parse_bandwidth("100mbit") == 12.5e6
    assert parse_bandwidth("10GB/s") == 10e9
    assert parse_bandwidth("1gbit") == 125e6
    assert parse_latency("1ms") == 1e-3 and parse_latency("250us") == 250e-6
    assert parse_memory("2GiB") == 2 * 2**30 and parse_memory("16GB") == 16 * 10**9
    with pytest.raises(ValueError, match="10mbps"):
        parse_bandwidth("10mbps")  # ambiguous: tc reads bps as bytes


@pytest.mark.parametrize("override, field, value", [
    ({"ranks": [{"device": "A100", "speed": 1.5, "memory": "1GiB"}]}, "nodes[0].ranks[0].speed", "1.5"),
    ({"ranks": [{"device": "A100", "speed": 0, "memory": "1GiB"}]}, "nodes[0].ranks[0].speed", "0"),
    ({"ranks": [{"device": "A100", "memory": "lots"}]}, "nodes[0].ranks[0].memory", "lots"),
    ({"ranks": [{"device": "A100", "memory": "1MiB"}]}, "nodes[0].ranks[0].memory", "1MiB"),
    ({"ranks": [{"speed": 1.0, "memory": "1GiB"}]}, "nodes[0].ranks[0].device", "required"),
    ({"ranks": []}, "nodes[0].ranks", "[]"),
    ({"uplink": {"bandwidth": "fast"}}, "nodes[0].uplink.bandwidth", "fast"),
    ({"uplink": {"bandwidth": "1gbit", "latency": "soon"}}, "nodes[0].uplink.latency", "soon"),
    ({"uplink": {"bandwidth": "1gbit", "loss": 2}}, "nodes[0].uplink.loss", "2"),
    ({"uplink": {"bandwidth": "1gbit", "jitter": "1ms"}}, "nodes[0].uplink.jitter", "unknown field"),
    ({"name": "a node with spaces"}, "nodes[0].name", "a node with spaces"),
    ({"colour": "red"}, "nodes[0].colour", "unknown field"),
])
def test_errors_name_field_and_value(override, field, value):
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(**override))
    assert field in str(err.value) and value in str(err.value)


def test_duplicate_names_and_mixed_vendor_island():
    data = _spec()
    data["nodes"].append(dict(data["nodes"][0]))
    with pytest.raises(SpecError, match=r"nodes\[1\].name: duplicate node name 'a0'"):
        parse_spec(data)
    data["nodes"][1] = dict(data["nodes"][0], name="a1", vendor="hccl")
    with pytest.raises(SpecError, match=r"nodes\[1\].vendor: island 'a' already uses vendor 'nccl'"):
        parse_spec(data)


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_spec(ranks=[{"device": "A100", "speed": 2, "memory": "1GiB"}])))
    with pytest.raises(SpecError, match=r"bad.yaml: nodes\[0\].ranks\[0\].speed: must be in \(0, 1\], got 2"):
        load_spec(str(bad))
    with pytest.raises(SpecError, match="neither a file nor a preset"):
        load_spec("no-such-cluster")


def test_cpu_plan_fits_budget_per_core():
    from hcomm.emulate.cgroups import CORE_BUDGET, PERIOD_US, plan_cpu

    speeds = {r.rank: r.speed for r in load_spec("uneven").ranks}
    plan = plan_cpu(speeds, [0, 1])
    for core in (0, 1):
        used = sum(plan.quota_us[r] for r in speeds if plan.cpu_of[r] == core) / plan.period_us
        assert used <= CORE_BUDGET + 1e-6
    assert plan.quota_us[3] * 2 == pytest.approx(plan.quota_us[0], abs=2)
    slow = plan_cpu(speeds, [0], clock=1.7)  # tiny shares: period grows, no quota under 1 ms
    assert min(slow.quota_us.values()) >= 1000 and slow.period_us > PERIOD_US
    assert slow.quota_us[3] * 2 == pytest.approx(slow.quota_us[0], abs=2)


@pytest.mark.parametrize("override, message", [
    ({"uplink": {"bandwidth": "1gbit", "latency": 1}},
     "nodes[0].uplink.latency: needs a unit, got 1 (e.g. latency: 1ms)"),
    ({"uplink": {"bandwidth": "1gbit", "latency": "0.5"}},
     "nodes[0].uplink.latency: needs a unit, got '0.5' (e.g. latency: 1ms)"),
    ({"uplink": {"bandwidth": 1000000000}},
     "nodes[0].uplink.bandwidth: needs a unit, got 1000000000 (e.g. bandwidth: 1gbit)"),
    ({"ranks": [{"device": "A100", "memory": 2147483648}]},
     "nodes[0].ranks[0].memory: needs a unit, got 2147483648 (e.g. memory: 16GiB)"),
])
def test_unit_fields_refuse_bare_numbers(override, message):
    # `latency: 1` used to mean one second without a word
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(**override))
    assert str(err.value) == message


def test_zero_latency_needs_no_unit():
    spec = parse_spec(_spec(uplink={"bandwidth": "1gbit", "latency": 0}))
    assert spec.nodes[0].latency_s == 0.0


def test_every_preset_and_test_yaml_loads():
    import glob
    import os

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in presets():
        load_spec(name)
    for path in glob.glob(os.path.join(here, "**", "*.yaml"), recursive=True):
        load_spec(path)
