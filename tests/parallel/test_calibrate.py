"""``hcomm calibrate``: per-piece deviation of each compute dtype from fp32 (one process, tiny model)."""
import pytest

from hcomm.models import build_model, get_config
from hcomm.parallel.calibrate import calibrate, format_report, main


@pytest.fixture(scope="module")
def result():
    model = build_model(get_config("tiny"), vocab_size=256, seed=0)
    return calibrate(model, ["bf16", "fp16"], micro_batch=2, seq_len=16, vocab_size=256)


def test_every_piece_and_dtype_is_measured(result):
    names = [r.piece for r in result["pieces"] if r.dtype == "bf16"]
    assert names == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "head"]
    assert [r.dtype for r in result["pieces"]] == ["bf16"] * 7 + ["fp16"] * 7


def test_deviations_are_those_of_the_dtype(result):
    """The blocks' matmuls run in the low dtype: errors near its unit roundoff (bf16 2^-8 = 3.9e-3,
    fp16 2^-11 = 4.9e-4), above zero (autocast was on) and well below 1; bf16 strays more than fp16."""
    blocks = {d: [r.output_rel for r in result["pieces"] if r.dtype == d and r.piece.startswith("blocks")]
              for d in ("bf16", "fp16")}
    assert all(1e-6 < x < 2e-2 for x in blocks["bf16"] + blocks["fp16"]), blocks
    assert min(blocks["bf16"]) > max(blocks["fp16"])
    embed = [r for r in result["pieces"] if r.piece == "embed"]
    assert all(r.output_rel == 0.0 for r in embed)   # a lookup: no arithmetic to round
    for dtype, e in result["end_to_end"].items():
        assert 0.0 < e["loss_rel"] < 1e-2 and 0.0 < e["logits_rel"] < 5e-2, (dtype, e)


def test_report_and_command(result, capsys):
    text = format_report(result, "A100")
    assert "blocks.0" in text and "end to end" in text
    assert main(["--device", "V100", "--seq-len", "8", "--vocab", "128"]) == 0
    out = capsys.readouterr().out
    assert "V100" in out and " fp16 " in out and " bf16 " not in out   # the V100 row set is fp16 only
    assert main(["--device", "V100", "--dtypes", "bf16"]) == 2
    assert "V100 cannot compute in bf16" in capsys.readouterr().err
