"""Multi-process: the direct API refuses arguments no tensor could have, with HCommValueError.

predict/plan with a negative (or non-integer, or int64-overflowing) byte
count, meta tensors (no data to send), and unknown compression specs, whose
message lists only the documented choices.
"""
import pytest
import torch

import hcomm
from hcomm import compress

META_MSG = ("hcomm: meta tensors have no data to communicate; "
            "materialise them on the CPU or a GPU first (e.g. with to_empty)")
FP4_MSG = ("HCOMM_COMPRESS: unknown wire dtype 'fp4'; expected one of none, bf16, fp16, fp8e4m3, fp8e5m2 "
           "(optionally with :ef)")


def _err(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return isinstance(e, hcomm.HCommValueError), str(e)
    return None


def case_sizes_and_devices(ctx):
    h, w = ctx.hcomm, ctx.world
    meta = torch.empty(4, device="meta")
    return {
        "predict_negative": _err(lambda: hcomm.predict("all_reduce", -1024, "ring", group=h)),
        "plan_negative": _err(lambda: hcomm.plan("all_reduce", -1, group=h)),
        "predict_float": _err(lambda: hcomm.predict("all_reduce", 1024.0, "ring", group=h)),
        "plan_overflow": _err(lambda: hcomm.plan("all_gather", 2**64, group=h)),
        "predict_zero": _err(lambda: hcomm.predict("all_reduce", 0, "ring", group=h)),
        "plan_ok": _err(lambda: hcomm.plan("all_gather", 2**40, group=h)),
        "meta_all_reduce": _err(lambda: hcomm.all_reduce(meta, group=h)),
        "meta_all_gather_output": _err(lambda: hcomm.all_gather(torch.empty(4 * w, device="meta"), torch.zeros(4),
                                                                group=h)),
        "meta_all_gather_v": _err(lambda: hcomm.all_gather_v(torch.zeros(4), meta, [1] * w, group=h)),
        "meta_all_to_all_v": _err(lambda: hcomm.all_to_all_v(meta, torch.zeros(4), [1] * w, [1] * w, group=h)),
        # Every rank passes the meta list: a rank that got past the check would wait for the others.
        "meta_gather_list": _err(lambda: hcomm.gather(torch.zeros(4), [meta] * w, dst=0, group=h)),
        "compress_fp4": _err(lambda: hcomm.set_compression("fp4", group=h)),
        "still_works": _err(lambda: hcomm.all_reduce(torch.zeros(2), group=h)),
    }


def test_direct_api_refuses_impossible_sizes_meta_tensors_and_unknown_wires(pool):
    for res in pool.run(case_sizes_and_devices):
        assert res.pop("predict_zero") is None and res.pop("plan_ok") is None and res.pop("still_works") is None
        assert all(err is not None and err[0] for err in res.values()), res  # every one an HCommValueError
        assert res["predict_negative"][1] == "hcomm.predict: nbytes is -1024; a byte count cannot be negative"
        assert res["plan_negative"][1] == "hcomm.plan: nbytes is -1; a byte count cannot be negative"
        assert res["predict_float"][1] == "hcomm.predict: nbytes must be an integer byte count, got 1024.0"
        assert res["plan_overflow"][1] == ("hcomm.plan: nbytes = 18446744073709551616 is too large: "
                                           "4 ranks x 4611686018427387904 elements overflow int64")
        for key in [k for k in res if k.startswith("meta_")]:
            assert res[key][1] == META_MSG, (key, res[key])
        assert res["compress_fp4"][1] == FP4_MSG


def test_compress_error_lists_only_the_documented_wires():
    with pytest.raises(ValueError) as info:
        compress.parse("fp4")
    assert str(info.value) == FP4_MSG
    assert "fp32" not in str(info.value)
    # Still accepted, as the undocumented alias of "none" that plan files use.
    assert compress.parse("fp32") == compress.parse("none")
