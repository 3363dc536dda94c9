"""The plan: YAML round trip, batch apportioning, every validation message, printing, no torch."""
import math
import os
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from hcomm.parallel import GroupPlan, Plan, PlanError, RankPlan
from hcomm.parallel.plan import apportion
from hcomm.parallel.plan_check import WIRE_FORMATS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def full_plan() -> Plan:
    """Every field away from its default."""
    ranks = [RankPlan(0, 0.6, device="A100", island="a", zero_stage=3, shard_fraction=0.7),
             RankPlan(1, 0.4, device="V100", island="a", zero_stage=3, shard_fraction=0.3),
             RankPlan(2, 0.0, device="910B", island="b", zero_stage=3, shard_fraction=0.0)]
    # ZeRO runs one optimizer over every rank, so the cross-island sync period sits on another group here;
    # the pipeline's fields are in pipeline_plan() and the compute dtypes in precision_plan() (neither
    # runs with ZeRO)
    groups = [GroupPlan("dp", [0, 1, 2], bucket_bytes=4 * 2**20, compression="fp8e4m3:ef",
                        zero_layout="island", prefetch=2, reshard_after_forward=False),
              GroupPlan("island:a", [0, 1], bucket_bytes=2048, compression="bf16", sync_every=8, outer_lr=0.5,
                        outer_momentum=0.8)]
    return Plan(64, 256, ranks, groups, name="auto", predicted_step_s=1.25,
                notes=["beat uniform: 2.1 s", "island b only reduces"]).validate()


def pipeline_plan() -> Plan:
    """Every pipeline field away from its default: one replica, devices in the order 2, 0, 1."""
    ranks = [RankPlan(0, 0.0, stage=1, layers=(3, 8)), RankPlan(1, 0.0, stage=2, layers=(8, 9)),
             RankPlan(2, 1.0, stage=0, layers=(0, 3))]
    groups = [GroupPlan("dp", [0, 1, 2]),
              GroupPlan("pp:0", [2, 0, 1], micro_batches=4, schedule="gpipe", cuts=[0, 3, 8, 9])]
    return Plan(64, 256, ranks, groups, name="pp").validate()


def tp_plan() -> Plan:
    """Two TP groups of two uneven shards (0.75 / 0.25), rows on each group's first rank."""
    ranks = [RankPlan(0, 0.6, tp_group=0, tp_fraction=0.75), RankPlan(1, 0.0, tp_group=0, tp_fraction=0.25),
             RankPlan(2, 0.4, tp_group=1, tp_fraction=0.75), RankPlan(3, 0.0, tp_group=1, tp_fraction=0.25)]
    groups = [GroupPlan("dp", [0, 1, 2, 3]), GroupPlan("tp:0", [0, 1]), GroupPlan("tp:1", [2, 3])]
    return Plan(10, 16, ranks, groups, name="tp").validate()


def precision_plan() -> Plan:
    """Each rank in its device's best dtype (plain data parallelism)."""
    ranks = [RankPlan(0, 0.5, device="A100", compute_dtype="bf16"), RankPlan(1, 0.3, device="V100", compute_dtype="fp16"),
             RankPlan(2, 0.2, device="CPU")]
    return Plan(12, 16, ranks, [GroupPlan("dp", [0, 1, 2])], name="per-device").validate()


# --- round trip ----------------------------------------------------------------------

@pytest.mark.parametrize("plan", [Plan.uniform(4, 32, 128), Plan.from_shares([0.5, 0.3, 0.2], 10, 8), full_plan(),
                                  pipeline_plan(), precision_plan(), tp_plan()],
                         ids=["uniform", "shares", "full", "pipeline", "precision", "tp"])
def test_yaml_round_trip(plan, tmp_path):
    assert Plan.from_yaml(plan.to_yaml()) == plan
    assert Plan.from_dict(plan.to_dict()) == plan
    path = str(tmp_path / "plan.yaml")
    plan.save(path)
    assert Plan.load(path) == plan


