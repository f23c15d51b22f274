"""Quantized KV storage, measured: attention paths at decode shapes, the model's decode step, kept-token agreement with
the float path, and perplexity through the quality harness (Gemma 3 270M, float32 on CPU).

Usage: python scripts/bench_storage.py [--quick] [--parts attention,decode,agreement,perplexity] [--out PATH]
A run updates only the parts it measures in the output JSON (default nbs/results/storage.json; quick:
nbs/results/storage_quick.json), so the long perplexity part can run on its own.
"""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before MLX)
import argparse, json, os, statistics, sys, time
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from veloxquant_mlx.builder import KVCacheBuilder, KVCacheConfig, kv_nbytes_bf16
from veloxquant_mlx.h2o import kept_agreement
from veloxquant_mlx.methods import keep_all_caches
from veloxquant_mlx.storage import FloatStorage, GroupStorage, KiviStorage, dequantize_groups
from veloxquant_mlx.eval import grid as Q  # the quality harness: perplexity_rows reads its kv_bytes (patched below)
from veloxquant_mlx.eval.prompts import ppl_sequences
from veloxquant_mlx.eval.batching import shared_prefill, batched_forward, cache_arrays, slot_windows

FULL_RUN = dict(lengths=[512, 1024, 2048], att_rounds=7, att_reps=15, context=2048, decode_rounds=8, decode_steps=4,
                agree_context=1536, agree_decode=64, ppl_texts=6, ppl_context=1536, ppl_tokens=256, ppl_chunk=16)
QUICK = dict(lengths=[512], att_rounds=2, att_reps=3, context=512, decode_rounds=2, decode_steps=2, agree_context=512, agree_decode=8,
             ppl_texts=1, ppl_context=512, ppl_tokens=32, ppl_chunk=16)
PPL_ROWS = [("full", None, dict(kv_bits=b, kv_scheme=s)) for b in (8, 4, 2) for s in ("group", "kivi")] + \
           [("full", None, dict(kv_bits=b, kv_scheme="mlx")) for b in (8, 4)] + \
           [("snapkv", 256, {}), ("snapkv", 256, dict(kv_bits=4, kv_scheme="kivi"))]
AGREE_ROWS = [("snapkv", 256), ("h2o", 256), ("tova", 256), ("streamingllm", 256)]

def med(xs): return statistics.median(xs)

def machine()->dict:
    return dict(cpu_count=os.cpu_count(), load_avg=os.getloadavg(), python=sys.version.split()[0], mlx=mx.__version__)

# --- attention paths at decode shapes -------------------------------------------------------------------------------
def _stores(L:int, bits:int, D:int=256, seed:int=0)->dict:
    "Storages holding L random keys/values of one KV head (KIVI: L quantized and 32 more in its residual)."
    k = mx.random.normal((1, 1, L + 32, D), key=mx.random.key(seed))
    v = mx.random.normal((1, 1, L + 32, D), key=mx.random.key(seed + 1))
    g, kv = GroupStorage(bits, 64), KiviStorage(bits, 64)
    g.append(k[:, :, :L], v[:, :, :L])
    kv.append(k[:, :, :L], v[:, :, :L]); kv.settle(); kv.append(k[:, :, L:], v[:, :, L:])
    mx.eval(g.k, g.v, kv.kp, kv.vp, kv.kr, kv.vr)
    return dict(k=k[:, :, :L], v=v[:, :, :L], group=g, kivi=kv)

