#!/usr/bin/env python
"""The per-token attention price of every storage width on this device (see nbs/03c_costs.ipynb).

`python scripts/bench_costs.py [--quick] [--reps N] [--out nbs/results/step_costs.json]`

Writes `measure_costs()`'s result; the table `veloxquant_mlx.costs.STEP_COSTS` carries its rounded prices."""
import argparse, json, time
from veloxquant_mlx.blas import preload_openblas
preload_openblas()  # before anything imports mlx.core
from veloxquant_mlx.costs import measure_costs

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter lengths and fewer runs (a smoke run)")
    ap.add_argument("--out", default="nbs/results/step_costs.json")
    ap.add_argument("--reps", type=int, default=15, help="timed runs per point (the median is kept)")
    a = ap.parse_args()
    t0 = time.time()
    res = measure_costs(lengths=(256, 512, 1024), reps=3) if a.quick else measure_costs(reps=a.reps)
    res["seconds"], res["quick"], res["reps"] = round(time.time() - t0), a.quick, a.reps
    json.dump(res, open(a.out, "w"), indent=1)
    print(json.dumps(res["by_head_dim"]))

if __name__ == "__main__": main()
