"""Every task kind through every row at a share of the full cache's bytes: `python scripts/bench_tasks.py [--quick] [--model smollm2]`."""
import veloxquant_mlx  # first: it loads OpenBLAS (Linux) before MLX
import argparse, json, time
from pathlib import Path
from veloxquant_mlx.builder import KVCacheConfig, recommended_config
from veloxquant_mlx.eval.tasks import every_task, config_row, KEY_TASKS, TEXT_KINDS
from veloxquant_mlx.models import load_embedded_model, embedded_name

OLD_DEFAULT = dict(chunk=16, slack=8, window_budget=32, window_method="streamingllm")
QUESTION_AGNOSTIC = {"qa-keynorm": "keynorm", "qa-meanattn": "mean-attention"}  # row name -> global method

def rows_at(shares):
    "The rows of the study: the default, the old default and two even-share methods at each share; quantization alone."
    rows = {}
    for f in shares:
        rows[f"default@{f}"] = recommended_config(f)
        rows[f"old-default@{f}"] = KVCacheConfig.for_method("chunkkv", kv_fraction=f, **OLD_DEFAULT)
        rows[f"prev-default@{f}"] = recommended_config(f, slack=0)
        rows[f"bytes-plan@{f}"] = recommended_config(f, slack=0)      # the default before time was priced
        rows[f"bytes-plan-q@{f}"] = recommended_config(f)            # the default where no time prices exist (a GPU)
        rows[f"slack63@{f}"] = recommended_config(f, slack=63)       # the default with a choice per KIVI group
        rows[f"slack15@{f}"] = recommended_config(f, slack=15)       # the default with a choice per 16 steps
        rows[f"rot@{f}"] = recommended_config(f)                     # the default with its values rotated (a lever)
        rows[f"dw8@{f}"] = recommended_config(f, decode_window=8)    # decoding choices measure the 8 newest queries
        rows[f"rewindow@{f}"] = recommended_config(f, decode_window=None)   # every decoding choice: the whole window
        rows[f"obs128@{f}"] = recommended_config(f, obs_window=128)  # the prompt's last 128 queries choose (a lever)
        if f < 0.2: rows[f"w128@{f}"] = recommended_config(f, slack=0)   # past the ladder: windows of 128, not 256
        if 0.15 < f < 0.22: rows[f"whole-windows@{f}"] = recommended_config(f, slack=0)   # whole windows, fewer global tokens
        for name, method in QUESTION_AGNOSTIC.items():     # the default with a question-agnostic global policy
            rows[f"{name}@{f}"] = recommended_config(f, method=method, chunk=16)
        rows[f"qa-recency@{f}"] = recommended_config(f, method="streamingllm")   # the global layers keep the newest
    rows[f"keep-all@{shares[0]}"] = recommended_config(shares[0], slack=0)
    rows[f"chunkkv@{shares[0]}"] = KVCacheConfig.for_method("chunkkv", kv_fraction=shares[0], chunk=16)
    rows[f"chunkkv+squeeze@{shares[0]}"] = KVCacheConfig.for_method("chunkkv", kv_fraction=shares[0], chunk=16,
                                                                    schedule="squeeze")
    rows[f"snapkv@{shares[0]}"] = KVCacheConfig.for_method("snapkv", kv_fraction=shares[0])
    for name, method in QUESTION_AGNOSTIC.items():           # even-share eviction alone, beside `chunkkv@F`
        rows[f"{name[3:]}@{shares[0]}"] = KVCacheConfig.for_method(method, kv_fraction=shares[0], chunk=16)
    rows["kivi4"] = KVCacheConfig("full", kv_bits=4)
    return rows

def bound_rows(shares, windows, context):
    "The default beside every token at 3 or 2 bits, and every global token at 3 bits with 256-token windows."
    rows = {f"default@{f}": recommended_config(f) for f in shares}
    return rows | {"kivi3": KVCacheConfig("full", kv_bits=3), "kivi2": KVCacheConfig("full", kv_bits=2),
                   "all-global-w256": recommended_config(all_global_share(windows, context), slack=0)}

def all_global_share(windows, n_tokens, bits=3):
    "The share of bytes holding every global token and 256 per window at `bits` (`n_tokens` in whole groups of 64)."
    from veloxquant_mlx.coordinator import full_slots
    from veloxquant_mlx.planner import plan_bytes
    held = [n_tokens if w is None else min(w, 256) for w in windows]
    return plan_bytes([bits] * len(windows), held) / sum(full_slots(n_tokens, windows)) + 1e-9

