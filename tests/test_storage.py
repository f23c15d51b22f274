"""Quantized KV storage (8/4/2 bits, group-wise and KIVI) under real mlx-lm generation on tiny random models.

What must hold whatever the bit width: budgets and sinks, the exact kept positions of a position-only policy, the
decoded error bound, saved states, the quality harness's shared prefill and batched decoding, and named errors."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import os, tempfile
import numpy as np
import pytest
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import save_prompt_cache, load_prompt_cache, make_prompt_cache, QuantizedKVCache
from veloxquant_mlx import KVCacheConfig, KVCacheBuilder, EvictingCache, install_attention_hook
from veloxquant_mlx.builder import tiny_model, prompt_logits
from veloxquant_mlx.cli import ByteTokenizer, main
from veloxquant_mlx.h2o import kept_agreement
from veloxquant_mlx.storage import GroupStorage, KiviStorage, make_storage
from veloxquant_mlx.eval import batching as Q
from veloxquant_mlx.eval.prompts import passkey_set

FORMATS = [dict(kv_bits=b, kv_scheme=s, kv_group_size=32) for b in (8, 4, 2) for s in ("group", "kivi")]
fid = lambda f: f"{f['kv_scheme']}{f['kv_bits']}"
PROMPT = mx.random.randint(0, 256, (1, 150), key=mx.random.key(21))

def model_of(arch): return tiny_model(arch, n_layers=3, head_dim=64)

def run(model, caches, n=24, step=48):
    "Greedy tokens through mlx-lm's generate_step (chunked prefill, then one token at a time)."
    gen = generate_step(PROMPT[0], model, prompt_cache=caches, prefill_step_size=step, max_tokens=n)
    return [int(t) for (t, _), _ in zip(gen, range(n))]

def check_layers(caches):
    "Budgets, sinks, unique positions, the newest token, and a storage that holds exactly what the cache counts."
    for c in caches:
        pos = np.array(c.positions[:, :, :c.count])
        if c.budget is not None: assert c.count <= c.budget
        live_sinks = {p for p in range(c.spec.n_sink) if c.spec.window is None or p > c.offset - 1 - c.spec.window}
        for row in pos.reshape(-1, pos.shape[-1]).tolist():
            assert len(set(row)) == len(row) and c.offset - 1 in row and live_sinks <= set(row)
            assert max(row) < c.offset
        if isinstance(c.store, KiviStorage): assert c.store.slots == c.count and c.store.kr.shape[2] < 32
        assert c.nbytes == c.store.nbytes and c.stats["nbytes_bf16"] <= c.nbytes

EVERY = ["h2o", "snapkv", "tova", "chunkkv", "pyramidkv", "squeeze"]
CASES = [(m, FORMATS[(i + j) % len(FORMATS)]) for i, m in enumerate(EVERY) for j in (0, 3)]   # each format twice

@pytest.mark.parametrize("method,fmt", CASES, ids=[f"{m}-{fid(f)}" for m, f in CASES])
def test_every_method_keeps_its_budget_and_sinks_quantized(method, fmt):
    model = model_of("gemma3")                           # 2 sliding-window layers (window 16) and a global one
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method(method, 40, **fmt))
    assert all(type(c.store).__name__ == ("KiviStorage" if fmt["kv_scheme"] == "kivi" else "GroupStorage") for c in caches)
    toks = run(model, caches)
    check_layers(caches)
    assert run(model, KVCacheBuilder.for_model(model, KVCacheConfig.for_method(method, 40, **fmt))) == toks

POS = [("gemma3", f) for f in FORMATS] + [(a, f) for a in ("llama", "qwen3") for f in FORMATS[3:4]]

@pytest.mark.parametrize("arch,fmt", POS, ids=[f"{a}-{fid(f)}" for a, f in POS])
def test_position_policy_keeps_exactly_the_float_positions(arch, fmt):
    "StreamingLLM chooses by position only: quantized storage must keep the very same positions in every layer."
    model = model_of(arch)
    ref = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("streamingllm", 40))
    q = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("streamingllm", 40, **fmt))
    run(model, ref), run(model, q)
    for a, b in zip(ref, q):
        assert a.count == b.count and kept_agreement(a.positions[:, :, :a.count], b.positions[:, :, :b.count]) == 1.0

def test_attention_scored_policies_mostly_agree_with_float():
    "H2O with the real queries: at 8 bits nearly the same tokens are kept as in float (2 bits: fewer, still most)."
    model = model_of("llama")
    ref = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("h2o", 40))
    run(model, ref)
    share = {}
    for fmt in FORMATS:
        q = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("h2o", 40, **fmt))
        run(model, q)
        share[fid(fmt)] = np.mean([kept_agreement(a.positions[:, :, :a.count], b.positions[:, :, :b.count])
                                   for a, b in zip(ref, q)])
    assert share["group8"] >= 0.95 and share["kivi8"] >= 0.95, share
    assert min(share.values()) >= 0.5, share

@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("scheme", ["group", "kivi"])
def test_decoded_storage_within_half_a_step(bits, scheme):
    "What a layer decodes to is within half a quantization step of what it was given (KIVI's residual: exact)."
    install_attention_hook()
    c = EvictingCache(None, storage=make_storage(bits, 32, scheme))
    k = mx.random.normal((2, 2, 100, 64), key=mx.random.key(bits))
    v = mx.random.normal((2, 2, 100, 64), key=mx.random.key(bits + 10)) * 3.0
    c.update_and_fetch(k, v)
    st, L = c.store, 2 ** bits - 1
    dk, dv = np.array(st.key_rows(0, 100)), np.array(st.value_rows(0, 100))
    if scheme == "group":
        ks, vs = (np.repeat(np.array(a[1]), 32, axis=-1) for a in (st.k, st.v))
    else:
        P = st.P
        assert P == 96 and np.array_equal(dk[:, :, P:], np.array(k[:, :, P:]))           # the residual is exact
        ks = np.concatenate([np.repeat(np.array(st.kp[1]), 32, axis=-1).swapaxes(-1, -2),
                             np.zeros((2, 2, 100 - P, 64))], axis=2)
        vs = np.concatenate([np.repeat(np.array(st.vp[1]), 32, axis=-1), np.zeros((2, 2, 100 - P, 64))], axis=2)
    assert (np.abs(dk - np.array(k)) <= ks / 2 + 1e-5).all()
    assert (np.abs(dv - np.array(v)) <= vs / 2 + 1e-5).all()
    step = (2 * 3.0 * 2.5) / L                                                        # ~the range of 32 values / L
    assert np.abs(dv - np.array(v)).mean() < step                                     # the error shrinks with the bits

@pytest.mark.parametrize("fmt", [dict(kv_bits=4, kv_scheme="group"), dict(kv_bits=2, kv_scheme="kivi")], ids=fid)
def test_state_round_trips_and_continues_identically(fmt):
    model = model_of("gemma3")
    caches = KVCacheBuilder.for_model(model, KVCacheConfig.for_method("tova", 40, kv_group_size=32, **fmt))
    prompt_logits(model, PROMPT[:, :100], caches, chunk=64)
    for t in range(5): model(PROMPT[:, 100 + t:101 + t], cache=caches)              # evict in decode as well
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "c.safetensors")
        save_prompt_cache(f, caches)
        loaded = load_prompt_cache(f)
    assert [type(c.store) for c in loaded] == [type(c.store) for c in caches]
    for a, b in zip(caches, loaded):
        assert (a.count, a.offset, a.nbytes) == (b.count, b.offset, b.nbytes)
    nxt = mx.array([[7]])
    assert mx.array_equal(model(nxt, cache=caches), model(nxt, cache=loaded)).item()

def test_kivi_trim():
    "Before any eviction: a trim inside the residual only shortens it; one into the groups returns them to floats."
    model = model_of("llama")
    caches = KVCacheBuilder.for_model(model, KVCacheConfig("full", kv_bits=4, kv_scheme="kivi", kv_group_size=32))
    prompt_logits(model, PROMPT[:, :70], caches)
    c = caches[0]
    st = c.store
    kp, kr = st.kp, st.kr
    assert (st.P, st.kr.shape[2], c.count) == (64, 6, 70)
    assert c.trim(3) == 3
    assert (st.P, c.count, st.repacks) == (64, 67, 0) and st.kp is kp
    assert mx.array_equal(st.kr, kr[:, :, :3]).item() and (np.array(c.positions[0, 0, 67:]) == 2**31 - 1).all()
    assert c.trim(10) == 10
    assert (st.P, st.slots, c.count, st.repacks) == (0, 57, 57, 1)
    assert mx.isfinite(model(PROMPT[:, 57:58], cache=caches)).all().item()
    check_layers(caches)

def test_quality_harness_shared_prefill_and_batches():
    "mlx-lm's QuantizedKVCache and ours go through the shared prefill and batched decoding as each alone does."
    model, tok = model_of("gemma3"), ByteTokenizer()
    cfgs = [KVCacheConfig("full", kv_bits=4, kv_scheme="mlx", kv_group_size=32),
            KVCacheConfig("full", kv_bits=4, kv_scheme="kivi", kv_group_size=32),
            KVCacheConfig.for_method("snapkv", 40, kv_bits=4, kv_scheme="kivi", kv_group_size=32),
            KVCacheConfig.for_method("h2o", 40, kv_bits=8, kv_group_size=32)]
    ids = passkey_set(tok, 1, lengths=[300], depths=[0.5])[0]["ids"]
    sets = Q.prefilled(model, ids[:-1], cfgs)
    assert any(isinstance(c, QuantizedKVCache) for c in sets[1])
    res = Q.check_batched(model, tok, ids, cfgs, max_tokens=4)
    assert all(r["same"] for r in res.values()), res
    seq = [Q.score_continuation(model, c, ids, 250, 8) for c in Q.prefilled(model, ids[:250], cfgs)]
    bat = Q.batched_score(model, Q.prefilled(model, ids[:250], cfgs), ids, 250, 8)
    for (a, n), (b, k) in zip(seq, bat): assert n == k and abs(a - b) <= 1e-4 * abs(a) + 1e-3

def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"`kv_bits` must be one of \(2, 3, 4, 5, 6, 8\)"):
        KVCacheConfig.for_method("h2o", 64, kv_bits=7)
    with pytest.raises(ValueError, match="`kv_group_size` must be one of"):
        KVCacheConfig.for_method("h2o", 64, kv_bits=4, kv_group_size=24)
    with pytest.raises(ValueError, match="`kv_scheme` must be one of"):
        KVCacheConfig.for_method("h2o", 64, kv_bits=4, kv_scheme="fp4")
    with pytest.raises(ValueError, match="`kv_group_size`=64 must divide head_dim=16"):
        KVCacheBuilder.for_model(tiny_model("llama"), KVCacheConfig.for_method("snapkv", 64, kv_bits=4))
    with pytest.raises(ValueError, match="cannot quantize RotatingKVCache"):
        KVCacheConfig.for_method("mlx-rotating", 64, kv_bits=8)
    with pytest.raises(ValueError, match="is for method 'full' only"):
        KVCacheConfig.for_method("tova", 64, kv_bits=8, kv_scheme="mlx")
    with pytest.raises(TypeError, match="`storage` must be a Storage"):
        EvictingCache(16, storage="kivi")
    c = EvictingCache(16, storage=GroupStorage(4, 32))
    c.update_and_fetch(mx.zeros((1, 1, 2, 64)), mx.zeros((1, 1, 2, 64)))
    with pytest.raises(ValueError, match="does not match"):
        c.update_and_fetch(mx.zeros((1, 1, 1, 32)), mx.zeros((1, 1, 1, 32)))
    assert main(["generate", "--kv-bits", "3", "--model", "tiny:llama", "hi"]) == 2

def test_bench_script_quick_attention(tmp_path):
    "The measurement script's attention part runs on its own and writes its JSON (structure only, no timing claims)."
    import json, subprocess, sys
    from pathlib import Path
    out = tmp_path / "storage.json"
    r = subprocess.run([sys.executable, "scripts/bench_storage.py", "--quick", "--parts", "attention", "--out", str(out)],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(out.read_text())["attention"]["result"]["512"]
    assert {"float32 (attention_with_mass)", "kivi 4-bit (qmm + residual)", "group 2-bit (transposed qmm keys)"} <= set(d)
    assert all(len(v["rounds_us"]) == 2 for v in d.values())
