"""Property tests (hypothesis) of the eviction engine and of the three cache classes driven directly with random arrays.

Invariants after every update: the budget is never exceeded, live sinks are always held, kept positions are unique
and below `offset`, `offset` equals the tokens seen, a full layer holds no token outside its window, and nothing in
the scores, the returned keys/values or the attention output is NaN or inf (all-zero keys and huge float16 keys
included). Equivalences: the batched prefill equals the sequential reference whenever nothing is evicted, a cache fed
one token at a time equals the reference exactly, `decode_run` equals the reference on a full buffer, and batch rows
evict independently of each other."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import math
import numpy as np
import pytest
import mlx.core as mx
from hypothesis import given, settings, assume, strategies as st, HealthCheck
from veloxquant_mlx import EvictingCache, H2OCache, PyramidKVCache, SqueezeAttentionCache, SqueezeCoordinator, KVCacheConfig, KVCacheBuilder
from veloxquant_mlx.h2o import prefill_evict, prefill_evict_reference, decode_run
from veloxquant_mlx.cache import dense_attention_reference
from veloxquant_mlx.builder import tiny_model, prompt_logits

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
# derandomized: the same examples on every run (a random failure would block a landing); explored wider by hand
SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

def make_keys(shape, kind, dtype, seed):
    "Random keys/values of one of three kinds: gaussian, all-zero, or huge float16-range magnitudes."
    k = mx.random.key(seed)
    if kind == "zeros": return mx.zeros(shape, dtype), mx.zeros(shape, dtype)
    a, b = mx.random.normal(shape, key=k), mx.random.normal(shape, key=mx.random.split(k)[0])
    if kind == "huge":   # the largest float16 magnitudes, saturated
        a = mx.clip(a * 65504.0, -65504.0, 65504.0)
    if kind == "large":  # large, but within what MLX's own float16 attention can softmax
        a = mx.clip(a * 1e4, -65504.0, 65504.0)
    return a.astype(dtype), b.astype(dtype)

def make_cache(kind, budget, n_sink, window):
    if kind == "h2o": return H2OCache(budget, n_sink, window)
    if kind == "h2o_attention": return H2OCache(budget, n_sink, window, score="attention")
    if kind == "h2o_window": return H2OCache(budget, n_sink, window, score="window", obs_window=max(1, (budget - n_sink) // 2))
    if kind == "pyramidkv": return PyramidKVCache(budget, n_sink, window, layer_idx=0, beta=2.0)
    if kind == "squeeze_uniform": return SqueezeAttentionCache(budget, n_sink, window)
    co = SqueezeCoordinator(1, budget, n_sink, caps=[window])      # one layer: the schedule resolves to `budget`
    return SqueezeAttentionCache(budget, n_sink, window, co, 0)

def check_invariants(c, seen, B, H, last_n=1):
    assert c.offset == seen
    assert c.count <= c.budget
    pos = np.array(c.positions[:, :, :c.count])
    assert pos.shape == (B, H, c.count)
    assert (pos >= 0).all() and (pos < c.offset).all()
    # a sink is live while the *next* query can see it (position > seen - window); dead ones go first
    live_sinks = {p for p in range(min(c.spec.n_sink, seen)) if c.spec.window is None or p > seen - c.spec.window}
    for row in pos.reshape(-1, pos.shape[-1]).tolist():
        assert len(set(row)) == len(row), f"duplicate kept positions {row}"
        assert live_sinks <= set(row), f"live sinks {live_sinks} missing from {row}"
        assert seen - 1 in row, "the newest token must always be held"
        if c.spec.window is not None and c.count == c.budget and last_n == 1:   # a full layer after a decode step
            assert all(p > seen - 1 - c.spec.window for p in row), f"dead token held in a full windowed layer: {row}"
    assert np.isfinite(np.array(c._scores[:, :, :c.count])).all()

layer_kind = st.sampled_from(["h2o", "pyramidkv", "squeeze_uniform", "squeeze_coord", "h2o_attention", "h2o_window"])

@st.composite
def scenario(draw):
    B, H = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    D = draw(st.sampled_from([4, 8, 16, 32]))
    dtype = draw(st.sampled_from(list(DTYPES)))
    n_sink = draw(st.integers(0, 4))
    budget = draw(st.integers(n_sink + 1, n_sink + 12))
    window = draw(st.one_of(st.none(), st.integers(budget, budget + 8)))
    chunks = draw(st.lists(st.integers(1, 12), min_size=1, max_size=8))
    kind = draw(st.sampled_from(["normal", "normal", "zeros", "huge", "large"]))
    return B, H, D, dtype, n_sink, budget, window, chunks, kind

@settings(max_examples=70, **SETTINGS)
@given(scenario(), layer_kind, st.integers(0, 2**16), st.sampled_from([1, 2]))
def test_cache_invariants_hold_after_every_update(sc, layer, seed, gqa):
    B, H, D, dtype, n_sink, budget, window, chunks, kind = sc
    dt = DTYPES[dtype]
    c = make_cache(layer, budget, n_sink, window)
    keys, values = make_keys((B, H, sum(chunks), D), kind, dt, seed)
    seen = 0
    for n in chunks:
        ak, av = c.update_and_fetch(keys[:, :, seen:seen + n], values[:, :, seen:seen + n])
        seen += n
        assert ak.shape[:2] == (B, H) and ak.shape[2] == av.shape[2] and ak.dtype == dt
        assert np.isfinite(np.array(ak.astype(mx.float32))).all() and np.isfinite(np.array(av.astype(mx.float32))).all()
        # attention with random queries over what the layer returned (real-query scores accumulate and trim here);
        # outputs are finite for keys up to ~1e4 in float16 ("large"); with keys at the float16 limit ("huge") MLX's
        # own float16 SDPA overflows whatever the cache (see nbs/08_reliability), so only the scores are checked there
        q = mx.random.normal((B, H * gqa, n, D), key=mx.random.key(seed + seen)).astype(dt)
        out = c.attention(q, ak, av, scale=1 / math.sqrt(D))
        assert out.shape == (B, H * gqa, n, D)
        if not (kind == "huge" and dt == mx.float16):
            assert np.isfinite(np.array(out.astype(mx.float32))).all()
        check_invariants(c, seen, B, H, n)

@settings(max_examples=40, **SETTINGS)
@given(scenario(), st.integers(0, 2**16))
def test_attention_output_matches_dense_reference_over_kept_tokens(sc, seed):
    "The layer's attention (its own mask, windowed or not) equals float32 dense attention over the kept keys' positions."
    B, H, D, _, n_sink, budget, window, chunks, _ = sc
    c = H2OCache(budget, n_sink, window)
    keys, values = make_keys((B, H, sum(chunks), D), "normal", mx.float32, seed)
    from veloxquant_mlx.cache import install_attention_hook
    install_attention_hook()
    seen = 0
    for n in chunks:
        ak, av = c.update_and_fetch(keys[:, :, seen:seen + n], values[:, :, seen:seen + n])
        seen += n
        q = mx.random.normal((B, H, n, D), key=mx.random.key(seed + seen))
        out = c.attention(q, ak, av, scale=1 / math.sqrt(D))
        ref = dense_attention_reference(q, ak, av, c._attn_pos, mx.arange(seen - n, seen), 1 / math.sqrt(D), window)
        assert np.allclose(np.array(out), np.array(ref), atol=1e-4)

@settings(max_examples=40, **SETTINGS)
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from([4, 8, 16]), st.lists(st.integers(1, 10), min_size=1, max_size=5),
       st.integers(0, 4), st.one_of(st.none(), st.integers(3, 20)), st.integers(0, 2**16))
def test_batched_prefill_equals_reference_when_nothing_is_evicted(B, H, D, chunks, n_sink, window, seed):
    total = sum(chunks)
    budget = total + 3
    keys, values = make_keys((B, H, total, D), "normal", mx.float32, seed)
    stored, a = (None,) * 4, 0
    for n in chunks:
        _, stored = prefill_evict(*stored, keys[:, :, a:a + n], values[:, :, a:a + n], a, budget, n_sink, window)
        a += n
    rk, rv, rp, rs = prefill_evict_reference(None, None, None, None, keys, values, 0, budget, n_sink, window)
    assert mx.array_equal(stored[2], rp).item()
    assert mx.array_equal(stored[0], rk).item() and mx.array_equal(stored[1], rv).item()
    assert np.allclose(np.array(stored[3]), np.array(rs), rtol=1e-4, atol=1e-4)

@settings(max_examples=40, **SETTINGS)
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from([8, 16]), st.integers(0, 3), st.integers(1, 10),
       st.integers(1, 30), st.one_of(st.none(), st.integers(0, 6)), st.integers(0, 2**16))
def test_token_by_token_cache_and_decode_run_equal_the_reference(B, H, D, n_sink, extra, n_new, wextra, seed):
    budget = n_sink + extra
    window = None if wextra is None else budget + wextra
    total = budget + n_new
    keys, values = make_keys((B, H, total, D), "normal", mx.float32, seed)
    rk, rv, rp, rs = prefill_evict_reference(None, None, None, None, keys, values, 0, budget, n_sink, window)
    # (1) the cache, one token at a time (in-place decode, then victim-slot decode)
    c = H2OCache(budget, n_sink, window)
    for i in range(total): c.update_and_fetch(keys[:, :, i:i + 1], values[:, :, i:i + 1])
    assert mx.array_equal(c.positions, rp).item(), "token-by-token cache kept other positions than the reference"
    assert mx.array_equal(c.store.arrays()[0], rk).item()
    assert np.allclose(np.array(c._scores), np.array(rs), rtol=1e-4, atol=1e-4)
    # (2) decode_run from the reference's full buffer after `budget` tokens
    fk, fv, fp, fs = prefill_evict_reference(None, None, None, None, keys[:, :, :budget], values[:, :, :budget], 0, budget, n_sink, window)
    dk, dv, dp, ds = decode_run(fk, fv, fp, fs, keys[:, :, budget:], values[:, :, budget:], budget, n_sink, window)
    assert mx.array_equal(dp, rp).item() and mx.array_equal(dk, rk).item() and mx.array_equal(dv, rv).item()
    assert np.allclose(np.array(ds), np.array(rs), rtol=1e-4, atol=1e-4)

@settings(max_examples=40, **SETTINGS)
@given(scenario(), st.sampled_from(["h2o", "pyramidkv"]), st.integers(0, 2**16))
def test_batch_rows_evict_independently_direct(sc, layer, seed):
    "Each row of a B-row cache keeps the positions, scores and outputs that row gets when run alone."
    B, H, D, dtype, n_sink, budget, window, chunks, kind = sc
    assume(B > 1)
    dt = DTYPES[dtype]
    keys, values = make_keys((B, H, sum(chunks), D), "normal", dt, seed)
    both = make_cache(layer, budget, n_sink, window)
    alone = [make_cache(layer, budget, n_sink, window) for _ in range(B)]
    seen = 0
    for n in chunks:
        sl = slice(seen, seen + n)
        q = mx.random.normal((B, H, n, D), key=mx.random.key(seed + seen)).astype(dt)
        ak, av = both.update_and_fetch(keys[:, :, sl], values[:, :, sl])
        out = both.attention(q, ak, av, scale=1 / math.sqrt(D))
        for b in range(B):
            k1, v1 = alone[b].update_and_fetch(keys[b:b + 1, :, sl], values[b:b + 1, :, sl])
            o1 = alone[b].attention(q[b:b + 1], k1, v1, scale=1 / math.sqrt(D))
            assert mx.array_equal(both.positions[b, :, :both.count], alone[b].positions[0, :, :alone[b].count]).item()
            assert np.allclose(np.array(both._scores[b, :, :both.count]), np.array(alone[b]._scores[0, :, :alone[b].count]), atol=1e-5)
            tol = 1e-5 if dt == mx.float32 else 2e-2
            assert np.allclose(np.array(out[b].astype(mx.float32)), np.array(o1[0].astype(mx.float32)), atol=tol)
        seen += n

@pytest.mark.parametrize("arch,method", [("llama", "h2o"), ("llama", "pyramidkv"), ("gemma3", "h2o"), ("qwen3", "pyramidkv")])
def test_batch_rows_evict_independently_through_a_model(arch, method):
    "B = 3 prompts of different content through a tiny model: every row's logits and kept positions equal running it alone."
    model = tiny_model(arch, n_layers=3)
    prompts = mx.random.randint(0, 256, (3, 70), key=mx.random.key(21))
    cfg = KVCacheConfig.for_method(method, 14, n_sink=2)
    both = KVCacheBuilder.for_model(model, cfg)
    out = prompt_logits(model, prompts, both, chunk=16)
    steps = [out[:, -1:]]
    for t in range(12):
        out = model(mx.argmax(steps[-1], axis=-1), cache=both); steps.append(out[:, -1:])
    for row in range(3):
        alone = KVCacheBuilder.for_model(model, cfg)
        o = prompt_logits(model, prompts[row:row + 1], alone, chunk=16)
        assert np.allclose(np.array(o[0, -1]), np.array(steps[0][row, -1]), atol=1e-4)
        for t in range(12):
            o = model(mx.argmax(steps[t][row:row + 1], axis=-1), cache=alone)
            assert np.allclose(np.array(o[0, -1]), np.array(steps[t + 1][row, -1]), atol=1e-4)
        for cb, ca in zip(both, alone):
            if isinstance(cb, EvictingCache):
                assert mx.array_equal(cb.positions[row, :, :cb.count], ca.positions[0, :, :ca.count]).item()

def test_squeeze_batch_rows_share_one_schedule():
    """SqueezeAttention measures one concentration per layer over the whole batch (by design: one budget per layer),
    so rows are independent only once the schedule is fixed; with `squeeze_resolved_budget` given they are."""
    model = tiny_model("llama", n_layers=3)
    prompts = mx.random.randint(0, 256, (2, 60), key=mx.random.key(8))
    cfg = KVCacheConfig.for_method("squeeze", 16, n_sink=2, resolved_budget=[10, 16, 22])
    both = KVCacheBuilder.for_model(model, cfg)
    out = prompt_logits(model, prompts, both, chunk=20)
    for row in range(2):
        alone = KVCacheBuilder.for_model(model, cfg)
        o = prompt_logits(model, prompts[row:row + 1], alone, chunk=20)
        assert np.allclose(np.array(out[row]), np.array(o[0]), atol=1e-4)
        for cb, ca in zip(both, alone):
            assert mx.array_equal(cb.positions[row, :, :cb.count], ca.positions[0, :, :ca.count]).item()
