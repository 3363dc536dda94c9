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
    assert args.plan == "auto,uniform"
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
    (["--plan", "fastest"], "'fastest' is not auto, equal, uniform or a readable plan file"),
    (["--plan", "auto@buckets=4"], "'buckets=4' is not KEY=VALUE with KEY one of bucket_mb"),
    (["--plan", "uniform@sync_every=8"], "pins other than zero apply to auto and equal only"),
        (["--zero", "3", "--sync-every", "4"], "--zero 3 shards one optimizer over every rank; it cannot run with --sync-every 4"),
        (["--prefetch", "-1"], "--prefetch must be >= 0, got -1"),
    (["--model", "gpt-5"], "--model: unknown model config 'gpt-5'"),
    (["--compress", "fp4"], "--compress:"),
])
def test_bad_arguments_are_named(capsys, argv, words):
    assert words in _error(capsys, argv)


def test_plan_entries_parse():
    assert parse_entry("auto@bucket_mb=4@compress=bf16") == ("auto", {"bucket_mb": "4", "compress": "bf16"})
    assert parse_entry("uniform") == ("uniform", {})