def builders(configs):
    "Rows as functions `model -> caches`; `keep-all@F` and `prev-default@F` are the default with its planner changed."
    from dataclasses import replace
    from veloxquant_mlx.builder import KVCacheBuilder, coordinator_of
    from veloxquant_mlx.planner import LADDER
    bytes_only = dict(costs=None, quality=None)     # the rows below were measured before time and quality priced widths
    planners = {"keep-all": dict(max_evict=0.0, **bytes_only),                  # no eviction allowance
                "prev-default": dict(ladder=LADDER + ((3, 2),), window_trim=0, **bytes_only),   # the previous planner
                "w128": dict(window_budget=128, **bytes_only),                    # smaller windows, more global tokens
                "whole-windows": dict(window_budget=512, **bytes_only),            # the planner before the window fill
                "all-global-w256": dict(ladder=((3, 3),), max_evict=0.0, window_budget=256, **bytes_only),  # bound_rows
                "bytes-plan": dict(costs=None, quality=None),                     # widths priced in bytes alone
                "bytes-plan-q": dict(costs=None)}                                 # bytes and the rung table
    def planned(cfg, attrs):
        def build(model):
            caches = KVCacheBuilder.for_model(model, cfg)
            co = coordinator_of(caches)
            co.costs, co.quality = attrs.get("costs", co.costs), attrs.get("quality", co.quality)
            co.settings = replace(co.settings, **{k: v for k, v in attrs.items() if k not in ("costs", "quality")})
            return caches
        return build
    def rotated(cfg):
        def build(model):
            caches = KVCacheBuilder.for_model(model, cfg)
            for c in caches:
                if hasattr(c.store, "rotate"): c.store.rotate = True   # KIVI layers: values through a Hadamard transform
            return caches
        return build
    return {k: rotated(c) if k.startswith("rot@") else planned(c, planners[k.split("@")[0]])
            if k.split("@")[0] in planners else config_row(c) for k, c in configs.items()}

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one prompt per family, one text per kind, 1,024 tokens")
    ap.add_argument("--model", default="gemma3", help="an embedded model: gemma3 (Gemma 3 270M) or smollm2")
    ap.add_argument("--shares", default="0.25,0.125")
    ap.add_argument("--out", default="nbs/results/every_task.json")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per key family")
    ap.add_argument("--texts", type=int, default=2, help="texts per continuation kind")
    ap.add_argument("--tokens", type=int, default=2048, help="key prompts' length")
    ap.add_argument("--context", type=int, default=1536, help="continuation: tokens read before the scored 256")
    ap.add_argument("--tasks", default=",".join(KEY_TASKS), help="key tasks to run")
    ap.add_argument("--kinds", default=",".join(TEXT_KINDS), help="continuation kinds to run")
    ap.add_argument("--bounds", action="store_true", help="the bound rows (continuation only) instead of the study's")
    ap.add_argument("--rungs", action="store_true", help="every token at each rung of the ladder (continuation only)")
    ap.add_argument("--score-chunk", type=int, default=16,
                    help="continuation tokens scored per pass (1: a token a step, through the decoding choices)")
    ap.add_argument("--rows", default="", help="only rows whose name starts with one of these (comma-separated)")
    a = ap.parse_args()
    shares = [float(s) for s in a.shares.split(",")]
    model, tok = load_embedded_model(a.model, progress=False)
    if a.bounds or a.rungs: a.tasks = ""                                 # the bound rows are sized for the continuation's prompt
    kw = dict(n_prompts=1, n_texts=1, n_tokens=1024, context=768) if a.quick else \
        dict(n_prompts=a.prompts, n_texts=a.texts, n_tokens=a.tokens, context=a.context)
    from veloxquant_mlx.eval.batching import slot_windows
    rows = bound_rows(shares, slot_windows(model), kw["context"]) if a.bounds else {} if a.rungs else rows_at(shares)
    configs = {k: c for k, c in rows.items() if not a.rows or k.startswith(tuple(a.rows.split(",")))}
    kw |= dict(chunk=a.score_chunk, tasks={t: KEY_TASKS[t] for t in a.tasks.split(",") if t},
               kinds=tuple(k for k in a.kinds.split(",") if k))
    t0 = time.perf_counter()
    names = {"gemma-3-270m": "Gemma 3 270M", "smollm2-135m": "SmolLM2-135M-Instruct"}
    windows = slot_windows(model)                        # the layers' windows: which default the model gets
    def settings(): return dict(model=f"{names[embedded_name(a.model)]} (float32, greedy)", shares=shares, quick=a.quick,
                           windows=windows, rows=labels, seconds=round(time.perf_counter() - t0),
                           **{k: v for k, v in kw.items() if k not in ("tasks", "kinds")}, tasks=list(kw["tasks"]),
                           kinds=list(kw["kinds"]))
    save = lambda out: Path(a.out).write_text(json.dumps(dict(out, settings=settings()), indent=1))
    built, labels = builders(configs), {k: c.on(model).label for k, c in configs.items()}   # as built (its slack)
    if a.rungs:                                      # the planner's rung table: every prompt token at each rung
        from veloxquant_mlx.eval.tasks import rung_rows
        from veloxquant_mlx.planner import LADDER
        built = rung_rows(LADDER + ((2, 2),))
        labels = {k: f"every prompt token at {k[4:]} (windowed-global) bits" for k in built}
    save(every_task(model, tok, built, on_result=save, **kw))
    print("wrote", a.out)

if __name__ == "__main__": main()
