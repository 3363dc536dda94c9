"""The comm model held to measurement (hcomm/parallel/calibration.py): the correction's arithmetic, the
setting's bad input, and a live discovery on 4 processes in two islands."""
import math

import pytest

from hcomm.parallel import calibration
from hcomm.parallel.calibration import CALIBRATION_BYTES, corrected
from tests.parallel import calibration_cases


def linear(nbytes):
    return 1e-3 + nbytes / 1e9


def test_correction_is_exact_at_the_calibration_sizes():
    fixed = corrected(linear, [40.0, 10.0, 2.5])
    for n, r in zip(CALIBRATION_BYTES, [40.0, 10.0, 2.5]):
        assert fixed(n) == pytest.approx(linear(n) * r, rel=1e-12)


def test_correction_interpolates_in_log_bytes_and_holds_at_the_ends():
    small, mid, large = CALIBRATION_BYTES
    fixed = corrected(linear, [40.0, 10.0, 2.5])
    between = int(math.sqrt(small * mid))   # halfway in log-bytes: the geometric mean of the two ratios
    assert fixed(between) == pytest.approx(linear(between) * math.sqrt(40.0 * 10.0), rel=1e-9)
    assert fixed(1024) == pytest.approx(linear(1024) * 40.0, rel=1e-12)
    assert fixed(1 << 30) == pytest.approx(linear(1 << 30) * 2.5, rel=1e-12)
    assert fixed(0) == pytest.approx(linear(0) * 40.0, rel=1e-12)


def test_no_correction_returns_the_model_itself():
    assert corrected(linear, [1.0, 1.0, 1.0]) is linear


def test_describe_names_every_curve_and_size():
    text = calibration.describe({"all_reduce": [2.0, 1.5, 1.0], "all_reduce@a100": [41.2, 9.55, 2.78],
                                 "p2p@intra": [12.5, 3.0], "host@intra": [0.35, 1.1]})
    assert text == ("collectives measured / predicted at 64 KiB/1 MiB/8 MiB: all_reduce 2.00/1.50/1.00; "
                    "all_reduce@a100 41.20/9.55/2.78; p2p@intra 12.50/3.00 (at 64 KiB/1 MiB); "
                    "host@intra 0.35/1.10 (ms at 64 KiB/1 MiB)")
    assert calibration.describe({"meeting@a100": [2.5]}) == (
        "collectives measured / predicted at 64 KiB/1 MiB/8 MiB: meeting@a100 2.50 (ms per meeting)")


def test_link_fit_goes_through_both_sizes():
    n1, n2 = calibration.P2P_BYTES
    alpha, beta = 2e-3, 1e8
    got = calibration._fit([alpha + n1 / beta, alpha + n2 / beta])
    assert got == (pytest.approx(alpha, rel=1e-9), pytest.approx(beta, rel=1e-9))
    # a larger message measured no slower: latency only, infinite bandwidth
    assert calibration._fit([3e-3, 2e-3]) == (3e-3, float("inf"))
    assert calibration.link_ratios((1e-3, 1e9), (2e-3, 1e9)) == [
        pytest.approx((2e-3 + n / 1e9) / (1e-3 + n / 1e9)) for n in calibration.P2P_BYTES]


def test_probe_pairs_are_the_link_probes():
    """Islands {0, 1, 2}, {3}, {4, 5}: ranks 0-1 and 4-5 probe their island (all at once), rank 0 probes
    each other island's first rank in turn; the lower rank of each pair leads."""
    from hcomm.profiling import probe_pairs
    from hcomm.topology import Topology

    topo = Topology(ranks=[], islands=[[0, 1, 2], [3], [4, 5]])
    assert probe_pairs(topo, 0) == [("intra", 0, 1, True), ("inter", 1, 3, True), ("inter", 2, 4, True)]
    assert probe_pairs(topo, 1) == [("intra", 0, 0, False)]
    assert probe_pairs(topo, 2) == []
    assert probe_pairs(topo, 3) == [("inter", 1, 0, False)]
    assert probe_pairs(topo, 4) == [("intra", 2, 5, True), ("inter", 2, 0, False)]
    assert probe_pairs(topo, 5) == [("intra", 2, 4, False)]


def test_cpu_share_of_a_free_process_is_at_most_one_core():
    assert 0.0 < calibration.cpu_share(0.05) <= 1.0


