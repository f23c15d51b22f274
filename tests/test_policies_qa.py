"""The question-agnostic policies (issue #19): `KeyNorm` (minus the key's L2 norm) and `MeanAttention` (the mean mass
a token received from every query that saw it), checked against plain references through the cache, on tiny models,
across a save/load, and with bad parameters."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import math, os, tempfile
import numpy as np
import pytest
import mlx.core as mx
from mlx_lm.models.cache import save_prompt_cache, load_prompt_cache
from veloxquant_mlx import KVCacheConfig, KVCacheBuilder, EvictingCache, install_attention_hook
from veloxquant_mlx.builder import tiny_model, greedy, prompt_logits, recommended_config
from veloxquant_mlx.policies import KeyNorm, MeanAttention, make_policy, POLICIES
from veloxquant_mlx.storage import make_storage
from veloxquant_mlx.methods import METHODS

def rkv(S, H=2, D=32, seed=0, scale=True):
    "Random keys whose norms spread (so the ranking is not a coin toss) and values."
    k = mx.random.normal((1, H, S, D), key=mx.random.key(seed))
    if scale: k = k * mx.random.uniform(0.2, 3.0, (1, H, S, 1), key=mx.random.key(seed + 1))
    return k, mx.random.normal((1, H, S, D), key=mx.random.key(seed + 99))

def expected_keep(score, n_sink, budget, newest=1):
    "Per head, the kept positions: the sinks, the `newest`, and the best of the rest by `score` `[H, S]` (numpy)."
    H, S = score.shape
    out = []
    for h in range(H):
        forced = set(range(n_sink)) | set(range(S - newest, S))
        rest = sorted((p for p in range(S) if p not in forced), key=lambda p: -score[h, p])
        out.append(sorted(forced | set(rest[:budget - len(forced)])))
    return out

def kept(c):
    return [sorted(c.positions[0, h, :c.count].tolist()) for h in range(c.positions.shape[1])]

# --- KeyNorm ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [None, 4, 2])
def test_key_norm_keeps_the_lowest_norms(bits):
    install_attention_hook()                                       # packed storage is attended through the hook
    k, v = rkv(40, seed=3)
    c = EvictingCache(12, n_sink=3, policy=KeyNorm(), storage=make_storage(bits, 32, "kivi" if bits else "group"))
    c.update_and_fetch(k, v)                                       # one chunk: scored from the float keys, then cut
    ref = -np.round(np.linalg.norm(np.array(k[0]), axis=-1), 3)                 # [H, S]
    assert kept(c) == expected_keep(ref, 3, 12)
    np.testing.assert_allclose(np.array(c._scores[0, :, :c.count]),
                               np.take_along_axis(ref, np.array(c.positions[0, :, :c.count]), axis=-1), rtol=1e-5)

def test_key_norm_sees_the_incoming_float_keys_before_packing():
    install_attention_hook()
    seen = []
    class Spy(KeyNorm):                                            # no `name` of its own: not registered
        def on_keys(self, scores, key_mass, keys=None):
            seen.append(keys)
            return super().on_keys(scores, key_mass, keys)
    k, v = rkv(20, seed=5)
    c = EvictingCache(8, n_sink=2, policy=Spy(), storage=make_storage(2, 32, "kivi"))
    c.update_and_fetch(k[:, :, :12], v[:, :, :12]); c.update_and_fetch(k[:, :, 12:], v[:, :, 12:])
    assert all(s is not None and s.dtype == mx.float32 for s in seen[:2])
    assert mx.array_equal(seen[1], k[:, :, 12:]).item()

def test_key_norm_prompt_end_in_chunks_equals_one_chunk():
    k, v = rkv(37, seed=8)
    def run(step):
        c = EvictingCache(10, n_sink=2, policy=KeyNorm(), compress="prompt_end")
        for a in range(0, 36, step): c.update_and_fetch(k[:, :, a:min(a + step, 36)], v[:, :, a:min(a + step, 36)])
        c.update_and_fetch(k[:, :, 36:], v[:, :, 36:])             # the one-token pass ends the prompt
        return c
    one, many = run(36), run(5)
    assert kept(one) == kept(many) and one.count == 10
    ref = -np.round(np.linalg.norm(np.array(k[0]), axis=-1), 3)
    assert kept(one) == expected_keep(ref, 2, 10)                   # position 36 (the newest) protected

def test_key_norm_chunks_keep_whole_chunks():
    k, v = rkv(64, seed=11)
    c = EvictingCache(24, n_sink=0, policy=KeyNorm(chunk=8))
    c.update_and_fetch(k, v)
    ref = -np.round(np.linalg.norm(np.array(k[0]), axis=-1), 3)                 # [H, 64]
    for h, got in enumerate(kept(c)):
        sums = ref[h].reshape(8, 8).sum(-1)                        # chunks ranked by summed score, then the token's own
        rank = np.argsort(np.argsort(-sums))
        order = sorted(range(63), key=lambda p: (rank[p // 8], -ref[h, p]))
        assert got == sorted(order[:23] + [63])                    # the newest forced in, 23 by chunk

# --- MeanAttention ---------------------------------------------------------------------------------------------------

def dense_mass(q, k, scale):
    "Per KV head, the summed causal softmax mass every key receives `[H_kv, S]` (GQA groups summed)."
    qn, kn = np.array(q[0], np.float64), np.array(k[0], np.float64)
    Hq, S, _ = qn.shape; Hk = kn.shape[0]; g = Hq // Hk
    out = np.zeros((Hk, kn.shape[1]))
    off = kn.shape[1] - S
    for h in range(Hq):
        lg = qn[h] @ kn[h // g].T * scale
        lg[np.arange(S)[:, None] + off < np.arange(kn.shape[1])[None]] = -np.inf
        w = np.exp(lg - lg.max(-1, keepdims=True)); w /= w.sum(-1, keepdims=True)
        out[h // g] += w.sum(0)
    return out

def test_mean_attention_keeps_the_best_mean_mass():
    install_attention_hook()
    k, v = rkv(30, seed=21, scale=False)
    q = mx.random.normal((1, 4, 30, 32), key=mx.random.key(22))
    c = EvictingCache(12, n_sink=2, policy=MeanAttention())
    kf, vf = c.update_and_fetch(k, v)
    c.attention(q, kf, vf, scale=0.25)
    mass = dense_mass(q, k, 0.25)
    mean = mass / (30 - np.arange(30))                              # queries 0..29 see key p: 30 - p of them
    assert kept(c) == expected_keep(mean, 2, 12)
    np.testing.assert_allclose(np.array(c._scores[0, :, :c.count]),  # the kept scores are the sums
                               np.take_along_axis(mass, np.array(c.positions[0, :, :c.count]), axis=-1), rtol=1e-4)

def test_mean_attention_prompt_end_in_chunks_equals_one_chunk():
    install_attention_hook()
    k, v = rkv(31, seed=40, scale=False)
    q = mx.random.normal((1, 4, 31, 32), key=mx.random.key(41))
    def run(chunks):
        c, a = EvictingCache(12, n_sink=2, policy=MeanAttention(chunk=2), compress="prompt_end"), 0
        for n in chunks + [1]:
            kf, vf = c.update_and_fetch(k[:, :, a:a + n], v[:, :, a:a + n])
            c.attention(q[:, :, a:a + n], kf, vf, scale=0.25)
            a += n
        return c
    one, many = run([30]), run([5] * 6)
    assert kept(one) == kept(many) and one.count == 12
    np.testing.assert_allclose(np.array(one._scores), np.array(many._scores), atol=1e-4)

# --- tiny models: the builder, generation, save/load -----------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("method", ["keynorm", "mean-attention"])
def test_tiny_models_generate_and_round_trip(arch, method):
    model = tiny_model(arch)
    prompt = mx.random.randint(0, 256, (1, 90), key=mx.random.key(7))
    cfg = KVCacheConfig.for_method(method, 24, chunk=4, window_method="streamingllm" if arch == "gemma3" else None)
    caches = KVCacheBuilder.for_model(model, cfg)
    greedy(model, prompt, caches, 3, chunk=32)
    for c in caches:
        assert c.count <= c.budget
        assert c.policy.name in ("key_norm", "mean_attention", "recency")
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "c.safetensors")
        save_prompt_cache(f, caches)
        loaded = load_prompt_cache(f)
    assert [type(c.policy) for c in loaded] == [type(c.policy) for c in caches]
    assert all(mx.array_equal(a.positions, b.positions).item() and mx.array_equal(a._scores, b._scores).item()
               for a, b in zip(caches, loaded))
    for t in (5, 9, 13):                                           # decoding on, evicting, from both copies
        nxt = mx.array([[t]])
        assert mx.allclose(model(nxt, cache=caches), model(nxt, cache=loaded), atol=1e-5).item()
    assert all(mx.array_equal(a.positions, b.positions).item() for a, b in zip(caches, loaded))

def test_default_with_a_question_agnostic_global_policy():
    cfg = recommended_config(0.25, method="mean-attention", chunk=16)
    assert cfg.policy == MeanAttention(chunk=16) and cfg.window_method == "streamingllm" and cfg.kv_bits == "auto"
    model = tiny_model("gemma3")
    caches = KVCacheBuilder.for_model(model, cfg)
    greedy(model, mx.random.randint(0, 256, (1, 80), key=mx.random.key(2)), caches, 2)
    assert {type(c.policy).__name__ for c in caches} == {"MeanAttention", "Recency"}

# --- bad parameters --------------------------------------------------------------------------------------------------

def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match=r"`chunk` must be an integer >= 1, got 0"): KeyNorm(chunk=0)
    with pytest.raises(ValueError, match=r"`chunk` must be an integer >= 1, got -2"): MeanAttention(chunk=-2)
    with pytest.raises(ValueError, match=r"`chunk` must be an integer >= 1, got 1.5"):
        KVCacheConfig.for_method("keynorm", 32, chunk=1.5).policy
    with pytest.raises(ValueError, match=r"`obs_window` is not a parameter of method 'mean-attention'"):
        KVCacheConfig.for_method("mean-attention", 32, obs_window=8)
    with pytest.raises(ValueError, match=r"policy 'key_norm' has no parameter 'kernel'"): make_policy("key_norm", kernel=3)
    assert make_policy("mean_attention", chunk=4) == MeanAttention(chunk=4)
    assert {"key_norm", "mean_attention"} <= set(POLICIES) and {"keynorm", "mean-attention"} <= set(METHODS)
