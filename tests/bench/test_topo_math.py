"""Pair scheduling and the alpha-beta fit of hcomm topo."""
import itertools

import pytest

from hcomm.bench.topo import fit_alpha_beta, matrices, rounds, tier_of, tier_summary


@pytest.mark.parametrize("n", range(2, 10))
@pytest.mark.parametrize("serial", [False, True])
def test_rounds_cover_every_pair_once_and_never_reuse_a_rank(n, serial):
    sched = rounds(n, serial)
    pairs = [p for r in sched for p in r]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))
    for r in sched:
        ranks = [x for p in r for x in p]
        assert len(ranks) == len(set(ranks))
    if not serial:
        assert len(sched) == (n - 1 if n % 2 == 0 else n)


def test_fit_recovers_alpha_and_beta():
    alpha, beta = 20e-6, 2e9
    t = lambda m: alpha + m / beta  # noqa: E731
    a, b = fit_alpha_beta(8, t(8), 4 << 20, t(4 << 20))
    assert a == pytest.approx(alpha) and b == pytest.approx(beta)


def test_fit_survives_noise_that_inverts_the_times():
    a, b = fit_alpha_beta(8, 1e-3, 1 << 20, 5e-4)
    assert b == pytest.approx((1 << 20) / 5e-4) and a >= 0


def test_tiers_follow_island_labels():
    labels = ["a", "a", "b"]
    links = {(0, 1): (1e-6, 10e9), (0, 2): (1e-4, 1e9), (1, 2): (2e-4, 3e9)}
    assert tier_of(labels, 0, 1) == "intra" and tier_of(labels, 1, 2) == "inter"
    tiers = tier_summary(links, labels)
    assert tiers["intra"]["pairs"] == 1 and tiers["inter"]["beta_gbps"] == [1.0, 3.0]
    alpha, beta = matrices(links, 3)
    assert alpha[2][1] == pytest.approx(200.0) and beta[1][0] == pytest.approx(10.0)
