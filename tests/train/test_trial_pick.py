"""Which trial candidate trains: the fastest measured, and among near ties the faster predicted."""
import pytest

from hcomm.train.trial import TIE_WITHIN, pick


def test_a_near_tie_goes_to_the_faster_predicted():
    # uneven, 2026-12-07: pp=2 1769 ms (predicted 1608), pp=2 x tp=3 1756 (1999), tp=3 2186 (2022), dp 3027
    # (2526).  1756 and 1769 are 0.7 % apart: a tie, and pp=2 is predicted faster (it then trained at
    # 1433-1464 ms, the other at 1750).
    assert pick([1.769, 1.756, 2.186, 3.027], [1.608, 1.999, 2.022, 2.526]) == 0


def test_a_clear_winner_is_taken_whatever_its_prediction():
    # the main job's trial, 2026-12-07: 12 one-sample micro-batches 1718 ms (predicted 1261), the same
    # pipeline with at most 3 micro-batches 1325 (1328): 30 % apart, the measurement decides
    assert pick([1.718, 1.855, 1.831, 1.688, 1.325], [1.261, 1.636, 1.736, 1.839, 1.328]) == 4


@pytest.mark.parametrize("gap, expect", [(TIE_WITHIN * 0.99, 1), (TIE_WITHIN * 1.01, 0)])
def test_the_tie_ends_at_tie_within(gap, expect):
    # plan 1 predicted faster and measured ``gap`` slower than plan 0: a tie just inside, not just outside
    assert pick([1.0, 1.0 + gap], [2.0, 1.0]) == expect


def test_equal_predictions_fall_back_to_the_measurement():
    assert pick([1.01, 1.0, 1.02], [1.5, 1.5, 1.5]) == 1
