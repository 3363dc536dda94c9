"""``hcomm train`` / ``hcomm plan`` argument errors: named, before any cluster comes up."""
import pytest

from hcomm.train.cli import MAIN_JOB, parse
from hcomm.train.plans import parse_entry


def _error(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_no_arguments_is_the_main_job():
    args = parse([])
    assert args.plan == "search,uniform" and args.picture == "hcomm-plans.png"
    assert parse(["--plan", "auto,uniform"]).picture is None
    assert (args.model, args.steps, args.global_batch, args.seq_len) == (
        MAIN_JOB["model"], MAIN_JOB["steps"], MAIN_JOB["global_batch"], MAIN_JOB["seq_len"])


def test_one_plan_does_not_compare():
    assert parse(["--plan", "auto"]).plan == "auto"


@pytest.mark.parametrize("argv, words", [
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--global-batch", "0"], "--global-batch must be >= 1, got 0"),
    (["--seq-len", "-3"], "--seq-len must be >= 1, got -3"),
    (["--lr", "0"], "--lr must be > 0"),
    (["--sync-every", "0"], "--sync-every must be >= 1, got 0"),
    (["--steps", "2", "--warmup-steps", "2"], "--warmup-steps must be in [0, steps)"),
    (["--data", "/no/such/corpus"], "--data /no/such/corpus: no such file or folder"),
    (["--dp-shares", "0.5,half"], "--dp-shares must be comma-separated numbers, got '0.5,half'"),
    (["--bucket-mb", "0.0001"], "--bucket-mb must be at least 1 KiB"),
    (["--plan", "fastest"], "'fastest' is not auto, search, equal, uniform or a readable plan file"),
    (["--plan", "auto@buckets=4"], "'buckets=4' is not KEY=VALUE with KEY one of bucket_mb"),
    (["--plan", "uniform@sync_every=8"], "pins other than zero and the pipeline's apply to auto and equal only"),
    (["--zero", "3", "--sync-every", "4"], "--zero 3 shards one optimizer over every rank; it cannot run with --sync-every 4"),
    (["--prefetch", "-1"], "--prefetch must be >= 0, got -1"),
    (["--model", "gpt-5"], "--model: unknown model config 'gpt-5'"),
    (["--compress", "fp4"], "--compress:"),
    # pipeline parallelism
    (["--pp", "0"], "--pp must be >= 1, got 0"),
    (["--pp", "2", "--microbatches", "5"], "--microbatches 5 does not divide --global-batch 24"),
    (["--pp", "-2"], "--pp must be >= 1, got -2"),
    (["--microbatches", "0"], "--microbatches must be >= 1, got 0"),
    (["--pp", "2", "--zero", "1"],
     "--pp 2 runs with plain data parallelism across replicas: not with --zero or --sync-every"),
    (["--pp", "2", "--sync-every", "4"],
     "--pp 2 runs with plain data parallelism across replicas: not with --zero or --sync-every"),
    (["--schedule", "bar"], "argument --schedule: invalid choice: 'bar'"),
    (["--plan", "auto@pp=x"], "--plan auto@pp=x: pp must be a positive integer, got 'x'"),
    (["--plan", "auto@pp=0"], "--plan auto@pp=0: pp must be a positive integer, got '0'"),
    (["--plan", "auto@microbatches=-1"], "--plan auto@microbatches=-1: microbatches must be a positive integer, "
                                         "got '-1'"),
    (["--plan", "auto@pp=2@split=foo"], "--plan auto@pp=2@split=foo: split must be auto, uniform or parameters, "
                                        "got 'foo'"),
    (["--plan", "auto@pp=2@schedule=bar"], "--plan auto@pp=2@schedule=bar: schedule must be gpipe, 1f1b or "
                                           "interleaved-1f1b, got 'bar'"),
    (["--plan", "auto,uniform@schedule=interleaved"], "--plan uniform@schedule=interleaved: schedule must be "
                                                     "gpipe, 1f1b or interleaved-1f1b, got 'interleaved'"),
    (["--plan", "auto@pipeline=2"], "'pipeline=2' is not KEY=VALUE with KEY one of bucket_mb"),
])
def test_bad_arguments_are_named(capsys, argv, words):
    assert words in _error(capsys, argv)


def test_plan_entries_parse():
    assert parse_entry("auto@bucket_mb=4@compress=bf16") == ("auto", {"bucket_mb": "4", "compress": "bf16"})
    assert parse_entry("uniform") == ("uniform", {})


def test_the_baseline_all_reduce_is_timed_only_when_a_plan_is_torch_ddp():
    """``uniform`` as data parallelism (ZeRO-1 too: DDP with a sharded optimizer) runs torch DDP over
    gloo; its pipelines, TP groups and ZeRO-2/3 (FSDP2) do not, and neither does any other plan."""
    from hcomm.train.plans import baseline_asked

    for plans, asked in (("search,uniform", True), ("auto,uniform@zero=1", True), ("auto,equal", False),
                         ("uniform@pp=2,uniform@tp=2,uniform@zero=3", False)):
        assert baseline_asked(parse(["--plan", plans])) is asked, plans
    assert baseline_asked(parse([])) is True                          # the main job's baseline
    assert baseline_asked(parse(["--plan", "uniform", "--pp", "2"])) is False


def test_pipeline_arguments_parse():
    args = parse(["--pp", "2", "--schedule", "gpipe", "--microbatches", "4", "--plan", "auto,uniform"])
    assert (args.pp, args.schedule, args.microbatches) == (2, "gpipe", 4)
    assert parse_entry("auto@pp=2@split=parameters@schedule=interleaved-1f1b@microbatches=8") == (
        "auto", {"pp": "2", "split": "parameters", "schedule": "interleaved-1f1b", "microbatches": "8"})
    assert parse_entry("uniform@pp=4@zero=0") == ("uniform", {"pp": "4", "zero": "0"})


def _view(world):
    """Equal speeds on synthetic 9-piece profiles (tests/parallel/test_plan_pipeline.py; planning only)."""
    from tests.parallel.test_plan_pipeline import view

    return view([1.0] * world)


@pytest.mark.parametrize("argv, words", [
    (["--plan", "auto@pp=2@zero=1"], "--plan auto@pp=2@zero=1: a pipeline runs as auto or uniform, without zero or "
                                     "sync_every"),
    (["--plan", "auto@pp=2@sync_every=4"], "a pipeline runs as auto or uniform, without zero or sync_every"),
    (["--plan", "equal@pp=2"], "--plan equal@pp=2: a pipeline runs as auto or uniform"),
    (["--pp", "3", "--plan", "auto"], "--pp 3: the 4 ranks do not form equal pipelines of 3 stages"),
    (["--plan", "auto@pp=2@microbatches=5"], "--microbatches 5 does not divide --global-batch 24"),
    (["--plan", "auto@pp=16"], "--pp 16: the model has only 9 pieces"),
    (["--pp", "2", "--dp-shares", "0.7,0.1,0.1,0.1", "--plan", "auto"], "--dp-shares / @shares do not apply with --pp"),
    (["--plan", "auto@pp=2@shares=equal"], "--dp-shares / @shares do not apply with --pp"),
])
def test_pipeline_plans_refused_when_planned(argv, words):
    """Combinations that depend on the cluster (rank count, pieces) or on a pin are refused when planned.
    (The synthetic profiles have 9 pieces, hence "only 9 pieces" for the tiny model here.)"""
    from hcomm.train.plans import make_plans

    args = parse(["--model", "tiny", *argv])
    with pytest.raises(ValueError) as info:
        make_plans(args, _view(4))
    assert words in str(info.value)


def test_every_plan_is_named_by_its_entry():
    """The DDP baseline too: ``uniform`` and ``uniform@pp=1`` next to a ``--pp 2`` uniform pipeline, or
    ``uniform@zero=1``, are told apart in the report and the JSON."""
    from hcomm.train.plans import make_plans

    args = parse(["--model", "tiny", "--pp", "2", "--plan", "uniform,uniform@pp=1,auto,auto@pp=1"])
    plans = make_plans(args, _view(4))
    assert [p.name for p in plans] == ["uniform", "uniform@pp=1", "auto", "auto@pp=1"]
    assert [bool(p.pipeline_groups()) for p in plans] == [True, False, True, False]
    assert plans[1].backend == "ddp-gloo"
    zero = make_plans(parse(["--model", "tiny", "--plan", "uniform,uniform@zero=1"]), _view(4))
    assert [p.name for p in zero] == ["uniform", "uniform@zero=1"]


def test_pipeline_replicas_compress_their_gradient_sync():
    """``--compress`` and ``@compress`` reach the dp group of a pipeline plan (the stage replicas' all-reduce)."""
    from hcomm.train.plans import make_plans

    args = parse(["--model", "tiny", "--pp", "2", "--compress", "bf16", "--plan", "auto,auto@compress=fp16"])
    plans = make_plans(args, _view(4))
    assert [p.dp_group().compression for p in plans] == ["bf16", "fp16"]


# --- tensor parallelism -----------------------------------------------------------------------------

TP_ALONE = "runs with data parallelism or pipelines across TP groups: not with --zero or --sync-every (yet)"


@pytest.mark.parametrize("argv, words", [
    (["--tp", "0"], "--tp must be >= 1, got 0"),
    (["--tp", "-2"], "--tp must be >= 1, got -2"),
    (["--tp", "2", "--pp", "2", "--sequence-parallel"], "--sequence-parallel does not run with --pp"),
    (["--tp", "2", "--zero", "1"], "--tp 2 " + TP_ALONE),
    (["--tp", "4", "--sync-every", "4"], "--tp 4 " + TP_ALONE),
    (["--plan", "auto@tp=0"], "--plan auto@tp=0: tp must be a positive integer, got '0'"),
    (["--plan", "auto@tp=two"], "--plan auto@tp=two: tp must be a positive integer, got 'two'"),
])
def test_bad_tensor_parallel_arguments_are_named(capsys, argv, words):
    assert words in _error(capsys, argv)


TP_PLAIN = "tensor parallelism runs as auto or uniform, without zero or sync_every"
PP_TP_PLAIN = ("a pipeline of TP groups runs as auto or uniform, without zero, sync_every or sequence "
               "parallelism")


@pytest.mark.parametrize("argv, words", [
    (["--tp", "3", "--plan", "auto"], "--tp 3: the 4 ranks do not form equal tensor-parallel groups of 3"),
    (["--plan", "auto@tp=8"], "--tp 8: the 4 ranks do not form equal tensor-parallel groups of 8"),
    (["--plan", "auto@tp=2@zero=1"], "--plan auto@tp=2@zero=1: " + TP_PLAIN),
    (["--plan", "auto@tp=2@pp=2@zero=1"], "--plan auto@tp=2@pp=2@zero=1: " + PP_TP_PLAIN),
    (["--plan", "auto@tp=2@pp=2@sp=1"], "--plan auto@tp=2@pp=2@sp=1: " + PP_TP_PLAIN),
    (["--plan", "auto@tp=2@sync_every=4"], "--plan auto@tp=2@sync_every=4: " + TP_PLAIN),
    (["--plan", "equal@tp=2"], "--plan equal@tp=2: " + TP_PLAIN),
    (["--tp", "2", "--dp-shares", "0.7,0.1,0.1,0.1", "--plan", "auto"],
     "--plan auto: a TP group's rows come from the planner; --dp-shares / @shares do not apply with --tp"),
    (["--plan", "auto@tp=2@shares=equal"], "--dp-shares / @shares do not apply with --tp"),
])
def test_tensor_parallel_plans_refused_when_planned(argv, words):
    from hcomm.train.plans import make_plans

    args = parse(["--model", "tiny", *argv])
    with pytest.raises(ValueError) as info:
        make_plans(args, _view(4))
    assert words in str(info.value)


def test_tensor_parallel_plans_are_named_by_their_entry():
    from hcomm.train.plans import make_plans

    args = parse(["--model", "tiny", "--tp", "2", "--plan", "auto,uniform,auto@tp=4,uniform@tp=1"])
    assert args.tp == 2
    plans = make_plans(args, _view(4))
    assert [p.name for p in plans] == ["auto", "uniform", "auto@tp=4", "uniform@tp=1"]
    assert [len(p.tensor_groups()) for p in plans] == [2, 2, 1, 0]
    assert plans[3].backend == "ddp-gloo" and {p.backend for p in plans[:3]} == {"hcomm"}


def test_tensor_parallel_plan_that_cannot_split_the_model_is_refused_when_planned():
    """tiny has 4 key/value heads: 8 TP ranks would leave some without one (refused before any rank runs)."""
    from hcomm.train.plans import make_plans

    with pytest.raises(ValueError) as info:
        make_plans(parse(["--model", "tiny", "--tp", "8", "--plan", "auto"]), _view(8))
    assert "4 key/value heads make 4 units of 1: fewer than the 8 TP ranks, so a rank would hold none" \
        in str(info.value)


def test_plan_help_names_plan_and_its_offline_mode(capsys):
    from hcomm.train.plan_cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert out.startswith("hcomm plan: the plan hcomm train would run") and "hcomm plan --offline --help" in out
    assert "usage: hcomm plan " in out and "usage: hcomm train" not in out and "--cluster CLUSTER" in out