def test_full_plan_yaml_writes_every_field():
    text = full_plan().to_yaml()
    assert "compute_dtype: fp16" in precision_plan().to_yaml()
    assert "tp_fraction: 0.25" in tp_plan().to_yaml() and "tp_group: 1" in tp_plan().to_yaml()
    for name in ("shard_fraction", "outer_momentum",
                 "zero_layout: island", "prefetch: 2", "reshard_after_forward: false",
                 "predicted_step_s", "notes"):
        assert name in text
    text = pipeline_plan().to_yaml()
    for name in ("stage: 2", "layers: [0, 3]", "micro_batches: 4", "schedule: gpipe", "cuts: [0, 3, 8, 9]"):
        assert name in text


def test_defaults_left_out_of_yaml():
    text = Plan.uniform(2, 8, 16).to_yaml()
    assert "compute_dtype" not in text and "bucket_bytes" not in text
    assert text.startswith("#")


def test_shares_shorthand_and_default_dp_group():
    plan = Plan.from_yaml("global_batch: 10\nseq_len: 32\nshares: [0.5, 0.3, 0.2]\n")
    assert plan == Plan.from_shares([0.5, 0.3, 0.2], 10, 32)
    assert plan.dp_group().ranks == [0, 1, 2]
    assert plan.batch_counts() == [5, 3, 2] and plan.batch_offsets() == [0, 5, 8]


def test_shares_and_ranks_together_rejected():
    with pytest.raises(PlanError, match="either shares or ranks"):
        Plan.from_dict({"global_batch": 4, "seq_len": 1, "shares": [1.0], "ranks": [{"rank": 0, "batch_share": 1}]})


def test_float_written_without_dot_is_read():
    plan = Plan.from_yaml("global_batch: 4\nseq_len: 1\nshares: [1e-0]\n")  # PyYAML reads 1e-0 as a string
    assert plan.shares() == [1.0]


# --- batch counts --------------------------------------------------------------------

@pytest.mark.parametrize("shares, total, expected", [
    ([0.5, 0.3, 0.2], 10, [5, 3, 2]),
    ([0.5, 0.3, 0.2], 7, [4, 2, 1]),
    ([0.5, 0.5, 0.0], 4, [2, 2, 0]),
    ([0.25, 0.25, 0.25, 0.25], 6, [2, 2, 1, 1]),  # ties go to the lower rank
])
def test_batch_counts_examples(shares, total, expected):
    assert Plan.from_shares(shares, total, 1).batch_counts() == expected


@given(st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 100.0)), min_size=1, max_size=16)
       .filter(lambda xs: sum(xs) > 0), st.integers(0, 100_000))
def test_apportion_properties(weights, total):
    shares = [w / sum(weights) for w in weights]
    counts = apportion(shares, total)
    assert sum(counts) == total
    for share, n in zip(shares, counts):
        assert abs(n - total * share) < 1 + 1e-9
        if share == 0:
            assert n == 0


def test_apportion_refuses_shares_without_a_positive_sum():
    """All-zero speeds (no replica predicted in finite time) once divided by zero inside the planner."""
    with pytest.raises(ValueError, match="no positive sum"):
        apportion([0.0, 0.0], 4)


# --- validation ----------------------------------------------------------------------

def plan_with(**changes) -> Plan:
    """A valid 3-rank plan with rank/group/top-level fields changed: ``r1_stage=2``, ``g0_sync_every=0``."""
    plan = Plan.from_shares([0.5, 0.3, 0.2], 10, 16)
    for key, value in changes.items():
        if key[0] in "rg" and key[1].isdigit():
            items = plan.ranks if key[0] == "r" else plan.groups
            setattr(items[int(key[1])], key[3:], value)
        else:
            setattr(plan, key, value)
    return plan


