"""Property tests for `veloxquant_mlx.allocators`: exact sums, floors, caps, monotonicity, uniform cases."""
import math, pytest
from hypothesis import given, settings, assume, strategies as st, HealthCheck
from veloxquant_mlx.allocators import allocate_exact, pyramid_budgets, squeeze_budgets

FAST = settings(max_examples=2000, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])

def caps_for(draw, n_layers, floor, avg):
    "`None`, or per-layer caps (some `None`) between the floor and well above the average."
    if not draw(st.booleans()): return None
    return draw(st.lists(st.one_of(st.none(), st.integers(floor, floor + 3 * avg)), min_size=n_layers, max_size=n_layers))

@st.composite
def pyramid_args(draw):
    n_layers = draw(st.integers(0, 64)); n_sink = draw(st.integers(0, 16))
    avg = draw(st.integers(n_sink + 1, 4096))
    beta = draw(st.one_of(st.just(1.0), st.just(2.0), st.floats(1.0, 20.0, allow_nan=False)))
    return n_layers, avg, n_sink, beta, caps_for(draw, n_layers, n_sink + 1, avg)

concentration = st.one_of(st.floats(-1.0, 1.0, allow_nan=False), st.sampled_from([0.0, 1.0, -1.0, 0.5]))

@st.composite
def squeeze_args(draw):
    conc = draw(st.lists(concentration, min_size=0, max_size=64))
    n_sink = draw(st.integers(0, 16)); avg = draw(st.integers(n_sink + 1, 4096))
    strength = draw(st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0)))
    return conc, avg, n_sink, strength, caps_for(draw, len(conc), n_sink + 1, avg)

def check_common(budgets, n_layers, avg, floor, caps):
    "Exact sum (or all at cap when the caps cannot hold the total), floors, caps, integer type."
    assert len(budgets) == n_layers and all(type(b) is int for b in budgets)
    caps = caps or [None] * n_layers
    assert all(b >= floor for b in budgets)
    assert all(c is None or b <= c for b, c in zip(budgets, caps))
    if None not in caps and sum(caps) < n_layers * avg: assert budgets == caps
    else: assert sum(budgets) == n_layers * avg

def uncapped(caps, n_layers): return [i for i in range(n_layers) if caps is None or caps[i] is None]

@FAST
@given(pyramid_args())
def test_pyramid_exact_floor_caps_monotone(args):
    n_layers, avg, n_sink, beta, caps = args
    budgets = pyramid_budgets(n_layers, avg, n_sink, beta, caps)
    check_common(budgets, n_layers, avg, n_sink + 1, caps)
    free = [budgets[i] for i in uncapped(caps, n_layers)]
    assert free == sorted(free, reverse=True), "deeper uncapped layers never get more"

@FAST
@given(squeeze_args())
def test_squeeze_exact_floor_caps_monotone(args):
    conc, avg, n_sink, strength, caps = args
    budgets = squeeze_budgets(conc, avg, n_sink, strength, caps)
    check_common(budgets, len(conc), avg, n_sink + 1, caps)
    free = uncapped(caps, len(conc))
    for i in free:
        for j in free:
            if conc[i] > conc[j]: assert budgets[i] <= budgets[j], "higher concentration never gets more"

@FAST
@given(st.integers(0, 64), st.integers(0, 16), st.integers(0, 4096))
def test_beta_one_is_uniform(n_layers, n_sink, extra):
    avg = n_sink + 1 + extra
    assert pyramid_budgets(n_layers, avg, n_sink, 1.0) == [avg] * n_layers

@FAST
@given(st.lists(concentration, max_size=64), st.integers(0, 16), st.integers(0, 4096))
def test_strength_zero_and_saturated_are_uniform(conc, n_sink, extra):
    avg = n_sink + 1 + extra
    assert squeeze_budgets(conc, avg, n_sink, 0.0) == [avg] * len(conc)
    assert squeeze_budgets([1.0] * len(conc), avg, n_sink, 1.0) == [avg] * len(conc)

@FAST
@given(st.lists(st.one_of(st.integers(0, 1000), st.floats(0, 1e6)), max_size=40), st.integers(0, 50),
       st.integers(0, 5000), st.data())
