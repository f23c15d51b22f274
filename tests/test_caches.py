"""Integration tests of the caches under real mlx-lm generation on tiny random models (Llama, Qwen3, Gemma 3)."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import os, tempfile
import numpy as np
import pytest
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache, save_prompt_cache, load_prompt_cache, KVCache
from veloxquant_mlx import (KVCacheConfig, KVCacheBuilder, H2OCache, EvictingCache, coordinator_of,
                            install_attention_hook, remove_attention_hook)
from veloxquant_mlx.methods import METHODS
from veloxquant_mlx.builder import tiny_model, greedy, prompt_logits

PROMPT = mx.random.randint(0, 256, (1, 120), key=mx.random.key(11))
CONFIGS = [KVCacheConfig.for_method("h2o", 24), KVCacheConfig.for_method("pyramidkv", 24, beta=2.0),
           KVCacheConfig.for_method("squeeze", 24, strength=1.0)]

def run_generate(model, caches, prompt=PROMPT[0], n=40, step=32):
    "Greedy tokens through mlx-lm's own generate_step (chunked prefill, decode loop)."
    return [int(t) for t, _ in zip((tok for tok, _ in generate_step(prompt, model, prompt_cache=caches, prefill_step_size=step, max_tokens=n)), range(n))]

def check_invariants(caches):
    for c in caches:
        if not isinstance(c, EvictingCache): continue
        pos = np.array(c.positions[:, :, :c.count])
        assert c.count <= c.budget
        assert (pos < c.offset).all()
        for row in pos.reshape(-1, pos.shape[-1]):
            assert len(set(row.tolist())) == len(row)                      # unique positions
            live_sinks = [p for p in range(c.spec.n_sink) if c.spec.window is None or p > c.offset - 1 - c.spec.window]
            assert set(live_sinks) <= set(row.tolist())                     # live sinks always kept
            if c.spec.window is not None: assert (row > c.offset - 1 - c.spec.window).all()  # nothing dead held after decode
        assert not np.isnan(np.array(c._scores[:, :, :c.count])).any()

@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.method)
def test_generate_step_respects_budget_and_is_deterministic(arch, cfg):
    model = tiny_model(arch)
    caches = KVCacheBuilder.for_model(model, cfg)
    toks = run_generate(model, caches)
    check_invariants(caches)
    assert all(c.offset == 120 + 40 for c in caches if isinstance(c, EvictingCache))  # generate_step runs one token ahead
    assert run_generate(model, KVCacheBuilder.for_model(model, cfg)) == toks      # same seed, same result

@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_roomy_budget_matches_mlx_lm_through_generate_step(arch):
    model = tiny_model(arch)
    ref = run_generate(model, make_prompt_cache(model))
    assert run_generate(model, KVCacheBuilder.for_model(model, KVCacheConfig.for_method("h2o", 256))) == ref

def test_long_decode_never_exceeds_budget():
    model = tiny_model("gemma3", n_layers=3, sliding_window=16)
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("squeeze", 12, n_sink=2))
    run_generate(model, caches, n=2000)
    check_invariants(caches)
    assert all(c.count == c.budget for c in caches)
    assert caches[0].offset == 120 + 2000

def test_squeeze_prefill_ends_at_exact_budgets():
    model = tiny_model("qwen3", n_layers=6)
    prompt = mx.random.randint(0, 256, (1, 500), key=mx.random.key(3))
    for compress in ("chunk", "prompt_end"):          # after the prefill's last chunk, or at the prompt's end
        caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("squeeze", 40, compress=compress))
        prompt_logits(model, prompt, caches, chunk=128)
        if compress == "prompt_end":
            assert [c.count for c in caches] == [500] * 6      # held whole until the prompt ends
            model(mx.array([[7]]), cache=caches)                     # its end: the first one-token pass
        co = coordinator_of(caches)
        assert [c.count for c in caches] == co.budgets and sum(co.budgets) == 6 * 40
        assert max(co.budgets) > 40                   # someone was entitled to more than the average, and got it

def test_save_load_round_trip_continues_identically():
    model = tiny_model("llama")
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("pyramidkv", 24))
    prompt_logits(model, PROMPT, caches, chunk=32)
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "c.safetensors")
        save_prompt_cache(f, caches)
        loaded = load_prompt_cache(f)
    nxt = mx.array([[5]])
    a, b = model(nxt, cache=caches), model(nxt, cache=loaded)
    assert mx.array_equal(a, b).item()
    assert [(type(c).__name__, c.spec.method) for c in loaded] == [("EvictingCache", "pyramidkv")] * 4

def test_batch_rows_evict_independently():
    model = tiny_model("llama")
    prompts = mx.random.randint(0, 256, (2, 60), key=mx.random.key(5))
    cfg = KVCacheConfig.for_method("h2o", 16)
    both = KVCacheBuilder.for_model(model, cfg)
    out = prompt_logits(model, prompts, both, chunk=20)
    for row in range(2):
        alone = KVCacheBuilder.for_model(model, cfg)
        ref = prompt_logits(model, prompts[row:row + 1], alone, chunk=20)
        assert np.allclose(np.array(out[row]), np.array(ref[0]), atol=1e-4)
        assert mx.array_equal(both[0].positions[row], alone[0].positions[0]).item()

def test_hook_leaves_plain_caches_bit_for_bit():
    model = tiny_model("gemma3")
    remove_attention_hook()
    plain = prompt_logits(model, PROMPT, make_prompt_cache(model), chunk=32)
    install_attention_hook()
    hooked = prompt_logits(model, PROMPT, make_prompt_cache(model), chunk=32)
    assert mx.array_equal(plain, hooked).item()

def test_windowed_layer_without_hook_refuses_a_shared_mask():
    model = tiny_model("gemma3")
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("h2o", 12))
    remove_attention_hook()
    try:
        with pytest.raises(RuntimeError, match="attention hook"):
            prompt_logits(model, PROMPT, caches, chunk=32)
    finally:
        install_attention_hook()

def test_for_model_rejects_models_without_attention_layers():
    class NoAttention:
        layers = [object(), object()]
        def make_cache(self): return [object(), object()]
    with pytest.raises(ValueError, match="no attention layer found"):
        KVCacheBuilder.for_model(NoAttention(), KVCacheConfig.for_method("h2o", 16))

def test_merge_makes_a_batch_for_mlx_lm():
    from veloxquant_mlx.batch import BatchEvictingCache
    b = EvictingCache.merge([H2OCache(16), H2OCache(16)])
    assert isinstance(b, BatchEvictingCache) and len(b) == 2

def test_install_makes_make_prompt_cache_return_ours():
    model = tiny_model("llama")
    KVCacheBuilder.install(model, KVCacheConfig.for_method("h2o", 16))
    assert all(isinstance(c, EvictingCache) for c in make_prompt_cache(model))

EVICTING = [m for m, e in METHODS.items() if not e.baseline]   # every eviction method of the registry

@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("compress", ["chunk", "prompt_end"])
@pytest.mark.parametrize("method", EVICTING)
def test_every_registered_method_keeps_the_invariants(arch, compress, method):
    "Every method of the registry, both moments of choosing, through mlx-lm's generate_step: budgets, sinks, positions."
    model = tiny_model(arch)
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method(method, 24, compress=compress))
    toks = run_generate(model, caches, n=30)
    check_invariants([c for c in caches if isinstance(c, EvictingCache)])
    assert all(c.offset == 120 + 30 for c in caches if isinstance(c, EvictingCache))
    assert all(c.stats["evicted"] for c in caches if isinstance(c, EvictingCache))
    assert run_generate(model, KVCacheBuilder.for_model(model, KVCacheConfig.for_method(method, 24, compress=compress)),
                        n=30) == toks                                     # deterministic

@pytest.mark.parametrize("method", EVICTING)
def test_every_registered_method_with_room_equals_mlx_lm(method):
    "A budget with room for everything changes nothing, whatever the method's policy (Gemma 3's windows included)."
    model = tiny_model("gemma3")
    ref = run_generate(model, make_prompt_cache(model), n=20)
    assert run_generate(model, KVCacheBuilder.for_model(model, KVCacheConfig.for_method(method, 256)), n=20) == ref

@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_streamingllm_decodes_like_mlx_lm_rotating_cache(arch):
    """After the same prefill, StreamingLLM (sinks + newest) gives the tokens of mlx-lm's RotatingKVCache(budget, keep).

    Choosing after the prefill's chunk (`compress="chunk"`), the two hold the same tokens at every step. (By default our
    layer chooses at the prompt's end, *after* the last prompt token has attended over the whole prompt, as a full
    cache would; from then on the two hold the same tokens too, but that first step's hidden states differ.)"""
    from veloxquant_mlx.eval.batching import prefilled
    model, ids = tiny_model(arch), PROMPT[0].tolist()
    ours, mlx = KVCacheConfig.for_method("streamingllm", 24, compress="chunk"), KVCacheConfig.for_method("mlx-rotating", 24)
    full, a, b = prefilled(model, ids[:-1], [ours, mlx])           # one prefill (full attention) for both
    run = lambda caches: [int(t) for (t, _), _ in zip(generate_step(mx.array(ids[-1:]), model, prompt_cache=caches,
                                                                   max_tokens=40), range(40))]
    assert run(a) == run(b)
    for c, r in zip(a, b):                                           # the same tokens held: 4 sinks and the newest
        assert c.count == r.size() == 24
        assert sorted(c.positions[0, 0].tolist()) == list(range(4)) + list(range(c.offset - 20, c.offset))
