"""Soak: 10,000 decode steps at budget 128 on a small random model.

Asserted (deterministic): the caches' bytes are flat once the budget fills (and MLX's active memory with them), every
layer at its budget, and the same tokens on a re-run with the same seed. Printed, never asserted: the step-time trend
(first vs last 1,000 steps), which moves with the load of this shared machine. The figures are recorded in
nbs/08_reliability.ipynb and the speed benchmark (nbs/12_speed.ipynb)."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import time
import numpy as np
import pytest
import mlx.core as mx
from veloxquant_mlx import KVCacheConfig, KVCacheBuilder, EvictingCache
from veloxquant_mlx.methods import METHODS
from veloxquant_mlx.builder import tiny_model

def soak(model, cfg, n_steps, seed=0, prompt_len=32, mem_every=500):
    "Sample `n_steps` tokens (seeded categorical) after a random prompt; per-step times, cache bytes, active memory."
    caches = KVCacheBuilder.for_model(model, cfg)
    ours = [c for c in caches if isinstance(c, EvictingCache)]
    mx.random.seed(seed)
    prompt = mx.random.randint(0, model.args.vocab_size, (1, prompt_len))
    out = model(prompt, cache=caches)
    tok = mx.random.categorical(out[:, -1])
    mx.eval(tok)
    toks, times, cpu, nbytes, mem, full_at = [], np.empty(n_steps), np.empty(n_steps), np.empty(n_steps, np.int64), [], None
    for i in range(n_steps):
        t0, c0 = time.perf_counter(), time.process_time()
        out = model(tok[:, None], cache=caches)
        tok = mx.random.categorical(out[:, -1])
        mx.eval(tok)
        times[i], cpu[i] = time.perf_counter() - t0, time.process_time() - c0
        toks.append(tok.item())
        nbytes[i] = sum(c.nbytes + c.stats["overhead_nbytes"] for c in ours)
        if full_at is None and all(c.count == c.budget for c in ours): full_at = i
        if i % mem_every == 0 or i == n_steps - 1: mem.append((i, mx.get_active_memory()))
    return dict(tokens=toks, times=times, cpu=cpu, nbytes=nbytes, mem=mem, full_at=full_at, caches=caches)

def summary(r, window=1000):
    """Step times of the first / last `window` steps (and of the first `window` once every layer is full), cache bytes,
    MLX active memory. Wall-clock medians swing with whatever else shares the CPU, so the trend is judged on the
    process CPU time per step (median) and on the wall-clock 10th percentile (the uncontended speed)."""
    t, c, f = r["times"], r["cpu"], r["full_at"]
    med, p10 = np.median, lambda a: np.percentile(a, 10)
    after = r["nbytes"][f:]
    mem_after = [m for i, m in r["mem"] if i > f]
    return dict(steps=len(t), full_at=f, ms_first=1e3 * med(t[:window]), ms_first_full=1e3 * med(t[f:f + window]),
                ms_last=1e3 * med(t[-window:]), wall_ratio=med(t[-window:]) / med(t[f:f + window]),
                p10_ratio=p10(t[-window:]) / p10(t[f:f + window]), cpu_ms_first_full=1e3 * med(c[f:f + window]),
                cpu_ms_last=1e3 * med(c[-window:]), cpu_ratio=med(c[-window:]) / med(c[f:f + window]),
                cache_bytes=int(after[0]), cache_bytes_range=int(after.max() - after.min()),
                mem_first=mem_after[0], mem_last=mem_after[-1], mem_range=max(mem_after) - min(mem_after))

@pytest.mark.slow
def test_soak_10k_decode_steps_at_budget_128():
    model = tiny_model("llama", n_layers=2)
    cfg = KVCacheConfig.for_method("h2o", 128)
    r = soak(model, cfg, 10_000, seed=7)
    s = summary(r)
    print("\nsoak h2o budget 128:", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items()})
    caches = r["caches"]
    assert all(c.count == 128 and c.offset == 32 + 10_000 for c in caches)
    assert s["full_at"] == 128 - 32 - 1                             # prompt 32 + the first sampled token fill 128
    assert s["cache_bytes_range"] == 0                              # bytes held by the caches: flat once full
    assert s["mem_range"] <= 1 << 20                                # MLX active memory: flat within 1 MiB
    # the step-time trend (cpu_ratio, p10_ratio) is printed, not asserted: this shared 2-core machine's load moves a step
    # between ~1.2 and ~3.4 ms; the benchmark and nbs/08_reliability report it
    again = soak(model, cfg, 2_000, seed=7)                         # same seed: the same tokens (eviction included)
    assert again["tokens"] == r["tokens"][:2_000]
    for a, b in zip(again["caches"], caches): assert a.count == b.count

@pytest.mark.slow
@pytest.mark.parametrize("method", [m for m, e in METHODS.items() if not e.baseline and m != "h2o"])
def test_soak_other_methods_stay_flat(method):
    model = tiny_model("qwen3", n_layers=3)
    cfg = KVCacheConfig.for_method(method, 64)
    r = soak(model, cfg, 1_500, seed=3)
    s = summary(r, window=300)
    print(f"\nsoak {method} budget 64:", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items()})
    assert s["cache_bytes_range"] == 0 and s["mem_range"] <= 1 << 20
    assert [c.count for c in r["caches"]] == [c.budget for c in r["caches"]]
    assert soak(model, cfg, 400, seed=3)["tokens"] == r["tokens"][:400]
