"""Bad input gets a clear ValueError/TypeError naming what is wrong, never a crash inside MLX.

Tests marked `xfail(strict=True, reason="bug: ...")` show a missing check or a wrong result in the library; they
turn into failures (XPASS) once it is fixed, so whoever fixes it removes the marker."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import json, os, tempfile
import numpy as np
import pytest
import mlx.core as mx
from mlx_lm.models.cache import save_prompt_cache, load_prompt_cache, KVCache, ArraysCache
from veloxquant_mlx import (H2OCache, PyramidKVCache, SnapKVCache, SqueezeAttentionCache, SqueezeCoordinator,
                            KVCacheConfig, KVCacheBuilder, KVCacheFactory, EvictingCache)
from veloxquant_mlx.methods import METHODS
from veloxquant_mlx.h2o import check_kv
from veloxquant_mlx.builder import tiny_model, prompt_logits

def kv(*shape, dtype=mx.float32): return mx.zeros(shape, dtype)

# ---- keys / values ---------------------------------------------------------------------------------------------
EVICTING = [m for m, e in METHODS.items() if not e.baseline]   # every eviction method of the registry

def layer(method, budget=8, n_sink=2, **kw):
    "One layer of `method` as the factory makes it (its policy, its class)."
    return KVCacheFactory.create(KVCacheConfig.for_method(method, budget, n_sink, **kw))

@pytest.mark.parametrize("method", EVICTING)
def test_rank_not_4_is_refused(method):
    c = layer(method)
    with pytest.raises(ValueError, match=r"`keys` must have rank 4 .*got shape \(2, 3, 8\)"):
        c.update_and_fetch(kv(2, 3, 8), kv(2, 3, 8))
    with pytest.raises(ValueError, match=r"`values` must have rank 4"):
        c.update_and_fetch(kv(1, 2, 3, 8), kv(1, 2, 3, 8, 1))

def test_non_mlx_arrays_are_refused():
    c = H2OCache(8, 2)
    with pytest.raises(TypeError, match="`keys` must be an mlx array, got ndarray"):
        c.update_and_fetch(np.zeros((1, 2, 3, 8)), np.zeros((1, 2, 3, 8)))
    with pytest.raises(TypeError, match="`values` must be an mlx array, got list"):
        c.update_and_fetch(kv(1, 2, 3, 8), [[0.0]])

@pytest.mark.parametrize("kshape,vshape,what", [((1, 2, 3, 8), (1, 3, 3, 8), "heads"), ((1, 2, 3, 8), (2, 2, 3, 8), "batch"),
                                                ((1, 2, 3, 8), (1, 2, 4, 8), "tokens")])
def test_keys_values_disagreeing_in_batch_heads_tokens(kshape, vshape, what):
    with pytest.raises(ValueError, match=rf"`keys` \(1, 2, 3, 8\) and `values` .* must agree in batch, heads and tokens"):
        H2OCache(8, 2).update_and_fetch(kv(*kshape), kv(*vshape))

def test_empty_chunk_is_refused():
    with pytest.raises(ValueError, match="holds no tokens"):
        H2OCache(8, 2).update_and_fetch(kv(1, 2, 0, 8), kv(1, 2, 0, 8))

@pytest.mark.parametrize("new,name", [((1, 2, 1, 16), "keys"), ((2, 2, 1, 8), "keys"), ((1, 4, 1, 8), "keys")])
def test_chunk_not_matching_the_stored_shape(new, name):
    "A later chunk with another head_dim, batch or head count than what the cache holds."
    c = H2OCache(8, 2)
    c.update_and_fetch(kv(1, 2, 3, 8), kv(1, 2, 3, 8))
    with pytest.raises(ValueError, match=rf"`{name}` of shape .* does not match the cache's"):
        c.update_and_fetch(kv(*new), kv(*new))

def test_values_head_dim_changing_between_chunks():
    c = H2OCache(8, 2)
    c.update_and_fetch(kv(1, 2, 3, 8), kv(1, 2, 3, 8))
    with pytest.raises(ValueError, match=r"`values` of shape \(1, 2, 1, 4\) does not match"):
        c.update_and_fetch(kv(1, 2, 1, 8), kv(1, 2, 1, 4))

def test_values_head_dim_may_differ_from_keys():
    "Dv != D is legitimate (multi-head latent attention): accepted and kept."
    c = H2OCache(8, 2)
    ak, av = c.update_and_fetch(kv(1, 2, 3, 8), kv(1, 2, 3, 4))
    assert ak.shape == (1, 2, 3, 8) and av.shape == (1, 2, 3, 4)

def test_integer_keys_are_refused():
    with pytest.raises(TypeError, match="floating"):
        H2OCache(8, 2).update_and_fetch(kv(1, 2, 3, 8, dtype=mx.int32), kv(1, 2, 3, 8, dtype=mx.int32))

def test_check_kv_directly():
    with pytest.raises(ValueError, match="rank 4"): check_kv(kv(3, 8), kv(3, 8))
    with pytest.raises(TypeError, match="mlx array"): check_kv(None, kv(1, 1, 1, 1))

# ---- budgets, sinks, windows -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [H2OCache, PyramidKVCache])
def test_budget_below_n_sink_plus_one(cls):
    with pytest.raises(ValueError, match=r"`budget` must be an integer >= 5, got 4"): cls(4, 4)
    with pytest.raises(ValueError, match=r"`budget` must be an integer >= 1, got 0"): cls(0, 0)

def test_squeeze_avg_budget_below_n_sink_plus_one():
    with pytest.raises(ValueError, match=r"`budget` must be an integer >= 5, got 3"): SqueezeAttentionCache(3, 4)
    co = SqueezeCoordinator(2, 16, 4)
    with pytest.raises(ValueError, match=r"`avg_budget` must be an integer >= 5, got 3"): SqueezeAttentionCache(3, 4, None, co, 0)

@pytest.mark.parametrize("bad", [16.0, "16", True, None.__class__])
def test_budget_of_the_wrong_type(bad):
    with pytest.raises(ValueError, match="`budget` must be an integer"): H2OCache(bad, 2)

def test_negative_sinks_and_bad_window():
    with pytest.raises(ValueError, match="`n_sink` must be an integer >= 0, got -1"): H2OCache(8, -1)
    with pytest.raises(ValueError, match="`window` must be an integer >= 1, got 0"): H2OCache(8, 2, window=0)

def test_window_smaller_than_budget():
    with pytest.raises(ValueError, match=r"`budget` must be an integer in \[5, 10\], got 20"): H2OCache(20, 4, window=10)
    with pytest.raises(ValueError, match=r"`budget` must be an integer in \[5, 10\], got 20"): PyramidKVCache(20, 4, window=10)

def test_factory_caps_budget_at_the_window():
    c = KVCacheFactory.create(KVCacheConfig.for_method("h2o", 64), window=16)
    assert c.budget == 16

# ---- config ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,msg", [
    (dict(method="h2o", budget=16, params=dict(beta=2.0)), r"`beta` is not a parameter of method 'h2o' .*pyramidkv"),
    (dict(method="pyramidkv", budget=16, params=dict(strength=0.5)), r"`strength` is not a parameter .*squeeze"),
    (dict(method="tova", budget=16, params=dict(obs_window=8)), r"`obs_window` is not a parameter of method 'tova'"),
    (dict(method="h2o"), "`budget` is required for method 'h2o'"),
    (dict(method="streaming", budget=16), "`method` must be one of"),
    (dict(method="pyramidkv", budget=16, params=dict(beta=0.5)), "beta"),
    (dict(method="squeeze", budget=16, params=dict(strength=1.5)), "strength"),
    (dict(method="squeeze", budget=16, params=dict(signal="oracle")), "`signal` must be one of"),
    (dict(method="chunkkv", budget=16, params=dict(chunk=0)), "`chunk` must be an integer >= 1, got 0"),
    (dict(method="snapkv", budget=16, params=dict(kernel=4)), "`kernel` must be an odd integer"),
    (dict(method="h2o", budget=16, head_dim=0), "`head_dim` must be an integer >= 1"),
    (dict(method="h2o", budget=4, n_sink=4), "`budget` must be an integer >= 5, got 4"),
    (dict(method="h2o", budget=16, compress="never"), "`compress` must be one of"),
])
def test_config_fields(kwargs, msg):
    with pytest.raises(ValueError, match=msg): KVCacheConfig(**kwargs)

def test_for_method_with_a_field_of_another_method():
    with pytest.raises(ValueError, match="`beta` is not a parameter of method 'h2o'"): KVCacheConfig.for_method("h2o", 16, beta=2.0)

def test_config_head_dim_checked_against_the_model():
    model = tiny_model("llama", n_layers=2)
    with pytest.raises(ValueError, match="`head_dim` is 32 in the config but the model's is 16"):
        KVCacheBuilder.for_model(model, KVCacheConfig(method="h2o", budget=16, head_dim=32))

def test_squeeze_resolved_budget_of_the_wrong_length_for_the_model():
    model = tiny_model("llama", n_layers=4)
    cfg = KVCacheConfig.for_method("squeeze", 16, resolved_budget=[16, 16])
    with pytest.raises(ValueError, match=r"`resolved_budget` has 2 entries, expected one per layer \(4\)"):
        KVCacheBuilder.for_model(model, cfg)

# ---- models ----------------------------------------------------------------------------------------------------
def test_for_model_without_attention_layers_names_the_slots():
    class Recurrent:
        layers = [object(), object(), object()]
        def make_cache(self): return [ArraysCache(2), ArraysCache(2), ArraysCache(2)]
    with pytest.raises(ValueError, match=r"Recurrent: no attention layer found among its 3 cache slots \(slot types \['ArraysCache'\]\)"):
        KVCacheBuilder.for_model(Recurrent(), KVCacheConfig.for_method("h2o", 16))

def test_for_model_on_something_that_is_not_a_model():
    with pytest.raises(ValueError, match="has neither `make_cache` nor `layers`"):
        KVCacheBuilder.for_model(object(), KVCacheConfig.for_method("h2o", 16))

def test_for_model_keeps_non_attention_slots_of_a_hybrid_model():
    class Hybrid:
        layers = [object()] * 3
        def make_cache(self): return [ArraysCache(2), KVCache(), ArraysCache(2)]
    caches = KVCacheBuilder.for_model(Hybrid(), KVCacheConfig.for_method("pyramidkv", 16))
    assert [type(c).__name__ for c in caches] == ["ArraysCache", "EvictingCache", "ArraysCache"]
    assert caches[1].spec.method == "pyramidkv"

# ---- coordinator -----------------------------------------------------------------------------------------------
def test_coordinator_budgets_before_every_layer_reported():
    co = SqueezeCoordinator(3, 16, 2)
    layers = [SqueezeAttentionCache(16, 2, None, co, i) for i in range(3)]
    layers[1].update_and_fetch(mx.random.normal((1, 2, 8, 8)), mx.random.normal((1, 2, 8, 8)))
    with pytest.raises(RuntimeError, match=r"not resolved yet: layers \[0, 2\] have not reported"): co.budgets
    with pytest.raises(RuntimeError, match=r"layers \[0, 2\] have not reported a concentration"): co.finalize()
    assert not co.resolved and co.missing == [0, 2]

def test_coordinator_bad_parameters():
    with pytest.raises(ValueError, match="`n_layers` must be an integer >= 1"): SqueezeCoordinator(0, 16)
    with pytest.raises(ValueError, match=r"`resolved_budget\[1\]` must be an integer in \[5, None\], got 2"):
        SqueezeCoordinator(2, 16, 4, resolved_budget=[16, 2])
    co = SqueezeCoordinator(2, 16, 4)
    with pytest.raises(ValueError, match=r"`layer_idx` must be in \[0, 1\], got 2"): SqueezeAttentionCache(16, 4, None, co, 2)

def test_squeeze_nan_keys_are_refused_at_the_measurement():
    c = SqueezeAttentionCache(16, 2, None, SqueezeCoordinator(1, 16, 2), 0)
    with pytest.raises(ValueError, match="NaN or inf"):
        c.update_and_fetch(mx.full((1, 1, 4, 8), float("nan")), mx.zeros((1, 1, 4, 8)))

# ---- saved prompt caches ---------------------------------------------------------------------------------------
def filled(cls, *a, **k):
    c = cls(*a, **k)
    x = mx.random.normal((1, 2, 20, 8), key=mx.random.key(1))
    c.update_and_fetch(x, x)
    return c

@pytest.mark.parametrize("src,method", [(H2OCache, "h2o"), (PyramidKVCache, "pyramidkv"),
                                        (SqueezeAttentionCache, "squeeze")])
def test_a_state_restores_its_own_method(src, method):
    "Every layer is an `EvictingCache`: a state carries its method, and loading restores that method."
    a = filled(src, 8, 2)
    b = EvictingCache.from_state(a.state)
    assert (b.spec, b.count, b.policy) == (a.spec, a.count, a.policy) and b.spec.method == method

def test_from_state_of_a_plain_kvcache_state():
    kc = KVCache(); x = mx.zeros((1, 2, 4, 8)); kc.update_and_fetch(x, x)
    with pytest.raises((ValueError, TypeError)):
        EvictingCache.from_state(kc.state)

def _retag(path, classes):
    "Rewrite the class names recorded in a saved prompt cache (what a file written by another method would hold)."
    arrays, meta = mx.load(path, return_metadata=True)
    for k in list(meta):
        if k.startswith("1."): meta[k] = classes[int(k.split(".")[1])]
    mx.save_safetensors(path, arrays, meta)

def test_load_prompt_cache_written_by_another_method():
    model = tiny_model("llama", n_layers=2)
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("h2o", 16))
    prompt_logits(model, mx.random.randint(0, 256, (1, 40), key=mx.random.key(2)), caches, chunk=16)
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "c.safetensors")
        save_prompt_cache(f, caches)
        assert [type(c).__name__ for c in load_prompt_cache(f)] == ["EvictingCache"] * 2
        _retag(f, ["PyramidKVCache", "PyramidKVCache"])      # a file written under the old preset class names
        assert [c.spec.method for c in load_prompt_cache(f)] == ["h2o"] * 2   # the state's method, not the name's

def test_loaded_cache_keeps_its_method_and_budget():
    "A file restores the method, budget, sinks and offset it was written with (never the caller's config)."
    model = tiny_model("llama", n_layers=2)
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("pyramidkv", 16, n_sink=3))
    prompt_logits(model, mx.random.randint(0, 256, (1, 40), key=mx.random.key(2)), caches, chunk=16)
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "c.safetensors")
        save_prompt_cache(f, caches)
        loaded = load_prompt_cache(f)
    for a, b in zip(caches, loaded):
        assert (b.spec, b.budget, b.offset, b.count) == (a.spec, a.budget, a.offset, a.count)
        assert b.spec.method == "pyramidkv" and b.spec.info["beta"] == a.spec.info["beta"]

def test_tampered_metadata_budget_below_the_kept_count():
    "A state whose budget is smaller than what it holds (a file edited or written for another budget)."
    k, v, p, s, meta = filled(H2OCache, 16, 2).state
    m = json.loads(meta); m["budget"] = 8
    with pytest.raises(ValueError, match="budget"):
        EvictingCache.from_state((k, v, p, s, json.dumps(m)))

# ---- masks -----------------------------------------------------------------------------------------------------
def test_make_mask_array_covers_stored_plus_chunk():
    c = H2OCache(64, 2)
    x = mx.random.normal((1, 2, 10, 8)); c.update_and_fetch(x, x)
    m = c.make_mask(4, return_array=True)
    assert m.shape == (4, 14)
    ref = KVCache(); ref.update_and_fetch(x, x)
    assert mx.array_equal(m, ref.make_mask(4, return_array=True, window_size=None)).item()

# ---- found by a bad-input review (2026-12-04) ------------------------------------------------------------------
@pytest.mark.parametrize("port", ["-1", "70000"])
def test_serve_port_out_of_range_is_one_line_before_anything_loads(port, capsys):
    from veloxquant_mlx.cli import main
    assert main(["serve", "--model", "tiny:llama", "--method", "h2o", "--budget", "12", "--port", port]) == 2
    assert f"--port {port}: must be in [0, 65535]" in capsys.readouterr().err

def test_serve_address_in_use_is_a_clear_error_and_no_thread_is_left():
    import threading
    from veloxquant_mlx.serve import EvictingServer
    from veloxquant_mlx.serve import tiny_tokenizer
    cfg = KVCacheConfig.for_method("h2o", 12)
    first = EvictingServer(tiny_model("llama"), tiny_tokenizer(), cfg, ["--port", "0", "--log-level", "ERROR"])
    try:
        before = threading.active_count()
        with pytest.raises(ValueError, match=r"cannot listen on `host`='127.0.0.1', `port`=\d+"):
            EvictingServer(tiny_model("llama"), tiny_tokenizer(), cfg,
                           ["--port", str(first.httpd.server_address[1]), "--log-level", "ERROR"])
        assert threading.active_count() == before            # the refused server started no generation thread
    finally: first.stop()

@pytest.mark.parametrize("bad", [None, "h2o", 0.25])
def test_for_model_with_something_that_is_not_a_config(bad):
    with pytest.raises(TypeError, match=r"`config` must be a KVCacheConfig .*got "):
        KVCacheBuilder.for_model(tiny_model("llama"), bad)

def test_pyramid_layer_beta_and_window_pool_are_named():
    from veloxquant_mlx.policies import ObservationWindow
    with pytest.raises(ValueError, match=r"`beta` must be a finite number >= 1.0, got nan"):
        PyramidKVCache(8, beta=float("nan"))
    with pytest.raises(ValueError, match=r"`pool` must be 'avg' or 'max', got 'x'"):
        ObservationWindow(pool="x")

def test_a_recent_no_layer_can_keep_is_said_not_cut_silently():
    import io
    from veloxquant_mlx.cli import main
    from veloxquant_mlx.cache import _FIT_SAID, FittedWarning
    _FIT_SAID.clear()
    with pytest.warns(FittedWarning, match=r"`recent`=500 does not fit a layer of \d+ tokens beside 4 sinks: it keeps \d+"):
        assert main(["generate", "--model", "tiny:llama", "--method", "h2o", "--kv-fraction", "0.25", "--recent", "500",
                     "--max-tokens", "3", "a" * 80], out=io.StringIO()) == 0

@pytest.mark.parametrize("flag", [["--budget", "64"], ["--kv-fraction", "0.5"]])
def test_a_budget_for_the_full_cache_alone_is_refused(flag, capsys):
    from veloxquant_mlx.cli import main
    assert main(["generate", "--model", "tiny:llama", "--method", "full", *flag, "--max-tokens", "2", "hi"]) == 2
    assert f"{' '.join(flag)}: full keeps every token, nothing to budget" in capsys.readouterr().err

@pytest.mark.parametrize("flag", [["--kv-scheme", "group"], ["--kv-group-size", "32"]])
def test_a_storage_format_with_nothing_packed_is_refused(flag, capsys):
    from veloxquant_mlx.cli import main
    assert main(["generate", "--model", "tiny:llama", "--method", "h2o", "--budget", "16", *flag, "hi"]) == 2
    assert f"{' '.join(flag)}: read only with --kv-bits" in capsys.readouterr().err

def test_calibrate_with_more_texts_than_there_are_names_the_flags(capsys, tmp_path):
    from veloxquant_mlx.cli import main
    assert main(["calibrate", "--model", "tiny:gemma3", "--texts", "1000", "--context", "80",
                 "--out", str(tmp_path / "t.json")]) == 2
    assert "--texts 1000 --context 80:" in capsys.readouterr().err

@pytest.mark.parametrize("argv,says", [
    (["passkey", "--model", "tiny:llama", "--tokens", "10"], "--tokens=10"),
    (["serve", "--model", "tiny:llama", "--method", "h2o", "--budget", "12", "--max-tokens-limit", "0"],
     "--max-tokens-limit 0: must be a positive integer"),
    (["serve", "--model", "tiny:llama", "--method", "h2o", "--budget", "12", "--max-prompt-tokens", "-3"],
     "--max-prompt-tokens -3: must be a positive integer")])
def test_command_line_errors_name_the_flag(argv, says, capsys):
    from veloxquant_mlx.cli import main
    assert main(argv) == 2
    assert says in capsys.readouterr().err

def test_a_negative_layer_index_and_rows_that_are_not_layers():
    from veloxquant_mlx.batch import BatchEvictingCache
    with pytest.raises(ValueError, match=r"`layer_idx` must be"): EvictingCache(64, layer_idx=-1)
    with pytest.raises(TypeError, match=r"`rows` must be EvictingCache layers, got a int"): BatchEvictingCache([1, 2])