def attention_paths(lengths, rounds:int, reps:int, bits_list=(8, 4, 2))->dict:
    "Median time of one decode attention (4 query heads, 1 KV head, head_dim 256) with its mass, per path and length."
    q, scale, out = mx.random.normal((1, 4, 1, 256), key=mx.random.key(9)), 256 ** -0.5, {}
    for L in lengths:
        pos = mx.arange(L, dtype=mx.int32)[None, None]
        qpos = mx.array([L], mx.int32)
        paths = {}
        for bits in bits_list:
            s = _stores(L, bits)
            paths.setdefault("float32 (attention_with_mass)",
                             lambda f=FloatStorage(), k=s["k"], v=s["v"]: f.attention_with_mass(q, k, v, pos, qpos, scale))
            paths.setdefault("float32 mx.fast.sdpa (no mass)",
                             lambda k=s["k"], v=s["v"]: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale))
            g, kv = s["group"], s["kivi"]
            kpos = mx.arange(L + 32, dtype=mx.int32)[None, None]
            paths[f"group {bits}-bit (transposed qmm keys)"] = \
                lambda g=g: g.attention_with_mass(q, *g.view(L), pos, qpos, scale)
            paths[f"kivi {bits}-bit (qmm + residual)"] = \
                lambda kv=kv, n=L + 32: kv.attention_with_mass(q, *kv.view(n), kpos, mx.array([n], mx.int32), scale)
            def dequant(g=g):
                k = dequantize_groups(*g.k, g.bits, 64)
                v = dequantize_groups(*g.v, g.bits, 64)
                return FloatStorage().attention_with_mass(q, k, v, pos, qpos, scale)
            paths[f"group {bits}-bit dequantized + float32 (a full copy)"] = dequant
        times = {n: [] for n in paths}
        names = list(paths)
        for r in range(rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:                # rotate the order every round
                f = paths[n]
                mx.eval(f())
                ts = []
                for _ in range(reps):
                    t = time.perf_counter()
                    mx.eval(f())
                    ts.append(time.perf_counter() - t)
                times[n].append(med(ts))
        base = times["float32 (attention_with_mass)"]
        out[str(L)] = {n: dict(median_us=1e6 * med(t), ratio_vs_float32=med([a / b for a, b in zip(t, base)]),
                               rounds_us=[1e6 * x for x in t]) for n, t in times.items()}
        print(f"attention L={L}: " + ", ".join(f"{n} {1e6 * med(t):.0f} us" for n, t in times.items()), flush=True)
    return out

# --- the model's decode step ----------------------------------------------------------------------------------------
def decode_rows(model):
    "(name, caches) of the decode comparison: the float caches, quantization alone, and SnapKV at 256 float vs KIVI."
    full = KVCacheConfig("full")
    rows = [("full (mlx-lm float32)", make_prompt_cache(model)), ("full (ours, float32)", keep_all_caches(model, full))]
    for label in ("full[kv_bits=4,kv_scheme=group]", "full[kv_bits=4]", "full[kv_bits=8]",
                  "full[kv_bits=4,kv_scheme=mlx]"):
        rows.append((label, KVCacheBuilder.for_model(model, KVCacheConfig.from_label(label))))
    for label in ("snapkv", "snapkv[kv_bits=4]"):
        rows.append((label + " @256", KVCacheBuilder.for_model(model, KVCacheConfig.from_label(label, 256))))
    return rows

def decode_speed(model, tok, context:int, rounds:int, steps:int)->dict:
    "Seconds per decode step (one token through the model), every cache holding the same tokens; interleaved rounds."
    ids = ppl_sequences(tok, 1, context, rounds * steps + 8, seed=3)[0]
    rows = decode_rows(model)
    shared_prefill(model, ids[:context], make_prompt_cache(model), [c for _, c in rows])
    arrays = lambda cs: [a for c in cs for a in cache_arrays(c)]
    def step(cs, i):
        t = time.perf_counter()
        mx.eval(model(mx.array([[ids[i]]]), cache=cs), arrays(cs))
        return time.perf_counter() - t
    for _, cs in rows:                                       # warm-up: SnapKV chooses at its first one-token pass
        for i in range(2): step(cs, context + i)
    times, pos = {n: [] for n, _ in rows}, context + 2
    for r in range(rounds):
        order = rows[r % len(rows):] + rows[:r % len(rows)]
        for n, cs in order: times[n].append(med([step(cs, pos + j) for j in range(steps)]))
        pos += steps
    held = {n: [getattr(c, "count", None) for c in cs] for n, cs in rows}
    base, mlx_base = times["full (ours, float32)"], times["full (mlx-lm float32)"]
    snap = times["snapkv @256"]
    res = {n: dict(median_s=med(t), ratio_vs_ours_float=med([a / b for a, b in zip(t, base)]),
                   ratio_vs_mlx_float=med([a / b for a, b in zip(t, mlx_base)]), rounds_s=t, tokens_held=held[n])
           for n, t in times.items()}
    res["snapkv[kv_bits=4] @256"]["ratio_vs_float_snapkv"] = \
        med([a / b for a, b in zip(times["snapkv[kv_bits=4] @256"], snap)])
    for n, d in res.items():
        print(f"decode {n:40s} {1e3 * d['median_s']:7.1f} ms/step  x{d['ratio_vs_ours_float']:.3f} vs our float32, "
              f"x{d['ratio_vs_mlx_float']:.3f} vs mlx-lm float32", flush=True)
    return dict(context=context, rounds=rounds, steps_per_round=steps, rows=res)

# --- kept tokens: quantized vs float --------------------------------------------------------------------------------
def agreement(model, tok, context:int, decode:int)->dict:
    "Share of kept positions a quantized layer has in common with the same method in float: at the prompt's end and "
    "after `decode` more tokens fed one at a time (every step evicts one)."
    ids = ppl_sequences(tok, 1, context, decode + 1, seed=5)[0]
    out, windows = {}, slot_windows(model)
    for method, budget in AGREE_ROWS:
        cfgs = [KVCacheConfig.for_method(method, budget, **kv) for kv in
                ({}, dict(kv_bits=8, kv_scheme="kivi"), dict(kv_bits=4, kv_scheme="kivi"),
                 dict(kv_bits=4, kv_scheme="group"), dict(kv_bits=2, kv_scheme="kivi"))]
        sets = Q.prefilled(model, ids[:context], cfgs)[1:]
        Q.compress_prompt(sets)                      # SnapKV chooses at the prompt's end; the others chose already
        share = lambda cs: [kept_agreement(a.positions[:, :, :a.count], b.positions[:, :, :b.count])
                            for a, b in zip(sets[0], cs)]
        at_end = [share(cs) for cs in sets[1:]]
        for i in range(decode):
            mx.eval(batched_forward(model, mx.array([[ids[context + i]]] * len(sets)), sets, windows),
                    [a for cs in sets for c in cs for a in cache_arrays(c)])
        after = [share(cs) for cs in sets[1:]]
        for cfg, e, d in zip(cfgs[1:], at_end, after):
            out[f"{cfg.label} @{budget}"] = dict(prompt_end=sum(e) / len(e), after_decode=sum(d) / len(d),
                                                 per_layer_after_decode=d)
            print(f"agreement {cfg.label} @{budget}: prompt end {sum(e) / len(e):.3f}, after {decode} tokens "
                  f"{sum(d) / len(d):.3f}", flush=True)
    return dict(context=context, decode_tokens=decode, rows=out)

# --- perplexity through the harness ---------------------------------------------------------------------------------
def perplexity(model, tok, texts:int, context:int, tokens:int, chunk:int)->dict:
    "The quality harness's perplexity task for quantization alone (every layer), mlx-lm's own rows, SnapKV + KIVI."
    cfgs = [KVCacheConfig.for_method(m, b, **kv) for m, b, kv in PPL_ROWS]
    bf16, kv_bytes = [], Q.kv_bytes                    # the harness counts bytes per row and text: count bf16 too
    def counting(caches):
        bf16.append(sum(kv_nbytes_bf16(c) or 0 for c in caches))
        return kv_bytes(caches)
    Q.kv_bytes = counting
    try: rows = Q.perplexity_rows(model, tok, cfgs, texts, context, tokens, chunk, seed=0, model_name="gemma-3-270m",
                                  log=lambda *a: print(*a, flush=True))
    finally: Q.kv_bytes = kv_bytes
    pairs = [bf16[i:i + 2] for i in range(0, len(bf16), 2)]           # (row, full) for every row of every text
    for j, r in enumerate(rows):
        mine = pairs[j::len(rows)]
        r["kv_fraction_bf16"] = sum(a for a, _ in mine) / sum(b for _, b in mine)
    full = rows[0]["ppl"]
    for r in rows:
        print(f"ppl {r['name']:40s} {r['budget'] or '-':>5} {r['ppl']:8.3f} {100 * (r['ppl_ratio'] - 1):+7.2f}% "
              f"kv {r['kv_fraction']:.3f} (bf16 {r['kv_fraction_bf16']:.3f})", flush=True)
    get = lambda name: next(r for r in rows if r["name"] == name)
    targets = {"8 bits within +0.5% (group, kivi)": [100 * (get(n)["ppl"] / full - 1) for n in
                                                     ("full[kv_bits=8,kv_scheme=group]", "full[kv_bits=8]")],
               "KIVI 4 bits within +3%": 100 * (get("full[kv_bits=4]")["ppl"] / full - 1)}
    return dict(texts=texts, context=context, scored_tokens=tokens, chunk=chunk, rows=rows, targets_pct=targets)

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks every part in a few minutes")
    ap.add_argument("--parts", default="attention,decode,agreement,perplexity", help="comma-separated parts to run")
    ap.add_argument("--out", default=None, help="JSON to update (default nbs/results/storage[_quick].json)")
    a = ap.parse_args(argv)
    s = QUICK if a.quick else FULL_RUN
    out = a.out or f"nbs/results/storage{'_quick' if a.quick else ''}.json"
    res = json.load(open(out)) if os.path.exists(out) else {}
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    model = tok = None
    if set(parts) - {"attention"}:
        from veloxquant_mlx.models import load_default_model
        model, tok = load_default_model()
    for p in parts:
        t = time.perf_counter()
        if p == "attention": r = attention_paths(s["lengths"], s["att_rounds"], s["att_reps"])
        elif p == "decode": r = decode_speed(model, tok, s["context"], s["decode_rounds"], s["decode_steps"])
        elif p == "agreement": r = agreement(model, tok, s["agree_context"], s["agree_decode"])
        elif p == "perplexity": r = perplexity(model, tok, s["ppl_texts"], s["ppl_context"], s["ppl_tokens"],
                                               s["ppl_chunk"])
        else: raise SystemExit(f"unknown part {p!r}")
        res[p] = dict(result=r, seconds=time.perf_counter() - t, machine=machine(), quick=a.quick,
                      model="gemma-3-270m (float32, CPU)" if model is not None else None)
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "w") as f: json.dump(res, f, indent=1)
        print(f"{p}: {time.perf_counter() - t:.0f} s, wrote {out}", flush=True)
    return res

if __name__ == "__main__": main()