def assert_error(plan: Plan, *fragments: str, world_size=None):
    with pytest.raises(PlanError) as info:
        plan.validate(world_size)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


@pytest.mark.parametrize("changes, fragments", [
    (dict(r2_batch_share=-0.1), ["ranks[2].batch_share: must be >= 0, got -0.1"]),
    (dict(r1_batch_share=math.nan), ["ranks[1].batch_share: must be finite, got nan"]),
    (dict(r2_batch_share=0.1), ["batch shares sum to 0.9 (ranks 0..2: 0.5, 0.3, 0.1); they must sum to 1"]),
    (dict(global_batch=2), ["global_batch 2 is smaller than the 3 ranks with a non-zero share (ranks 0, 1, 2)"]),
    (dict(global_batch=0), ["global_batch: must be >= 1, got 0"]),
    (dict(seq_len=0), ["seq_len: must be >= 1, got 0"]),
    (dict(backend="nccl"), ["backend: must be one of hcomm, ddp-gloo, fsdp2-gloo, got 'nccl'"]),
    (dict(predicted_step_s=-1.0), ["predicted_step_s", "-1.0"]),
    (dict(r1_compute_dtype="int8"), ["ranks[1].compute_dtype", "fp32, bf16, fp16, fp8", "'int8'"]),
    (dict(r0_zero_stage=4), ["ranks[0].zero_stage: must be 0, 1, 2 or 3, got 4"]),
    (dict(r2_tp_fraction=0.0), ["ranks[2].tp_fraction: must be in (0, 1], got 0.0"]),
    (dict(r2_tp_fraction=1.5), ["ranks[2].tp_fraction", "1.5"]),
    (dict(r1_shard_fraction=1.5), ["ranks[1].shard_fraction: must be in [0, 1] or None, got 1.5"]),
    (dict(r1_layers=(4, 2)), ["ranks[1].layers", "(4, 2)"]),
    (dict(r1_layers=(-1, 2)), ["ranks[1].layers", "(-1, 2)"]),
    (dict(r0_stage=-1), ["ranks[0].stage: must be >= 0, got -1"]),
    (dict(r0_tp_group=-1), ["ranks[0].tp_group: must be >= 0, got -1"]),
    (dict(g0_ranks=[0, 1, 5]), ["groups[0].ranks: rank 5 does not exist (the plan has ranks 0..2)"]),
    (dict(g0_ranks=[0, 1, 1, 2]), ["groups[0].ranks: rank 1 is listed 2 times"]),
    (dict(g0_ranks=[]), ["groups[0].ranks: must not be empty"]),
    (dict(g0_ranks=[0, 2]), ["groups[0].ranks: the 'dp' group must cover every rank; missing 1"]),
    (dict(g0_bucket_bytes=100), ["groups[0].bucket_bytes: must be >= 1024 (1 KiB), got 100"]),
    (dict(g0_sync_every=0), ["groups[0].sync_every: must be >= 1, got 0"]),
    (dict(g0_micro_batches=0), ["groups[0].micro_batches: must be >= 1, got 0"]),
    (dict(g0_outer_lr=0.0), ["groups[0].outer_lr: must be > 0, got 0.0"]),
    (dict(g0_outer_momentum=1.0), ["groups[0].outer_momentum: must be in [0, 1), got 1.0"]),
    (dict(g0_compression="fp4"), ["groups[0].compression: unknown wire format 'fp4'", "fp8e4m3"]),
    (dict(g0_compression="bf16:xy"), ["groups[0].compression: unknown suffix 'xy'"]),
    (dict(g0_compression="none:ef"), ["groups[0].compression: error feedback", "'none'"]),
    (dict(g0_name="all"), ["groups: a group named 'dp' is required (groups: 'all')"]),
    (dict(g0_name=""), ["groups[0].name: must not be empty"]),
])
def test_validation_errors(changes, fragments):
    assert_error(plan_with(**changes), *fragments)


