"""Pareto fronts and headline ratios (sweep/fronts.py) on synthetic curves with known answers."""

import pytest

from trtllm_dflash.sweep import fronts
from trtllm_dflash.sweep.fronts import Curve

# AR: fast per user at low concurrency, low throughput; (tok/s/user, tok/s/GPU) per concurrency.
AR = Curve("AR", [(600, 75), (550, 140), (480, 240), (380, 380), (250, 500)], labels=[1, 2, 4, 8, 16])
# DFlash: faster per user and higher throughput over the same range, plus a dominated point (c=32).
DFL = Curve("DFlash", [(1400, 175), (1300, 325), (1100, 550), (800, 800), (500, 1000), (450, 900)],
            labels=[1, 2, 4, 8, 16, 32])


def test_front_drops_dominated_points_and_sorts_by_user_rate():
    assert fronts.front(DFL.points) == [(500, 1000), (800, 800), (1100, 550), (1300, 325), (1400, 175)]
    assert fronts.pareto_front([(1, 1), (1, 1)]) == [0, 1]  # ties do not dominate each other
    assert fronts.front([(1, 1), (1, 1)]) == [(1.0, 1.0)]
    assert fronts.front([]) == [] and fronts.max_user_rate([]) is None


def test_metrics_keeps_pareto_front_importable():
    from trtllm_dflash.sweep.metrics import pareto_front

    assert pareto_front is fronts.pareto_front


def test_throughput_is_interpolated_linearly_on_the_front_and_undefined_outside():
    assert fronts.throughput_at(AR.points, 380) == pytest.approx(380)
    # Halfway between (380, 380) and (480, 240).
    assert fronts.throughput_at(AR.points, 430) == pytest.approx(310)
    assert fronts.throughput_at(AR.points, 601) is None and fronts.throughput_at(AR.points, 249) is None
    # The dominated DFlash point (450, 900) is not on the front: 450 is below the front's range.
    assert fronts.throughput_at(DFL.points, 450) is None
    assert fronts.throughput_at([(10, 5)], 10) == 5 and fronts.throughput_at([(10, 5)], 11) is None


def test_ratios_at_equal_user_rate_over_the_overlap():
    assert fronts.overlap(DFL.points, AR.points) == (500, 600)
    ratios = dict(fronts.throughput_ratios(DFL.points, AR.points))
    # Evaluated at the front points inside the overlap and at its edges.
    assert sorted(ratios) == [500, 550, 600]
    # At 550: DFlash front between (500, 1000) and (800, 800) -> 966.67; AR front point 140.
    assert ratios[550] == pytest.approx((1000 - 200 / 6) / 140)
    assert ratios[600] == pytest.approx((1000 - 200 / 3) / 75)
    lo, hi = fronts.band_ratio(DFL.points, AR.points, 500, 600)
    assert lo == pytest.approx(min(ratios.values())) and hi == pytest.approx(max(ratios.values()))
    # Explicit rates: those outside the overlap are left out.
    assert [x for x, _ in fronts.throughput_ratios(DFL.points, AR.points, [450, 520, 700])] == [520]


def test_fronts_that_do_not_overlap_have_no_ratio():
    slow = Curve("slow", [(100, 50), (80, 90)])
    assert fronts.overlap(DFL.points, slow.points) is None
    assert fronts.throughput_ratios(DFL.points, slow.points) == []
    assert fronts.band_ratio(DFL.points, slow.points, 0, 10_000) is None
    # A band outside an existing overlap is None too.
    assert fronts.band_ratio(DFL.points, AR.points, 700, 900) is None
    c = fronts.compare(DFL, slow, bands=[(500, 600)])
    assert c.throughput_ratios == [] and c.overlap is None and c.bands == {"500-600": None}
    assert c.max_user_rate == {"DFlash": 1400, "slow": 100}


def test_user_rate_ratio_at_equal_labels_and_the_comparison():
    r = fronts.user_rate_ratios(DFL, AR)
    assert list(r) == [1, 2, 4, 8, 16]  # c=32 has no AR partner
    assert r[1] == pytest.approx(1400 / 600) and r[16] == pytest.approx(500 / 250)
    c = fronts.compare(DFL, AR, bands=[(500, 600)])
    assert c.max_user_rate == {"DFlash": 1400, "AR": 600}
    assert c.bands["500-600"] == fronts.band_ratio(DFL.points, AR.points, 500, 600)
    j = c.to_json()
    assert j["tok_s_user_ratio_at_equal_label"]["16"] == pytest.approx(2.0)
    assert j["overlap_tok_s_user"] == [500, 600]


def test_curve_checks_its_labels():
    with pytest.raises(ValueError, match="2 labels for 1 points"):
        Curve("x", [(1, 2)], labels=[1, 2])