def test_allocate_exact_properties(weights, floor, extra, data):
    total = floor * len(weights) + extra
    caps = data.draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(floor, floor + 500)),
                                                   min_size=len(weights), max_size=len(weights))))
    budgets = allocate_exact(weights, total, floor, caps)
    caps_ = caps or [None] * len(weights)
    assert all(floor <= b and (c is None or b <= c) for b, c in zip(budgets, caps_))
    if None not in caps_ and sum(caps_) <= total: assert budgets == caps_
    else: assert sum(budgets) == total
    # monotone in weight among uncapped layers, and within one token of the exact (uncapped, unfloored) share
    free = [i for i in range(len(weights)) if caps_[i] is None]
    for i in free:
        for j in free:
            if weights[i] > weights[j]: assert budgets[i] >= budgets[j]
    if caps is None and weights and sum(weights) > 0 and floor == 0:
        for w, b in zip(weights, budgets): assert abs(b - total * w / sum(weights)) < 1 + 1e-9

@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=20), st.integers(1, 10), st.data())
def test_allocate_exact_proportional_when_divisible(weights, scale, data):
    "Integer weights whose shares are whole numbers come back exactly scaled."
    total = sum(weights) * scale
    assert allocate_exact(weights, total, 0) == [w * scale for w in weights]

def test_worked_examples():
    assert pyramid_budgets(12, 512, 4, 2.0) == [1019, 927, 835, 742, 650, 558, 466, 374, 282, 189, 97, 5]
    assert squeeze_budgets([0.1, 0.5, 0.9], 100, 4, 1.0) == [180, 100, 20]
    assert pyramid_budgets(0, 512) == [] and squeeze_budgets([], 512) == []
    assert pyramid_budgets(1, 512) == [512] and pyramid_budgets(1, 512, caps=[64]) == [64]

@pytest.mark.parametrize('call, message', [
    (lambda: pyramid_budgets(-1, 512), r"`n_layers` must be an integer >= 0, got -1"),
    (lambda: pyramid_budgets(2.5, 512), r"`n_layers` must be an integer >= 0, got 2\.5"),
    (lambda: pyramid_budgets(True, 512), r"`n_layers` must be an integer >= 0, got True"),
    (lambda: pyramid_budgets(4, 512.0), r"`avg_budget` must be an integer >= 5, got 512\.0"),
    (lambda: pyramid_budgets(4, 4, n_sink=4), r"`avg_budget` must be an integer >= 5, got 4"),
    (lambda: pyramid_budgets(4, 512, n_sink=-1), r"`n_sink` must be an integer >= 0, got -1"),
    (lambda: pyramid_budgets(4, 512, beta=0.99), r"`beta` must be a finite number >= 1\.0, got 0\.99"),
    (lambda: pyramid_budgets(4, 512, beta=math.nan), r"`beta` must be .*, got nan"),
    (lambda: pyramid_budgets(4, 512, beta=math.inf), r"`beta` must be .*, got inf"),
    (lambda: pyramid_budgets(2, 512, caps=[4, None]), r"`caps\[0\]` must be an integer >= 5, got 4"),
    (lambda: pyramid_budgets(2, 512, caps=[None]), r"caps has 1 entries"),
    (lambda: squeeze_budgets([0.1, math.nan], 100), r"`concentrations\[1\]` must be a finite number, got nan"),
    (lambda: squeeze_budgets([-math.inf], 100), r"`concentrations\[0\]` must be .*, got -inf"),
    (lambda: squeeze_budgets([0.1], 100, strength=1.01), r"`strength` must be a finite number in \[0\.0, 1\.0\], got 1\.01"),
    (lambda: squeeze_budgets([0.1], 100, strength=math.nan), r"`strength` must be .*, got nan"),
    (lambda: squeeze_budgets([True], 100), r"`concentrations\[0\]` must be a finite number, got True"),
    (lambda: allocate_exact([1, 1], 9, 5), r"`total` must be an integer >= floor \* len\(weights\) = 10, got 9"),
    (lambda: allocate_exact([1, -2], 10, 0), r"`weights\[1\]` must be a finite number >= 0\.0, got -2"),
])
def test_bad_input_names_parameter(call, message):
    with pytest.raises(ValueError, match=message): call()
