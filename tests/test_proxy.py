"""Property tests for `veloxquant_mlx.proxy`: random shapes, dtypes and scales."""
from veloxquant_mlx.proxy import concentration_score, concentration_score_reference, layer_concentration  # before mlx: the package may preload a BLAS
import mlx.core as mx, numpy as np, pytest
from hypothesis import given, settings, strategies as st, HealthCheck

DTYPES = {'float32': mx.float32, 'float16': mx.float16, 'bfloat16': mx.bfloat16}

@st.composite
def key_batches(draw, max_rows=24):
    "Random keys `[B, H, S, D]` (or `[S, D]`), some rows zeroed, a common offset so scores span [-1, 1]."
    rank4 = draw(st.booleans())
    shape = ((draw(st.integers(1, 2)), draw(st.integers(1, 3))) if rank4 else ()) + \
            (draw(st.integers(0, max_rows)), draw(st.integers(1, 16)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    offset = draw(st.floats(-3, 3))
    keys = rng.standard_normal(shape) + offset * rng.standard_normal(shape[-1:])
    keys = keys * (rng.random(shape[:-1] + (1,)) > draw(st.floats(0, 0.5)))   # zero rows
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    return mx.array(keys.astype(np.float32)).astype(DTYPES[dtype])

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key_batches())
def test_in_range_and_equals_reference(keys):
    fast = np.array(concentration_score(keys))
    assert fast.dtype == np.float32 and fast.shape == tuple(keys.shape[:-2])
    assert np.all(np.isfinite(fast)) and np.all(fast >= -1) and np.all(fast <= 1)
    np.testing.assert_allclose(fast, np.array(concentration_score_reference(keys)), atol=1e-4)

@settings(max_examples=300, deadline=None)
@given(key_batches(), st.integers(0, 2**32 - 1), st.floats(-12, 12))
def test_scale_invariant(keys, seed, log_spread):
    "Positive per-row scaling (float32, up to 10^±12 around 1) does not change the score."
    keys = keys.astype(mx.float32)
    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.uniform(min(0, log_spread), max(0, log_spread), tuple(keys.shape[:-1]) + (1,))
    scaled = keys * mx.array(scales.astype(np.float32))
    np.testing.assert_allclose(np.array(concentration_score(scaled)), np.array(concentration_score(keys)), atol=1e-5)

@settings(max_examples=200, deadline=None)
@given(st.integers(0, 64), st.integers(1, 32), st.floats(1e-3, 1e3), st.sampled_from(sorted(DTYPES)))
def test_identical_and_orthogonal(n_rows, dim, scale, dtype):
    direction = mx.ones((1, dim))
    same = (mx.arange(1, n_rows + 1, dtype=mx.float32)[:, None] * scale / max(n_rows, 1)) * direction
    expected = 1.0 if n_rows >= 2 else 0.0
    assert abs(concentration_score(same.astype(DTYPES[dtype])).item() - expected) < 1e-5
    orthogonal = mx.eye(dim)[: min(n_rows, dim)] * scale
    assert abs(concentration_score(orthogonal.astype(DTYPES[dtype])).item()) < 1e-6

@pytest.mark.parametrize('shape', [(3,), (2, 3, 4), (1, 1, 1, 2, 3), ()])
def test_bad_rank_names_keys(shape):
    with pytest.raises(ValueError, match=r"keys has shape"): concentration_score(mx.ones(shape))

def test_layer_concentration_is_one_float():
    keys = mx.stack([mx.ones((4, 4)), mx.eye(4)])[None]
    assert isinstance(layer_concentration(keys), float) and abs(layer_concentration(keys) - 0.5) < 1e-6
    with pytest.raises(ValueError, match="NaN or inf"): layer_concentration(mx.full((1, 1, 3, 2), float('nan')))
