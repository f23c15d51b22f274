#!/usr/bin/env python
"""A/B of the decode step between two checkouts of this package, interleaved in one run (the machine's load hits both).

`python scripts/ab_decode.py BEFORE_DIR AFTER_DIR [--rounds 3] [--out nbs/results/decode_ab.json]`

Each round runs `scripts/bench_speed.py --parts decode` in BEFORE_DIR, then in AFTER_DIR (same settings); the JSON
holds every decode-step sample, the medians per model and method, and the after/before ratios."""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

def run_one(tree:str, out:str, models:list, steps:int, rounds:int):
    "One decode benchmark of the checkout at `tree`, written to `out`."
    cmd = [sys.executable, "scripts/bench_speed.py", "--parts", "decode", "--set", f"decode_models={json.dumps(models)}",
           "--set", f"decode_steps={steps}", "--set", f"decode_rounds={rounds}", "--out", out]
    subprocess.run(cmd, cwd=tree, env=dict(os.environ, PYTHONPATH=tree), check=True, capture_output=True)

def samples(path:str)->dict:
    "(model, method) -> every decode-step time in seconds."
    out = {}
    for model, m in json.load(open(path))["decode"].items():
        for kind, rs in m["samples_s"].items(): out.setdefault(f"{model} {kind}", []).extend(x for r in rs for x in r)
    return out

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before"); ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of before and after")
    ap.add_argument("--models", default="gemma3_270m,llama16")
    ap.add_argument("--out", default="nbs/results/decode_ab.json")
    a = ap.parse_args()
    got, t0 = {"before": {}, "after": {}}, time.time()
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            for side, tree in (("before", a.before), ("after", a.after)):
                f = os.path.join(d, f"{side}{r}.json")
                run_one(os.path.abspath(tree), f, a.models.split(","), 16, 3)
                for k, v in samples(f).items(): got[side].setdefault(k, []).extend(v)
                print(f"round {r + 1}: {side} done", file=sys.stderr)
    med = {s: {k: statistics.median(v) * 1e3 for k, v in got[s].items()} for s in got}
    ratio = {k: med["after"][k] / med["before"][k] for k in med["before"] if k in med["after"]}
    res = dict(before=a.before, after=a.after, rounds=a.rounds, seconds=round(time.time() - t0), median_ms=med,
               ratio=ratio, samples_per_cell=len(next(iter(got["before"].values()))), samples_s=got)
    json.dump(res, open(a.out, "w"), indent=1)
    for k in sorted(ratio): print(f"{k:40} {med['before'][k]:8.2f} {med['after'][k]:8.2f} ms  x{ratio[k]:.3f}")

if __name__ == "__main__": main()
