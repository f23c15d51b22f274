#!/usr/bin/env python
"""Greedy tokens of every method, to compare two checkouts (a refactor must not change one token).

`python scripts/greedy_snapshot.py OUT.json` writes, for the real model's main command (the README's 2,000-token pass-key
prompt, 16 tokens) under every registered method (default budget, and `kv_fraction=0.25`), the default at several
shares, quantized and scheduled variants, and for the tiny Llama, Qwen 3 and Gemma 3 models under every method (budget
24; chunked prefill, `prompt_end`, protected recent tokens): the generated text or tokens and the tokens each layer
kept. Run it in both checkouts (`PYTHONPATH=<checkout>`) and compare the two files."""
import veloxquant_mlx  # first: OpenBLAS before MLX
import json, sys
import mlx.core as mx
from veloxquant_mlx.cli import (load_cli_model, passkey_prompt, encode_prompt, method_config, RunOptions, run_method,
                                METHODS)
from veloxquant_mlx.builder import KVCacheBuilder, KVCacheConfig, tiny_model, greedy

def real_runs()->dict:
    "The real model's main command under every configuration."
    confs = [("auto", dict(kv_fraction=0.125)), ("auto", dict(kv_fraction=0.25)), ("auto", {})]
    confs += [(m, {}) for m in METHODS] + [(m, dict(kv_fraction=0.25)) for m in METHODS if m not in ("full", "mlx-rotating")]
    confs += [("full", dict(kv_bits=4)), ("h2o", dict(kv_bits=4)), ("snapkv", dict(kv_bits=4, kv_scheme="group")),
              ("chunkkv", dict(schedule="squeeze", kv_fraction=0.25)), ("tova", dict(schedule="pyramid"))]
    model, tok = load_cli_model(None)
    ids = encode_prompt(tok, passkey_prompt(2000, 52817, 0.5, tok), model)
    out = {}
    for m, kw in confs:
        r = run_method(model, tok, ids, RunOptions(method_config(m, **kw), max_tokens=16))
        out[f"real {m} {kw}"] = dict(text=r["text"], kept=[l.get("tokens_kept") for l in r["layers"]])
    return out

def tiny_runs()->dict:
    "Every method on the tiny models: greedy tokens after a 96-token prompt read in chunks of 32."
    out = {}
    for arch in ("llama", "qwen3", "gemma3"):
        tm, p = tiny_model(arch), mx.random.randint(0, 200, (1, 96), key=mx.random.key(1))
        for m in METHODS:
            for kw in ({}, dict(compress="prompt_end"), dict(n_recent=2)):
                if m == "full" and kw: continue
                key = f"tiny {arch} {m} {kw}"
                try: caches = KVCacheBuilder.for_model(tm, KVCacheConfig.for_method(m, None if m == "full" else 24, 2, **kw))
                except ValueError as e: out[key] = f"refused: {e}"; continue
                out[key] = greedy(tm, p, caches, 12, chunk=32)[0].reshape(-1).tolist()
    return out

if __name__ == "__main__":
    json.dump({**real_runs(), **tiny_runs()}, open(sys.argv[1], "w"), indent=0)