def test_share_rounding_to_zero_samples():
    plan = Plan(3, 1, [RankPlan(0, 0.98), RankPlan(1, 0.01), RankPlan(2, 0.01)], [GroupPlan("dp", [0, 1, 2])])
    assert_error(plan, "ranks[1].batch_share: 0.01 of global_batch 3 rounds to 0 samples")


def test_rank_numbering_errors():
    plan = plan_with()
    plan.ranks[2].rank = 1
    assert_error(plan, "ranks: must be numbered 0..2 once each; missing 2; duplicated 1")
    plan.ranks[2].rank = 7
    assert_error(plan, "missing 2; out of range 7")
    plan.ranks[1].rank, plan.ranks[2].rank = 2, 1
    assert_error(plan, "ranks[1].rank: is 2; list the ranks in order 0..2")
    assert_error(Plan(4, 1, [], []), "ranks: the plan has no ranks")


def test_world_size_mismatch():
    assert_error(plan_with(), "plan has 3 ranks, the job has 4", world_size=4)
    assert plan_with().validate(3).world_size == 3


def test_duplicate_group_name():
    plan = plan_with()
    plan.groups.append(GroupPlan("dp", [0]))
    assert_error(plan, "groups[1].name: duplicate group name 'dp' (also groups[0])")


def test_compression_grammar_matches_hcomm_compress():
    compress = pytest.importorskip("hcomm.compress")
    assert set(WIRE_FORMATS) == set(compress.WIRE_DTYPES)
    for text in ("none", "BF16", "fp8e5m2:ef", " fp16 "):
        compress.parse(text)
        plan_with(g0_compression=text).validate()


def test_group_lookup():
    plan = full_plan()
    assert plan.group("island:a").compression == "bf16" and plan.dp_group().name == "dp"
    with pytest.raises(PlanError, match=r"no group named 'tp' \(the plan has: 'dp', 'island:a'\)"):
        plan.group("tp")


# --- reading errors ------------------------------------------------------------------

def test_unknown_keys_named_with_their_place():
    d = Plan.uniform(2, 4, 8).to_dict()
    d["groups"][0]["bucket_byts"] = 1024
    with pytest.raises(PlanError, match=r"groups\[0\]\.bucket_byts: unknown key \(known: name, ranks, bucket_bytes"):
        Plan.from_dict(d)
    d = Plan.uniform(2, 4, 8).to_dict()
    d["ranks"][1]["dtype"] = "bf16"
    with pytest.raises(PlanError, match=r"ranks\[1\]\.dtype: unknown key \(known: rank, batch_share"):
        Plan.from_dict(d)
    with pytest.raises(PlanError, match="global_batchh: unknown key"):
        Plan.from_dict({**Plan.uniform(2, 4, 8).to_dict(), "global_batchh": 4})


@pytest.mark.parametrize("yaml_text, fragment", [
    ("global_batch: four\nseq_len: 1\nshares: [1.0]", "global_batch: expected int, got 'four'"),
    ("global_batch: 4.5\nseq_len: 1\nshares: [1.0]", "global_batch: expected int, got 4.5"),
    ("global_batch: 4\nseq_len: true\nshares: [1.0]", "seq_len: expected int, got True"),
    ("global_batch: 4\nseq_len: 1\nshares: [half]", "ranks[0].batch_share: expected float, got 'half'"),
    ("global_batch: 4\nseq_len: 1\nshares: 1.0", "shares: expected a list, got 1.0"),
    ("global_batch: 4\nseq_len: 1\nranks: [{rank: 0, batch_share: 1, layers: [1, 2, 3]}]",
     "ranks[0].layers: expected 2 items, got [1, 2, 3]"),
    ("global_batch: 4\nseq_len: 1\nranks: [{rank: 0}]", "ranks[0]: missing required key 'batch_share'"),
    ("seq_len: 1\nshares: [1.0]", "plan: missing required key 'global_batch'"),
    ("global_batch: 4\nseq_len: 1\nshares: [1.0]\ngroups: [{name: dp, ranks: 0}]",
     "groups[0].ranks: expected a list, got 0"),
    ("global_batch: 4\nseq_len: 1\nshares: [1.0]\nnotes: [[1]]", "notes[0]: expected str, got [1]"),
    ("- 1\n- 2", "plan: expected a mapping"),
    ("global_batch: [4\n", "plan: not valid YAML"),
])
def test_wrong_types_named(yaml_text, fragment):
    with pytest.raises(PlanError) as info:
        Plan.from_yaml(yaml_text)
    assert fragment in str(info.value), str(info.value)