def test_a_collective_beside_computation_by_hand():
    from hcomm.parallel.planner.cost import beside_compute

    assert beside_compute(1.0, 0.0, 10.0, 1.0) == 1.0          # no slowdown measured
    assert beside_compute(1.0, 10.0, 10.0, 3.0) == 1.0         # starts after the computation
    assert beside_compute(1.0, 0.0, 10.0, 3.0) == 3.0          # all of it beside the computation
    # 1.5 s beside it do 0.5 s of the work, the other 0.5 s runs alone
    assert beside_compute(1.0, 0.0, 1.5, 3.0) == pytest.approx(2.0)


def test_negative_window_is_refused(monkeypatch):
    monkeypatch.setenv("HCOMM_CALIBRATE_S", "-1")
    with pytest.raises(ValueError, match="HCOMM_CALIBRATE_S must be >= 0 seconds, got -1"):
        calibration.window_s()


def test_unknown_collective_is_refused():
    with pytest.raises(ValueError, match="no calibration for collective 'broadcast'; known: .*ddp all_reduce"):
        calibration._call("broadcast", None, 1024)


def test_live_discovery_gives_every_rank_one_calibrated_view(pool4):
    out = pool4.run(calibration_cases.case_discover, ["a", "a", "b", "b"], 0.02)
    ratios, values, plain, plain_values, meetings, shares = out[0]
    for other in out[1:]:   # the same view everywhere: the slowest rank's mean is agreed by all
        assert other[0] == ratios
    names = {f"{op}{suffix}" for op in calibration.OPS for suffix in ("", "@a", "@b")}
    # torch's own all-reduce on the default group (the DDP baseline's), asked for by baseline=True
    assert set(ratios) == names | {"p2p@intra", "p2p@inter", "host@intra", "host@inter", calibration.BASELINE_OP,
                                   "all_reduce beside compute", "meeting@a", "meeting@b", "cpu share"}
    # every rank's share of a core, one value per rank, the view's own
    assert len(ratios["cpu share"]) == 4 and all(0 < s <= 1 for s in ratios["cpu share"])
    assert shares == (ratios["cpu share"], [])
    for name, rs in ratios.items():
        if name == "cpu share":
            continue
        sizes = calibration.P2P_BYTES if name.startswith(("p2p@", "host@")) else CALIBRATION_BYTES
        single = name == "all_reduce beside compute" or name.startswith("meeting@")
        assert len(rs) == (1 if single else len(sizes)), name
        if name.startswith("meeting@"):   # ms beyond the computation and the all-reduce: none or some
            low, high = calibration.MEETING_BOUNDS
            assert 1e3 * low <= rs[0] <= 1e3 * high, (name, rs)
            continue
        assert all(r > 0 for r in rs), (name, rs)
        if name == "all_reduce beside compute":
            assert calibration.OVERLAP_BOUNDS[0] <= rs[0] <= calibration.OVERLAP_BOUNDS[1]
        elif name.startswith("host@"):   # a message's share of its rank's time: under its one-way time
            assert all(0 < ms < 1e3 for ms in rs), (name, rs)
        elif not name.startswith("p2p@"):
            assert all(calibration.BOUNDS[0] <= r <= calibration.BOUNDS[1] for r in rs), (name, rs)
    # the view's curves (the baseline's ring included) are the model's times the measured ratio at each size
    for op, pairs in values.items():
        for (got, model), r in zip(pairs, ratios[op]):
            assert got == pytest.approx(model * r, rel=1e-9), op
    # with the window at 0 nothing is measured and the curves are the model's
    assert plain == {}
    assert plain_values == ([m for _, m in values["all_reduce"]], [m for _, m in values[calibration.BASELINE_OP]])
    assert meetings[0] == pytest.approx([ratios["meeting@a"][0] / 1e3, ratios["meeting@b"][0] / 1e3], rel=1e-12)
    assert meetings[1] == [0.0, 0.0]


def test_a_one_rank_island_times_nothing(pool4):
    """A lone rank's island (uneven's 910B) has no collective to time: its curves keep the model (no
    ratio; it hit the 500x bound before), the other island's are measured."""
    ratios = pool4.run(calibration_cases.case_discover, ["a", "a", "a", "b"], 0.02)[0][0]
    assert {f"{op}@a" for op in calibration.OPS} <= set(ratios)
    assert not [name for name in ratios if name.endswith("@b")]
