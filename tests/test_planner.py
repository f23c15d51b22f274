"""The byte planner on tiny models: bytes within the share while decoding, per-layer widths that save and load, an
unspent share reported, batch rows equal to single runs under the default, schedules over any policy."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import numpy as np
import pytest
import mlx.core as mx
from mlx_lm.models.cache import save_prompt_cache, load_prompt_cache
from veloxquant_mlx.builder import (tiny_model, KVCacheConfig, KVCacheBuilder, greedy, prompt_logits, coordinator_of,
                                    recommended_config, cache_summary)
from veloxquant_mlx.batch import greedy_alone, greedy_batched
from veloxquant_mlx.eval.measure import kv_bytes_bf16, full_bytes_bf16

MODELS = {}
def gemma(window=64):
    "Tiny Gemma 3 whose head_dim the groups of 64 divide (so the planner packs)."
    if window not in MODELS: MODELS[window] = tiny_model("gemma3", n_layers=6, head_dim=64, sliding_window=window)
    return MODELS[window]

def auto(f, **kw): return KVCacheConfig.for_method("chunkkv", kv_fraction=f, kv_bits="auto", chunk=4, **kw)

@pytest.mark.parametrize("f,n,slack", [(0.5, 300, 0), (0.25, 300, 0), (0.25, 700, 8), (0.125, 700, 0), (0.1, 500, 4)])
def test_bytes_within_the_share_while_decoding(f, n, slack):
    model = gemma()
    caches = KVCacheBuilder.for_model(model, auto(f, slack=slack))
    coordinator_of(caches).quality = None       # the bare ladder, 3 bits in: this head_dim reads SmolLM2's rung table
    out = prompt_logits(model, mx.random.randint(0, 256, (1, n), key=mx.random.key(n)), caches, chunk=128)
    tok = mx.argmax(out[:, -1], -1)
    co = coordinator_of(caches)
    for step in range(90):                                     # past a whole group: the residual fills and flushes
        out = model(tok[:, None], cache=caches)
        tok = mx.argmax(out[:, -1], -1)
        held = kv_bytes_bf16(caches) / full_bytes_bf16(model, n + step + 1)
        assert held <= f + 1e-9, (step, held, co.bits, co.budgets)
    assert co.planned_share <= f + 1e-9 and held > 0.5 * f     # within the share, and most of it used
    assert {c.store.bits for c in caches} <= {2, 3, 4, 5, 6, 8, 16}

def test_mixed_widths_round_trip(tmp_path):
    model = gemma()
    caches = KVCacheBuilder.for_model(model, auto(0.25))
    co = coordinator_of(caches)
    co.costs, co.quality = None, None   # widths by bytes and the bare ladder: (4, 3) here (SmolLM2's table or time: 4)
    prompt = mx.random.randint(0, 256, (1, 500), key=mx.random.key(1))
    toks, _ = greedy(model, prompt, caches, 3, chunk=128)
    bits = [c.store.bits for c in caches]
    assert len(set(bits)) > 1, bits                            # the windowed and global layers differ here
    save_prompt_cache(str(tmp_path / "c.safetensors"), caches)
    loaded = load_prompt_cache(str(tmp_path / "c.safetensors"))
    assert [c.store.bits for c in loaded] == bits
    a, b = (model(toks[:, -1:], cache=cs) for cs in (caches, loaded))
    np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5)

def test_an_unspent_share_is_reported():
    model = gemma()
    caches = KVCacheBuilder.for_model(model, auto(0.9))
    coordinator_of(caches).costs = None                      # by bytes alone (priced in time: float, on this CPU)
    greedy(model, mx.random.randint(0, 256, (1, 300), key=mx.random.key(2)), caches, 1, chunk=128)
    co = coordinator_of(caches)
    assert co.bits == [8] * 6 and co.budgets == [c.count for c in caches]     # everything kept at 8 bits
    assert co.planned_share < 0.6                                               # 0.9 asked, 0.53 can be used
    rows = cache_summary(caches)
    assert [r["bits"] for r in rows] == [8] * 6

def test_unpackable_head_dim_plans_in_float():
    model = tiny_model("llama")                                                 # head_dim 16: groups of 64 cannot
    caches = KVCacheBuilder.for_model(model, recommended_config(0.25))
    greedy(model, mx.random.randint(0, 256, (1, 200), key=mx.random.key(3)), caches, 2, chunk=64)
    co = coordinator_of(caches)
    assert co.bits == [16] * 4 and sum(co.budgets) == int(0.25 * 4 * 201)
    assert not any(hasattr(c.store, "bits") for c in caches)

PROMPTS = [np.random.default_rng(0).integers(1, 255, n).tolist() for n in (300, 170, 450)]

def test_batch_rows_equal_alone_under_the_default():
    model, cfg = gemma(), recommended_config(0.25)
    alone = [greedy_alone(model, p, KVCacheBuilder.for_model(model, cfg), 6, 64) for p in PROMPTS]
    got, _ = greedy_batched(model, PROMPTS, [KVCacheBuilder.for_model(model, cfg) for _ in PROMPTS], 6,
                            arrivals=[0, 0, 2], prefill_step_size=64)
    assert got == alone

@pytest.mark.parametrize("schedule", ["squeeze", "pyramid"])
def test_schedules_over_a_share_of_bytes(schedule):
    model = gemma()
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("snapkv", kv_fraction=0.3, schedule=schedule))
    greedy(model, mx.random.randint(0, 256, (1, 400), key=mx.random.key(4)), caches, 2, chunk=128)
    co, full = coordinator_of(caches), [64, 64, 401, 64, 64, 401]
    assert sum(co.budgets) == int(0.3 * sum(full)) and all(0 < b <= f for b, f in zip(co.budgets, full))
    assert co.budgets != [round(0.3 * f) for f in full]                         # not the even share
    assert all(c.count <= b for c, b in zip(caches, co.budgets))

def test_ending_the_prompt_explicitly_packs_what_is_kept():
    "A plan that keeps every token still packs it when the prompt is ended by `end_prompt` (the quality harness's way)."
    model = gemma()
    caches = KVCacheBuilder.for_model(model, auto(0.6))
    prompt_logits(model, mx.random.randint(0, 256, (1, 300), key=mx.random.key(5)), caches, chunk=128)
    for c in caches: c.end_prompt()
    co = coordinator_of(caches)
    assert co.budgets == [c.count for c in caches]                             # everything kept...
    assert all(c.store.packed_slots() >= 64 for c in caches)                     # ... and packed
    assert kv_bytes_bf16(caches) / full_bytes_bf16(model, 300) <= 0.6

def test_the_bound_row_keeps_every_global_token_within_its_share():
    "`scripts/bench_tasks.py`'s `all-global-w256` bound: 3 bits, 256 tokens per window, every global token, no more."
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    import bench_tasks
    model, n = gemma(512), 640                                  # whole groups (as the study's contexts are)
    from veloxquant_mlx.eval.batching import slot_windows
    caches = bench_tasks.builders(bench_tasks.bound_rows([0.1], slot_windows(model), n))["all-global-w256"](model)
    prompt_logits(model, mx.random.randint(0, 256, (1, n), key=mx.random.key(6)), caches, chunk=128)
    for c in caches: c.end_prompt()
    co = coordinator_of(caches)
    assert co.bits == [3] * 6 and co.budgets == [256, 256, n, 256, 256, n]
    assert [c.count for c in caches] == co.budgets
    assert kv_bytes_bf16(caches) / full_bytes_bf16(model, n) <= co.fraction
