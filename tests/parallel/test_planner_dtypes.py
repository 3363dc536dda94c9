"""``--precision search``: each kind's dtype chosen by its measured profiles (``planner.dtypes``)."""
import dataclasses

import pytest

from hcomm.parallel.planner import dtypes as per_device
from hcomm.parallel.planner.search import search
from hcomm.train.plans import parse_entry
from tests.parallel.test_simulate import DIM, SEQ, MiB, profile, view

KW = dict(dim=DIM, kv_heads=2)

KINDS = ["A100", "A100", "V100", "V100"]   # low precision: bf16 on the A100s, fp16 on the V100s


def two_dtypes(low_speeds, act_fp32=MiB, act_low=MiB, budget=8 << 30):
    """4 ranks at speed 1 in fp32; in low precision at ``low_speeds`` (per rank); activations per piece
    and sample ``act_fp32`` / ``act_low``."""
    def with_act(p, act, dtype):
        return dataclasses.replace(p, layers=[dataclasses.replace(c, act_bytes_per_sample=act) for c in p.layers],
                                   memory_budget_bytes=budget, compute_dtype=dtype)

    v = view([1.0] * 4)
    low = [with_act(profile(r, s), act_low, d) for r, (s, d) in enumerate(zip(low_speeds, ["bf16"] * 2 + ["fp16"] * 2))]
    return dataclasses.replace(v, devices=KINDS, profiles=[with_act(p, act_fp32, "fp32") for p in v.profiles],
                               low_precision_profiles=low)


def test_each_kind_takes_the_dtype_it_measured_faster():
    """The A100s' bf16 measured 4x faster than fp32, the V100s' fp16 2x slower: the A100s compute in bf16,
    the V100s in fp32, and that assignment's plan is the search's best on those profiles."""
    v = two_dtypes([4.0, 4.0, 0.5, 0.5])
    totals = per_device.kind_totals(v)   # 0.72 s per sample per rank at speed 1, summed over 2 ranks
    assert totals["A100"] == pytest.approx((1.44, 0.36)) and totals["V100"] == pytest.approx((1.44, 2.88))
    assert [label for label, _ in per_device.assignments(v)] == ["fp32", "faster per kind", "low everywhere"]
    result, dtypes, notes = per_device.search_dtypes(v, 8, SEQ, **KW)
    assert dtypes == ["bf16", "bf16", "fp32", "fp32"]
    alone = {label: search(per_device.view_in(v, d), 8, SEQ, **KW).best.step_s for label, d in per_device.assignments(v)}
    assert result.best.step_s == alone["faster per kind"] < min(alone["fp32"], alone["low everywhere"])
    assert notes[0] == ("dtype per device (profiled fp32 vs low precision, fwd+bwd ms per sample summed over the "
                        "kind's ranks): A100 1440.0 vs 360.0, V100 1440.0 vs 2880.0")
    assert notes[1].startswith("dtypes searched: fp32 (A100 fp32, V100 fp32): ") and \
        notes[1].endswith("; chose faster per kind")
    plan = result.best.plan
    per_device.apply(plan, dtypes)
    assert [r.compute_dtype for r in plan.validate(4).ranks] == dtypes


def test_low_precision_everywhere_wins_where_only_it_fits():
    """Low precision slower on every kind, but fp32's activations (100 MiB per piece and sample) fit no
    rank's 40 MiB in any shape; low precision's (2 MiB) fit plain DP: that plan wins, fp32 says why not."""
    v = two_dtypes([0.5] * 4, act_fp32=100 * MiB, act_low=2 * MiB, budget=40 * MiB)
    assert [label for label, _ in per_device.assignments(v)] == ["fp32", "low everywhere"]
    result, dtypes, notes = per_device.search_dtypes(v, 4, SEQ, **KW)
    assert dtypes == ["bf16", "bf16", "fp16", "fp16"] and result.best.usable
    assert "fp32 (A100 fp32, V100 fp32): no plan fits" in notes[1] and notes[1].endswith("; chose low everywhere")


def test_equal_speeds_keep_fp32():
    v = two_dtypes([1.0] * 4)
    _, dtypes, notes = per_device.search_dtypes(v, 8, SEQ, **KW)
    assert dtypes == ["fp32"] * 4 and notes[1].endswith("; chose fp32")


def test_bad_input_is_named():
    v = view([1.0] * 2)
    with pytest.raises(ValueError, match=r"--precision search needs every rank's low-precision profile; the view "
                                         r"has 0 of 2"):
        per_device.search_dtypes(v, 4, SEQ, **KW)
    with pytest.raises(ValueError, match=r"precision=search chooses dtypes with the joint search; use "
                                         r"search@precision=search"):
        parse_entry("auto@precision=search")
    assert parse_entry("search@precision=search") == ("search", {"precision": "search"})
