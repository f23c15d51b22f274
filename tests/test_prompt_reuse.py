"""Prompt reuse: what happens when a compressed prompt cache is used again for a second prompt.

The contract (prose in nbs/08_reliability.ipynb):
(a) extending: feeding more tokens to a cache continues the same sequence (multi-turn: prompt 1 + answer stay,
    the new turn is appended); budgets hold, `offset` counts every token, SqueezeAttention keeps its schedule;
(b) trimming: before any eviction `trim(n)` works like mlx-lm's KVCache (with the key-as-query proxy the cache is
    exactly one that never saw the trimmed tokens); after an eviction it raises a clear ValueError, and
    `is_trimmable()` stays True so that mlx-lm's `trim_prompt_cache` (speculative decoding, prompt-cache reuse)
    reaches that error instead of silently trimming nothing;
(c) a fresh prompt: build new caches, or, for SqueezeAttention, `coordinator.reset()`, which gives exactly what new
    caches give."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import numpy as np
import pytest
import mlx.core as mx
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models.cache import make_prompt_cache, can_trim_prompt_cache, trim_prompt_cache, KVCache
from veloxquant_mlx import KVCacheConfig, KVCacheBuilder, EvictingCache, H2OCache, coordinator_of
from veloxquant_mlx.builder import tiny_model, prompt_logits, greedy

FIRST = mx.random.randint(0, 256, (1, 70), key=mx.random.key(31))
SECOND = mx.random.randint(0, 256, (1, 45), key=mx.random.key(32))
METHODS = ["h2o", "pyramidkv", "squeeze"]

@pytest.fixture(scope="module")
def model(): return tiny_model("llama", n_layers=3)

def ours(caches): return [c for c in caches if isinstance(c, EvictingCache)]

def turn(model, caches, prompt, n=8, chunk=16):
    "One chat turn: prefill `prompt` in chunks, greedy-decode `n` tokens; returns (tokens, logits)."
    return greedy(model, prompt, caches, n, chunk)

def check(caches, seen):
    for c in ours(caches):
        assert c.offset == seen and c.count <= c.budget
        pos = np.array(c.positions[:, :, :c.count])
        assert (pos < seen).all() and all(len(set(r)) == len(r) for r in pos.reshape(-1, pos.shape[-1]).tolist())

# ---- (a) extending a compressed cache ------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_second_turn_appends_and_keeps_budgets(model, method):
    cfg = KVCacheConfig.for_method(method, 24, n_sink=2)
    caches = KVCacheBuilder.for_model(model, cfg)
    t1, _ = turn(model, caches, FIRST)
    second = SECOND                      # `greedy` feeds every token it returns: the answer is in the cache already
    budgets = [c.budget for c in ours(caches)]
    assert all(c.stats["evicted"] for c in ours(caches))
    t2, l2 = turn(model, caches, second)
    check(caches, 70 + 8 + 45 + 8)
    assert [c.budget for c in ours(caches)] == budgets
    assert [c.count for c in ours(caches)] == budgets
    # the same tokens in one go (same chunk boundaries per turn) on new caches: identical
    fresh = KVCacheBuilder.for_model(model, cfg)
    turn(model, fresh, FIRST)
    f2, fl2 = turn(model, fresh, second)
    assert mx.array_equal(t2, f2).item() and mx.array_equal(l2, fl2).item()
    for a, b in zip(ours(caches), ours(fresh)): assert mx.array_equal(a.positions, b.positions).item()

def test_second_turn_with_a_roomy_budget_equals_mlx_lm(model):
    "Nothing evicted: a reused cache behaves exactly like mlx-lm's KVCache reused the same way."
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("h2o", 512))
    ref = make_prompt_cache(model)
    a1, _ = turn(model, caches, FIRST); r1, _ = turn(model, ref, FIRST)
    a2, la = turn(model, caches, SECOND); r2, lr = turn(model, ref, SECOND)
    assert mx.array_equal(a1, r1).item() and mx.array_equal(a2, r2).item()
    assert np.allclose(np.array(la), np.array(lr), atol=1e-4)

@pytest.mark.parametrize("method", METHODS)
def test_second_turn_through_generate_step(model, method):
    "mlx-lm's own loop, called twice on one prompt cache (the second call gets only the new turn's tokens)."
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method(method, 24, n_sink=2))
    run = lambda p, n=10: [int(t) for t, _ in zip((t for t, _ in generate_step(p, model, prompt_cache=caches, prefill_step_size=16, max_tokens=n)), range(n))]
    run(FIRST[0]); run(SECOND[0])
    check(caches, 70 + 10 + 45 + 10)
    if method == "squeeze": assert coordinator_of(caches).finalize_count == 1

# ---- (b) trimming ------------------------------------------------------------------------------------------------
def test_trim_after_eviction_raises_clearly(model):
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("h2o", 24, compress="chunk"))
    prompt_logits(model, FIRST, caches, chunk=16)
    assert can_trim_prompt_cache(caches)                # so mlx-lm's helpers reach the clear error below
    with pytest.raises(ValueError, match="has evicted tokens and cannot be trimmed"): caches[0].trim(5)
    with pytest.raises(ValueError, match="cannot be trimmed"): trim_prompt_cache(caches, 5)
    assert caches[0].offset == 70

@pytest.mark.parametrize("method", METHODS)
def test_trim_before_eviction_works_like_kvcache(model, method):
    "Prompt 40 tokens, drop the last 12 (a non-extension second prompt sharing 28), feed a different tail: like KVCache."
    kw = dict(beta=1.5) if method == "pyramidkv" else {}
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method(method, 128, n_sink=2, **kw))   # every layer >= 64
    ref = make_prompt_cache(model)
    prompt_logits(model, FIRST[:, :40], caches, chunk=16); prompt_logits(model, FIRST[:, :40], ref, chunk=16)
    assert can_trim_prompt_cache(caches)
    assert trim_prompt_cache(caches, 12) == trim_prompt_cache(ref, 12) == 12
    assert all(c.offset == 28 and c.count == 28 for c in ours(caches))
    a, _ = turn(model, caches, SECOND[:, :20], n=6); r, _ = turn(model, ref, SECOND[:, :20], n=6)
    assert mx.array_equal(a, r).item()

def test_trim_then_evict_equals_never_having_seen_the_trimmed_tokens():
    x = mx.random.normal((1, 2, 60, 8), key=mx.random.key(4))
    c = H2OCache(32, 2)
    c.update_and_fetch(x[:, :, :20], x[:, :, :20]); c.update_and_fetch(x[:, :, 20:30], x[:, :, 20:30])
    c.trim(10)
    fresh = H2OCache(32, 2)
    fresh.update_and_fetch(x[:, :, :20], x[:, :, :20])
    assert np.allclose(np.array(c._scores[:, :, :20]), np.array(fresh._scores[:, :, :20]), atol=1e-5)
    for i in range(30, 60):       # continue one token at a time until well past the budget, on both
        c.update_and_fetch(x[:, :, i:i + 1], x[:, :, i:i + 1]); fresh.update_and_fetch(x[:, :, i:i + 1], x[:, :, i:i + 1])
    assert mx.array_equal(c.positions, fresh.positions).item()

@pytest.mark.slow
def test_speculative_decoding_after_eviction_raises_instead_of_corrupting():
    "Rejected drafts must be trimmed; once a layer has evicted that is impossible, so it must fail loudly (offset would run ahead)."
    main, draft = tiny_model("llama", n_layers=2), tiny_model("llama", n_layers=2, seed=1)
    cfg = KVCacheConfig.for_method("h2o", 24)
    caches = KVCacheBuilder.for_model(main, cfg) + KVCacheBuilder.for_model(draft, cfg)
    prompt = mx.random.randint(0, 256, (1, 70), key=mx.random.key(3))[0, :20]
    with pytest.raises(ValueError, match="cannot be trimmed"):
        for _ in speculative_generate_step(prompt, main, draft, prompt_cache=caches, max_tokens=30, num_draft_tokens=3): pass

def test_speculative_decoding_without_eviction_works(model):
    main, draft = tiny_model("llama", n_layers=2), tiny_model("llama", n_layers=2, seed=1)
    cfg = KVCacheConfig.for_method("h2o", 256)
    caches = KVCacheBuilder.for_model(main, cfg) + KVCacheBuilder.for_model(draft, cfg)
    toks = [int(t) for t, *_ in speculative_generate_step(FIRST[0, :40], main, draft, prompt_cache=caches, max_tokens=30, num_draft_tokens=3)]
    ref = [int(t) for t, _ in zip((t for t, _ in generate_step(FIRST[0, :40], main, max_tokens=30)), range(30))]
    assert toks == ref and [c.offset for c in caches] == [70, 70, 69, 69]   # rejected drafts trimmed

# ---- (c) SqueezeAttention: frozen schedule, reset for a fresh prompt -------------------------------------------
def test_squeeze_schedule_stays_frozen_for_the_second_prompt(model):
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("squeeze", 24, n_sink=2))
    co = coordinator_of(caches)
    turn(model, caches, FIRST)
    budgets, conc = co.budgets, co.concentrations
    assert co.finalize_count == 1 and [c.count for c in caches] == budgets
    turn(model, caches, SECOND)                                   # a second prompt on the same caches: appended
    assert co.finalize_count == 1 and co.budgets == budgets and co.concentrations == conc
    assert [c.count for c in caches] == budgets

def test_squeeze_reset_equals_new_caches(model):
    cfg = KVCacheConfig.for_method("squeeze", 24, n_sink=2)
    caches = KVCacheBuilder.for_model(model, cfg)
    co = coordinator_of(caches)
    turn(model, caches, FIRST)
    co.reset()
    assert not co.resolved and co.missing == [0, 1, 2]
    assert all(c.empty() and c.offset == 0 and c.count == 0 and c.stats["concentration"] is None and c.is_trimmable() for c in caches)
    t, l = turn(model, caches, SECOND)
    fresh = KVCacheBuilder.for_model(model, cfg)
    ft, fl = turn(model, fresh, SECOND)
    assert mx.array_equal(t, ft).item() and mx.array_equal(l, fl).item()
    assert co.budgets == coordinator_of(fresh).budgets and co.finalize_count == 2
    for a, b in zip(caches, fresh): assert mx.array_equal(a.positions, b.positions).item() and a.offset == b.offset

def test_squeeze_reset_with_a_given_schedule_keeps_it(model):
    cfg = KVCacheConfig.for_method("squeeze", 24, n_sink=2, resolved_budget=[16, 24, 32])
    caches = KVCacheBuilder.for_model(model, cfg)
    co = coordinator_of(caches)
    turn(model, caches, FIRST)
    co.reset()
    assert co.resolved and co.budgets == [16, 24, 32] and [c.budget for c in caches] == [16, 24, 32]
    t, _ = turn(model, caches, SECOND)
    ft, _ = turn(model, KVCacheBuilder.for_model(model, cfg), SECOND)
    assert mx.array_equal(t, ft).item()
