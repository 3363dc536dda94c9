"""The picture of a plan: which device computes which pieces, with how many samples, in which dtype."""
from hcomm.parallel.plan import GroupPlan, Plan, RankPlan
from hcomm.parallel.profile import LayerCost
from hcomm.train.plan_picture import draw, rank_labels, spans


def _pieces(n=7):
    return [LayerCost(name, 1e-3, 2e-3, 4, 4, 8, 16)
            for name in ["embed", *(f"block{i}" for i in range(n - 3)), "norm", "head"]]


def _pipeline_of_tp_groups() -> Plan:
    ranks = [RankPlan(0, 1.0, device="A100", stage=0, tp_group=0, tp_fraction=0.6, compute_dtype="bf16"),
             RankPlan(1, 0.0, device="V100", stage=0, tp_group=0, tp_fraction=0.4, compute_dtype="fp16"),
             RankPlan(2, 0.0, device="A100", stage=1, tp_group=1, tp_fraction=0.5),
             RankPlan(3, 0.0, device="A100", stage=1, tp_group=1, tp_fraction=0.5)]
    groups = [GroupPlan("dp", [0, 1, 2, 3]), GroupPlan("tp:0", [0, 1]), GroupPlan("tp:1", [2, 3]),
              GroupPlan("pp:0", [0, 2], micro_batches=2, cuts=[0, 3, 7]),
              GroupPlan("pp:1", [1, 3], micro_batches=2, cuts=[0, 3, 7])]
    return Plan(8, 16, ranks, groups, name="pp2 tp2").validate()


def test_labels_and_spans_say_who_computes_what():
    plan = _pipeline_of_tp_groups()
    assert rank_labels(plan) == ["stage 1/2, 8 samples in 2 x 1f1b, bf16, TP 0.60",
                                 "stage 1/2, 8 samples in 2 x 1f1b, fp16, TP 0.40",
                                 "stage 2/2, 8 samples in 2 x 1f1b, fp32, TP 0.50",
                                 "stage 2/2, 8 samples in 2 x 1f1b, fp32, TP 0.50"]
    assert [spans(plan, r, 7) for r in range(4)] == [[(0, 3)], [(0, 3)], [(3, 7)], [(3, 7)]]
    dp = Plan.from_shares([0.75, 0.25], 8, 16, name="dp")
    dp.ranks[1].zero_stage, dp.ranks[1].shard_fraction = 3, 0.25
    assert rank_labels(dp) == ["6 samples, fp32", "2 samples, fp32, ZeRO-3 0.25"]
    assert spans(dp, 0, 7) == [(0, 7)]


def test_interleaved_chunks_are_drawn_where_they_run():
    ranks = [RankPlan(0, 1.0, stage=0), RankPlan(1, 0.0, stage=1)]
    groups = [GroupPlan("dp", [0, 1]), GroupPlan("pp:0", [0, 1], micro_batches=2, schedule="interleaved-1f1b",
                                                  virtual_stages=2, cuts=[0, 2, 4, 5, 7])]
    plan = Plan(4, 16, ranks, groups).validate()
    assert spans(plan, 0, 7) == [(0, 2), (4, 5)] and spans(plan, 1, 7) == [(2, 4), (5, 7)]


def test_draw_writes_one_png_for_several_plans(tmp_path):
    path = tmp_path / "plans.png"
    draw(str(path), [_pipeline_of_tp_groups(), Plan.uniform(4, 8, 16)], _pieces(), ["a", "a", "b", "b"])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
