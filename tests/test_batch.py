"""Eviction caches in mlx-lm's batch generation (notebook 03b): every row of a batch gives the tokens the same prompt
gives alone with the same method and budget (greedy), with rows of different lengths (right padding), requests joining
mid-run and rows leaving (every registered method, chunk and prompt_end compression, slack, kv_fraction, quantized
storage); every live layer keeps each row within its budget, with distinct real positions and no
padding; the vectorised decoding step equals the row-by-row reference; an extracted row saves, loads and resumes as the
row alone would. Tiny random Llama and Gemma 3 models (sliding windows of 16)."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import os
import numpy as np
import pytest
import mlx.core as mx
from mlx_lm import batch_generate
from mlx_lm.models.cache import save_prompt_cache, load_prompt_cache
from veloxquant_mlx.batch import BatchEvictingCache, greedy_alone, greedy_batched, check_batch_layer
from veloxquant_mlx.builder import tiny_model, KVCacheConfig, KVCacheBuilder, greedy
from veloxquant_mlx.cache import EvictingCache, remove_attention_hook, install_attention_hook

RNG = np.random.default_rng(0)
PROMPTS = [RNG.integers(1, 255, n).tolist() for n in (30, 17, 45)]
STEP, T, BUDGET = 16, 8, 12
CONFIGS = {
    "h2o": dict(method="h2o"), "h2o-proxy": dict(method="h2o", score="key_proxy"), "snapkv": dict(method="snapkv"),
    "squeeze": dict(method="squeeze"), "squeeze-keys": dict(method="squeeze", signal="key_dispersion"),
    "streamingllm": dict(method="streamingllm"), "tova": dict(method="tova"), "chunkkv": dict(method="chunkkv"),
    "pyramidkv": dict(method="pyramidkv"), "h2o-chunk": dict(method="h2o", compress="chunk"),
    "snapkv-chunk": dict(method="snapkv", compress="chunk"), "squeeze-chunk": dict(method="squeeze", compress="chunk"),
    "tova-chunk": dict(method="tova", compress="chunk"), "h2o-slack": dict(method="h2o", slack=4),
    "streamingllm-slack": dict(method="streamingllm", slack=3), "h2o-fraction": dict(method="h2o", kv_fraction=0.5),
    "keynorm": dict(method="keynorm"), "mean-attention": dict(method="mean-attention"),
}
MODELS = {}

def model_for(arch):
    if arch not in MODELS: MODELS[arch] = tiny_model(arch)
    return MODELS[arch]

def config(name, budget=BUDGET):
    kw = dict(CONFIGS[name])
    return KVCacheConfig.for_method(kw.pop("method"), None if "kv_fraction" in kw else budget, **kw)

def live_kept(layer):
    "A one-sequence layer's kept positions the next query can see, sorted per head."
    return [[x for x in sorted(h) if layer.spec.window is None or x > layer.offset - layer.spec.window]
            for h in layer.positions[0, :, :layer.count].tolist()]

def live_layers(gen):
    return [c for b in (gen._prompt_batch, gen._generation_batch) for c in b.prompt_cache]

def check_live(gen):
    for c in live_layers(gen):
        assert isinstance(c, BatchEvictingCache)
        check_batch_layer(c)

def alone_and_late_joiner(model, cfg):
    "Each prompt alone, then all batched, the third joining at step 3: alone tokens, their caches, batched, extracted."
    alone_caches = [KVCacheBuilder.for_model(model, cfg) for _ in PROMPTS]
    alone = [greedy_alone(model, p, c, T, STEP) for p, c in zip(PROMPTS, alone_caches)]
    got, extracted = greedy_batched(model, PROMPTS, [KVCacheBuilder.for_model(model, cfg) for _ in PROMPTS], T,
                                    arrivals=[0, 0, 3], prefill_step_size=STEP, on_step=check_live)
    return alone, alone_caches, got, extracted

CASES = [("gemma3", n) for n in CONFIGS] + [("llama", n) for n in ("h2o", "squeeze", "tova", "snapkv-chunk",
                                                                     "h2o-fraction")]

def test_every_registered_method_is_batched_here():
    "A method added to the registry is a case of the batch tests (a forgotten one fails here, not in a user's server)."
    from veloxquant_mlx.methods import METHODS
    covered = {kw["method"] for kw in CONFIGS.values()}
    assert {m.name for m in METHODS.values() if not m.baseline} <= covered, covered

@pytest.mark.parametrize("arch,name", CASES)
def test_rows_equal_alone_with_a_late_joiner(arch, name):
    model, cfg = model_for(arch), config(name)
    alone, alone_caches, got, extracted = alone_and_late_joiner(model, cfg)
    assert got == alone
    for ex, al in zip(extracted, alone_caches):
        assert [c.offset for c in ex] == [c.offset for c in al]
        assert [c.budget for c in ex] == [c.budget for c in al]          # SqueezeAttention: each row its own schedule
        assert [live_kept(c) for c in ex] == [live_kept(c) for c in al]

@pytest.mark.parametrize("arch,name", [("gemma3", "tova"), ("gemma3", "h2o"), ("llama", "h2o-proxy"),
                                       ("llama", "snapkv")])
def test_vectorised_step_equals_row_by_row(arch, name, monkeypatch):
    model, cfg = model_for(arch), config(name)
    runs = []
    for fast in (True, False):
        monkeypatch.setattr(BatchEvictingCache, "fast", fast)
        runs.append(greedy_batched(model, PROMPTS, [KVCacheBuilder.for_model(model, cfg) for _ in PROMPTS], 12,
                                   prefill_step_size=STEP))
    (t1, c1), (t2, c2) = runs
    assert t1 == t2
    for a, b in zip(c1, c2): assert [live_kept(x) for x in a] == [live_kept(x) for x in b]

@pytest.mark.parametrize("arch", ["gemma3", "llama"])
@pytest.mark.parametrize("name,kw", [("h2o", dict(kv_bits=8)), ("tova", dict(kv_bits=4)),
                                     ("snapkv", dict(kv_bits=4, kv_scheme="kivi"))])
def test_quantized_rows_equal_alone(arch, name, kw):
    "Quantized storage decodes row by row (not vectorised): each row still gives what it gives alone."
    key = ("q", arch)
    if key not in MODELS: MODELS[key] = tiny_model(arch, n_layers=3, head_dim=64)
    model, cfg = MODELS[key], KVCacheConfig.for_method(name, BUDGET, **kw)
    alone, alone_caches, got, extracted = alone_and_late_joiner(model, cfg)
    assert got == alone
    for ex, al in zip(extracted, alone_caches):
        assert [c.store.scheme for c in ex] == [c.store.scheme for c in al]
        assert [live_kept(c) for c in ex] == [live_kept(c) for c in al]

def test_rows_of_different_budgets_and_policies_share_a_batch():
    model = model_for("gemma3")
    cfgs = [config("h2o", 10), config("h2o", 16), config("tova", 12)]     # per-row budgets; a row of another policy
    alone = [greedy_alone(model, p, KVCacheBuilder.for_model(model, c), T, STEP) for p, c in zip(PROMPTS, cfgs)]
    got, _ = greedy_batched(model, PROMPTS, [KVCacheBuilder.for_model(model, c) for c in cfgs], T,
                            prefill_step_size=STEP, on_step=check_live)
    assert got == alone
    got, _ = greedy_batched(model, PROMPTS[:2], [KVCacheBuilder.for_model(model, c) for c in cfgs[:2]], T,
                            prefill_step_size=STEP)
    assert got == alone[:2]

def test_batch_generate_leaves_the_request_caches_alone():
    model, cfg = model_for("llama"), config("squeeze")
    caches = [KVCacheBuilder.for_model(model, cfg) for _ in PROMPTS]
    class Tok:
        eos_token_ids = []
        def decode(self, ids): return ""
    r = batch_generate(model, Tok(), PROMPTS, prompt_caches=caches, max_tokens=T, prefill_step_size=STEP,
                       return_token_ids=True)
    assert r.token_ids == [greedy_alone(model, p, KVCacheBuilder.for_model(model, cfg), T, STEP) for p in PROMPTS]
    assert all(c.offset == 0 and c.empty() for cl in caches for c in cl)

@pytest.mark.parametrize("name", ["squeeze", "snapkv", "tova"])
def test_extract_save_load_resume(tmp_path, name):
    model, cfg = model_for("gemma3"), config(name)
    alone_caches = [KVCacheBuilder.for_model(model, cfg) for _ in PROMPTS]
    alone = [greedy_alone(model, p, c, T, STEP) for p, c in zip(PROMPTS, alone_caches)]
    got, extracted = greedy_batched(model, PROMPTS, [KVCacheBuilder.for_model(model, cfg) for _ in PROMPTS], T,
                                    prefill_step_size=STEP)
    assert got == alone
    more = mx.array([[7, 42, 99, 5]])
    for i, cache in enumerate(extracted):
        path = os.path.join(tmp_path, f"{i}.safetensors")
        save_prompt_cache(path, cache)
        loaded = load_prompt_cache(path)
        assert [type(c) for c in loaded] == [type(c) for c in alone_caches[i]]
        assert [live_kept(c) for c in loaded] == [live_kept(c) for c in alone_caches[i]]
        assert greedy(model, more, loaded, 6)[0].tolist() == greedy(model, more, alone_caches[i], 6)[0].tolist()

def test_merge_rules():
    assert type(EvictingCache.merge([EvictingCache(8)])) is BatchEvictingCache
    model = model_for("llama")
    caches = KVCacheBuilder.for_model(model, config("squeeze"))
    with pytest.raises(ValueError, match="share one unresolved schedule"):
        BatchEvictingCache.merge([caches[0], caches[0]])
    big = EvictingCache(8)
    big.update_and_fetch(mx.zeros((2, 1, 3, 4)), mx.zeros((2, 1, 3, 4)))
    with pytest.raises(ValueError, match="batch size 2"):
        BatchEvictingCache.merge([big])

def test_batch_needs_the_attention_hook():
    model = model_for("llama")
    b = BatchEvictingCache.merge(KVCacheBuilder.for_model(model, config("h2o"))[:1])
    remove_attention_hook()
    try:
        with pytest.raises(RuntimeError, match="attention hook"): b.make_mask(4)
    finally:
        install_attention_hook()