def test_load_names_the_path(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(PlanError, match=f"plan file {missing}: cannot read it"):
        Plan.load(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("global_batch: 4\nseq_len: 1\nshares: [0.5, 0.4]\n")
    with pytest.raises(PlanError, match=f"plan file {bad}: batch shares sum to 0.9"):
        Plan.load(str(bad))


# --- printing ------------------------------------------------------------------------

def test_str_has_every_rank_and_the_group_table():
    text = str(full_plan())
    lines = text.splitlines()
    assert lines[0] == "plan auto: 3 ranks, global batch 64 x seq 256, backend hcomm, predicted step 1.25 s"
    assert "dtype" in str(precision_plan()).splitlines()[1]
    assert "tp" in str(tp_plan()).splitlines()[1].split()
    for header in ("rank", "device", "island", "share", "samples", "zero"):
        assert header in lines[1]
    for rank, device in enumerate(("A100", "V100", "910B")):
        assert any(line.split()[:2] == [str(rank), device] for line in lines)
    assert "3 (0.7)" in text
    group_header = lines[lines.index("groups:") + 1]
    for header in ("name", "ranks", "bucket MiB", "compression", "sync every", "outer lr/mom",
                   "zero layout/prefetch"):
        assert header in group_header
    assert any(line.split()[:4] == ["dp", "0-2", "4", "fp8e4m3:ef"] for line in lines)
    assert "  - island b only reduces" in text
    text = str(pipeline_plan())
    lines = text.splitlines()
    assert "stage" in lines[1] and "layers" in lines[1] and "[3,8)" in text
    # every rank of a pipeline runs the replica's rows: the samples column says 64 on each
    assert [line.split()[2:4] for line in lines[2:5]] == [["0.0000", "64"]] * 2 + [["1.0000", "64"]]
    group_header = lines[lines.index("groups:") + 1]
    assert "micro x schedule" in group_header and "cuts" in group_header
    assert "4 x gpipe" in text and "0 3 8 9" in text


def test_str_hides_columns_at_their_defaults():
    lines = str(Plan.uniform(4, 8, 16)).splitlines()
    assert lines[1].split() == ["rank", "device", "share", "samples"]
    assert lines[-1].split() == ["dp", "0-3", "25", "none", "1"]
    assert "notes:" not in lines


# --- no torch ------------------------------------------------------------------------

def test_plan_loads_without_torch():
    # Stub packages with the right __path__ let the import system find hcomm/parallel/plan.py
    # without running hcomm/__init__.py (which loads torch and the C++ extension).
    code = f"""
import sys, types
sys.modules["torch"] = None
for name, path in (("hcomm", "hcomm"), ("hcomm.parallel", "hcomm/parallel")):
    package = types.ModuleType(name)
    package.__path__ = [{ROOT!r} + "/" + path]
    sys.modules[name] = package
from hcomm.parallel.plan import Plan
plan = Plan.from_shares([0.5, 0.3, 0.2], 7, 16, compression="fp8e4m3:ef")
assert Plan.from_yaml(plan.to_yaml()) == plan
assert "torch" not in {{m.split(".")[0] for m, v in sys.modules.items() if v is not None}}
print(plan.batch_counts())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[4, 2, 1]"
